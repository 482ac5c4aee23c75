//! The connection deadlines `serve` and `group` share.

use crate::tcp::FrameTimeout;
use std::time::Duration;

/// How long a connection may take to shake hands and to deliver one frame.
#[derive(Clone, Debug, clap::Args)]
pub struct Deadlines {
    /// Absolute deadline of a connection's handshake, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 5000, value_parser = clap::value_parser!(u64).range(1..))]
    pub handshake_timeout: u64,
    /// Deadline of one frame from its first byte, in milliseconds (plus 1 s per MiB).
    #[arg(long, value_name = "MS", default_value_t = 10000, value_parser = clap::value_parser!(u64).range(1..))]
    pub frame_timeout: u64,
}

impl Deadlines {
    /// The handshake's deadline.
    pub fn handshake(&self) -> Duration {
        Duration::from_millis(self.handshake_timeout)
    }

    /// A frame's deadline: the base given, plus the default allowance per byte.
    pub fn frame(&self) -> FrameTimeout {
        FrameTimeout { base: Duration::from_millis(self.frame_timeout), ..FrameTimeout::default() }
    }
}
