//! Reaching a server: resolving and connecting (a connect timeout per address), the socket
//! and frame halves of a new session, and the one retry loop every client of the transport
//! uses (the worker, each shard of a sharded worker, a group server toward its central
//! server): jittered exponential backoff, given up only on a server unreachable for
//! [`Backoff::give_up_after`] in a row.

use crate::tcp::frame::{FrameError, FrameReader, FrameTimeout, FrameWriter};
use crate::tcp::handshake::{HandshakeError, RefuseCode};
use core::net::SocketAddr;
use core::time::Duration;
use std::io::BufWriter;
use std::net::{TcpStream, ToSocketAddrs};
use std::thread;
use std::time::Instant as StdInstant;

/// Reconnection timing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    /// The first wait.
    pub initial: Duration,
    /// The longest wait (the wait doubles up to this).
    pub max: Duration,
    /// Give up after the server has been unreachable this long in a row (a server that
    /// answers, even with "busy", is retried for as long as it runs).
    pub give_up_after: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self { initial: Duration::from_millis(50), max: Duration::from_secs(1), give_up_after: Duration::from_secs(30) }
    }
}

impl Backoff {
    /// The wait before retry number `attempt` (0-based): `initial · 2^attempt`, at most
    /// `max`, drawn uniformly from its upper half with `unit` in `[0, 1)`.
    pub fn wait(&self, attempt: u32, unit: f64) -> Duration {
        let full = self.initial.saturating_mul(1u32.checked_shl(attempt.min(20)).unwrap_or(u32::MAX)).min(self.max);
        full.mul_f64(0.5 + 0.5 * unit.clamp(0.0, 1.0))
    }
}

/// Why a session could not start.
pub(crate) enum ConnectError {
    /// No connection: nobody listens, or the network does not get there.
    Unreachable(String),
    /// Connected, but the handshake failed or was refused.
    Handshake(HandshakeError),
    /// The job refused the run's settings.
    Job(String),
    /// The caller's kill switch was set.
    Killed,
}

impl ConnectError {
    /// A socket failure after connecting: the server answered, so it is worth retrying.
    pub(crate) fn io(e: std::io::Error) -> Self {
        Self::Handshake(HandshakeError::Frame(FrameError::Io(e)))
    }
}

/// A refusal of our own that retrying cannot fix.
pub(crate) fn refusal(message: String) -> HandshakeError {
    HandshakeError::Refusing { code: RefuseCode::Malformed, message, worker: None }
}

/// Connects to the first address `addr` resolves to that answers within `timeout`.
pub(crate) fn connect(addr: &str, timeout: Duration) -> Result<TcpStream, ConnectError> {
    let addrs: Vec<SocketAddr> = addr
        .to_socket_addrs()
        .map_err(|e| ConnectError::Handshake(refusal(format!("invalid server address '{addr}': {e}"))))?
        .collect();
    let mut last = format!("'{addr}' resolves to nothing");
    for a in addrs {
        match TcpStream::connect_timeout(&a, timeout) {
            Ok(s) => return Ok(s),
            Err(e) => last = format!("connect to {a}: {e}"),
        }
    }
    Err(ConnectError::Unreachable(last))
}

/// A connected socket with its frame reader and writer, before the handshake.
pub(crate) struct Opened {
    /// The socket (for shutdown and buffer sizes).
    pub stream: TcpStream,
    /// Its reading half.
    pub reader: FrameReader,
    /// Its writing half, buffered.
    pub writer: FrameWriter<BufWriter<TcpStream>>,
}

/// Connects to `addr` ([`connect`]) and sets the socket up for a session: no Nagle delay,
/// writes bounded by `write_timeout`, frames by `frame_timeout`.
pub(crate) fn open(
    addr: &str,
    connect_timeout: Duration,
    write_timeout: Duration,
    frame_timeout: FrameTimeout,
) -> Result<Opened, ConnectError> {
    let stream = connect(addr, connect_timeout)?;
    // Connected: from here on, failures are the server's answer (the server runs).
    stream.set_nodelay(true).map_err(ConnectError::io)?;
    stream.set_write_timeout(Some(write_timeout)).map_err(ConnectError::io)?;
    let reader = FrameReader::new(stream.try_clone().map_err(ConnectError::io)?, 0, frame_timeout);
    let writer = FrameWriter::new(BufWriter::with_capacity(1 << 16, stream.try_clone().map_err(ConnectError::io)?), 0);
    Ok(Opened { stream, reader, writer })
}

/// Bits that differ between processes, so restarted workers do not share a jitter stream.
pub(crate) fn jitter_seed() -> u64 {
    crate::tcp::auth::nonce().map_or(u64::from(std::process::id()), |n| {
        u64::from_le_bytes(n.get(..8).and_then(|b| b.try_into().ok()).unwrap_or_default())
    })
}

