//! Where the protocol's model comes from, as a state machine: known from the start (given,
//! or a checkpoint's), or awaited from worker 0 (`serve --init-from-worker`, see
//! [`initial`](crate::tcp::initial)).
//!
//! While the model is awaited the server is a placeholder that nothing may be fed to:
//! [`Protocol::live`] gives no server, the protocol has no timeout, the other workers' core
//! messages are held ([`Protocol::hold`], at most [`HELD_PER_WORKER`] per worker) and the
//! run's clock does not start. Worker 0's valid parameters build the real server
//! ([`Protocol::receive`]) and the held messages are replayed to it in arrival order.

use super::events::RawFrame;
use std::collections::VecDeque;
use syncopate::{Instant, Server};

/// Builds the protocol's server on the initial parameters from worker 0.
pub(super) type BuildServer<S> = Box<dyn FnMut(Vec<f32>) -> Result<S, String>>;

/// The most messages held per worker while the initial model is unknown; an older one is
/// dropped for a newer (they are `Join`s, which a waiting worker repeats).
pub(super) const HELD_PER_WORKER: usize = 4;

/// The protocol's server, and whether its model is known yet.
pub(super) struct Protocol<S> {
    server: S,
    origin: Origin<S>,
}

enum Origin<S> {
    /// The model is known: the server runs.
    Known,
    /// Worker 0's parameters are awaited: how to build the server of them, and each
    /// worker's held frames in arrival order.
    Awaiting { build: BuildServer<S>, held: Vec<VecDeque<RawFrame>> },
}

/// What [`Protocol::hold`] did with a frame.
pub(super) enum Hold {
    /// The model is known: handle the frame now.
    Pass(RawFrame),
    /// The frame is held; the oldest held frame of its worker was dropped to make room, if
    /// given.
    Held(Option<RawFrame>),
}

/// What [`Protocol::receive`] did with worker 0's parameters.
pub(super) enum Received {
    /// The model was already known (worker 0 sends its parameters every session).
    Ignored,
    /// The server is built: the held frames, in arrival order, are to be handled now.
    Built(Vec<RawFrame>),
    /// The parameters were refused, for this reason; the model is still awaited.
    Refused(String),
}

impl<S: Server<f32>> Protocol<S> {
    /// A server whose model is known.
    pub(super) fn known(server: S) -> Self {
        Self { server, origin: Origin::Known }
    }

    /// A `placeholder` server of `n` workers waiting for worker 0's parameters, which `build`
    /// makes the real server of.
    pub(super) fn awaiting(placeholder: S, build: BuildServer<S>, n: usize) -> Self {
        Self {
            server: placeholder,
            origin: Origin::Awaiting { build, held: (0..n).map(|_| VecDeque::new()).collect() },
        }
    }

    /// Whether the model is known.
    pub(super) fn is_known(&self) -> bool {
        matches!(self.origin, Origin::Known)
    }

    /// The server (a placeholder while the model is awaited), to read.
    pub(super) fn server(&self) -> &S {
        &self.server
    }

    /// The server to drain and to stop (a placeholder has nothing to say but `Stop`).
    pub(super) fn server_mut(&mut self) -> &mut S {
        &mut self.server
    }

    /// The server to feed: `None` while the model is awaited.
    pub(super) fn live(&mut self) -> Option<&mut S> {
        self.is_known().then_some(&mut self.server)
    }

    /// The protocol's next timeout: none while the model is awaited.
    pub(super) fn poll_timeout(&self) -> Option<Instant> {
        self.server.poll_timeout().filter(|_| self.is_known())
    }

    /// Holds a core message of a worker's current session while the model is awaited.
    pub(super) fn hold(&mut self, frame: RawFrame) -> Hold {
        let Origin::Awaiting { held, .. } = &mut self.origin else {
            return Hold::Pass(frame);
        };
        let Some(queue) = held.get_mut(frame.worker.index()) else {
            return Hold::Held(Some(frame));
        };
        queue.push_back(frame);
        Hold::Held(if queue.len() > HELD_PER_WORKER { queue.pop_front() } else { None })
    }

    /// Takes worker 0's parameters (or why they did not decode): the real server if the
    /// model is awaited and they build one.
    pub(super) fn receive(&mut self, params: Result<Vec<f32>, String>) -> Received {
        let Origin::Awaiting { build, .. } = &mut self.origin else {
            return Received::Ignored;
        };
        match params.and_then(build) {
            Ok(server) => {
                self.server = server;
                let Origin::Awaiting { held, .. } = core::mem::replace(&mut self.origin, Origin::Known) else {
                    return Received::Built(Vec::new());
                };
                let mut frames: Vec<RawFrame> = held.into_iter().flatten().collect();
                frames.sort_by_key(|f| f.conn);
                Received::Built(frames)
            }
            Err(e) => Received::Refused(e),
        }
    }
}