/// The retry state toward one server: the failed attempts in a row and since when the server
/// has been unreachable. Waits double from [`Backoff::initial`] to [`Backoff::max`], each
/// drawn uniformly from its upper half (jitter, so restarted clients do not retry in
/// lockstep); every retry is logged with its reason and wait (after ten in a row, every
/// tenth).
pub(crate) struct Retry {
    backoff: Backoff,
    jitter: syncopate::rng::Rng,
    attempt: u32,
    unreachable_since: Option<StdInstant>,
}

impl Retry {
    /// A fresh state; `seed` picks the jitter stream.
    pub(crate) fn new(backoff: Backoff, seed: u64) -> Self {
        Self { backoff, jitter: syncopate::rng::Rng::derive(seed, jitter_seed()), attempt: 0, unreachable_since: None }
    }

    /// A session ran: the next failure waits from the start again.
    pub(crate) fn reset(&mut self) {
        self.attempt = 0;
        self.unreachable_since = None;
    }

    /// Judges a failed attempt: `Ok` with the failure to retry after a wait, `Err` with it
    /// when retrying cannot help (a refusal that is not transient, the job's refusal, a
    /// kill, or a server unreachable for [`Backoff::give_up_after`] in a row).
    pub(crate) fn judge(&mut self, e: ConnectError) -> Result<ConnectError, ConnectError> {
        match e {
            ConnectError::Unreachable(_) => {
                let since = *self.unreachable_since.get_or_insert_with(StdInstant::now);
                if since.elapsed() >= self.backoff.give_up_after { Err(e) } else { Ok(e) }
            }
            ConnectError::Handshake(h) if h.is_transient() => {
                self.unreachable_since = None;
                Ok(ConnectError::Handshake(h))
            }
            e => Err(e),
        }
    }

    /// How long an unreachable server is retried, in seconds (for the error that gives up).
    pub(crate) fn give_up_after_s(&self) -> f64 {
        self.backoff.give_up_after.as_secs_f64()
    }

    /// Logs `who: why; retrying in ...` and waits the next backoff.
    pub(crate) fn pause(&mut self, who: &str, why: &str, log: &mut dyn FnMut(&str)) {
        let wait = self.backoff.wait(self.attempt, self.jitter.next_f64());
        if self.attempt < 10 || self.attempt % 10 == 0 {
            log(&format!("{who}: {why}; retrying in {:.2} s (attempt {})", wait.as_secs_f64(), self.attempt + 1));
        }
        self.attempt = self.attempt.saturating_add(1);
        thread::sleep(wait);
    }

    /// Runs `attempt` (which may log too) until it succeeds or [`Self::judge`] gives up; each
    /// failure is described by `why` for the log line of its retry.
    pub(crate) fn until_connected<T>(
        &mut self,
        who: &str,
        log: &mut dyn FnMut(&str),
        mut attempt: impl FnMut(&mut dyn FnMut(&str)) -> Result<T, ConnectError>,
        why: impl Fn(&ConnectError) -> String,
    ) -> Result<T, ConnectError> {
        loop {
            match attempt(log) {
                Ok(t) => return Ok(t),
                Err(e) => {
                    let e = self.judge(e)?;
                    self.pause(who, &why(&e), log);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_its_cap_with_jitter_in_the_upper_half() {
        let b = Backoff { initial: Duration::from_millis(50), max: Duration::from_secs(1), ..Backoff::default() };
        assert_eq!(b.wait(0, 0.999_999).as_millis(), 49);
        assert_eq!(b.wait(0, 0.0), Duration::from_millis(25));
        assert_eq!(b.wait(3, 0.0), Duration::from_millis(200));
        assert_eq!(b.wait(10, 0.0), Duration::from_millis(500));
        assert_eq!(b.wait(u32::MAX, 1.0), Duration::from_secs(1));
    }

    #[test]
    fn only_an_unreachable_server_is_given_up_on_and_only_after_give_up_after() {
        let backoff = Backoff { give_up_after: Duration::from_millis(30), ..Backoff::default() };
        let mut retry = Retry::new(backoff, 1);
        let busy =
            || ConnectError::Handshake(HandshakeError::Refused { code: RefuseCode::Busy, message: "busy".into() });
        assert!(retry.judge(ConnectError::Unreachable("no".into())).is_ok());
        thread::sleep(Duration::from_millis(40));
        assert!(retry.judge(busy()).is_ok(), "a server that answers is retried");
        assert!(retry.judge(ConnectError::Unreachable("no".into())).is_ok(), "the answer restarted the count");
        thread::sleep(Duration::from_millis(40));
        assert!(retry.judge(ConnectError::Unreachable("no".into())).is_err());
        assert!(retry.judge(ConnectError::Job("no".into())).is_err());
        assert!(retry.judge(ConnectError::Handshake(refusal("bad".into()))).is_err());
    }
}
