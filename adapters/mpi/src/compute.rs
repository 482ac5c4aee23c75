//! A worker rank's computations, on a thread of their own: the rank's main thread keeps
//! driving MPI (heartbeats, sends in flight, the server's messages) while the host's
//! `compute` runs, so a step longer than the server's loss timeout does not make a healthy
//! rank look silent.
//!
//! The compute thread makes no MPI call, so MPI's `MPI_THREAD_FUNNELED` is enough. Under a
//! lower thread level (an MPI library initialised with `MPI_THREAD_SINGLE`) the computation
//! runs inline on the main thread, as a single-threaded process must.
//!
//! One computation runs at a time. The main thread hands it the model as a shared buffer
//! (the state machine's own buffer, copy-on-write, so a newer model arriving meanwhile does
//! not change what the thread reads) and a gradient buffer of its own; it gets the gradient
//! buffer back with the result. A computation asked for while another runs waits in a
//! one-place slot: a later request replaces it (the state machine abandoned the earlier
//! one), and it starts when the running one returns. A result whose computation was
//! abandoned meanwhile comes back all the same; the main thread drops it.

use crate::{MpiError, Shared};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::thread::Scope;
use std::time::Duration;
use syncopate::ComputeId;

/// The host's gradient computation: writes a gradient of `params` into `grad` and returns
/// what else the step produced ([`Computed`]).
pub type ComputeFn<'f> = dyn FnMut(&[f32], &mut [f32]) -> Computed + Send + 'f;

/// What one computation returns besides its gradient.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Computed {
    /// The extra time the step should take (the straggler model; zero for none).
    pub extra: Duration,
    /// The minibatch loss of the gradient, if the host reports one: it travels to the
    /// server with the gradient. A NaN or infinite loss is refused with the gradient.
    pub loss: Option<f32>,
}

impl From<Duration> for Computed {
    fn from(extra: Duration) -> Self {
        Self { extra, loss: None }
    }
}

/// Which computation: the session (epoch) of the state machine that asked and its token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Token {
    pub(crate) epoch: u32,
    pub(crate) id: ComputeId,
}

/// A computation to run.
pub(crate) struct Input {
    pub(crate) token: Token,
    pub(crate) params: Arc<Vec<f32>>,
    /// Written whole by the computation; nobody else holds it.
    pub(crate) grad: Shared,
}

/// A computation's result.
pub(crate) struct Output {
    pub(crate) token: Token,
    pub(crate) grad: Shared,
    /// The straggler delay the host asked for on top of the computation, and the loss.
    pub(crate) computed: Computed,
}

/// What a compute thread sends back: a result, or the message of a panic in `compute`.
type Reply = Result<Output, String>;

enum Mode<'s, 'f> {
    Thread { jobs: Option<Sender<Input>>, replies: Receiver<Reply> },
    Inline { compute: &'s mut ComputeFn<'f>, done: Option<Reply> },
}

/// The computations of one worker rank (see the [module docs](self)).
pub(crate) struct Computer<'s, 'f> {
    mode: Mode<'s, 'f>,
    /// Set by the compute thread when a result is waiting.
    ready: Arc<AtomicBool>,
    busy: bool,
    next: Option<Input>,
}

fn run(compute: &mut ComputeFn<'_>, input: Input) -> Reply {
    let Input { token, params, mut grad } = input;
    let computed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| compute(&params, grad.as_mut())));
    drop(params);
    match computed {
        Ok(computed) => Ok(Output { token, grad, computed }),
        Err(panic) => Err(panic
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic".to_owned())),
    }
}

impl<'s, 'f: 's> Computer<'s, 'f> {
    /// Computations on a thread of `scope`.
    pub(crate) fn threaded<'env>(scope: &'s Scope<'s, 'env>, compute: &'s mut ComputeFn<'f>) -> Self {
        let (jobs, inbox) = channel::<Input>();
        let (outbox, replies) = channel::<Reply>();
        let ready = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&ready);
        scope.spawn(move || {
            for input in inbox {
                let reply = run(compute, input);
                let failed = reply.is_err();
                if outbox.send(reply).is_err() {
                    break;
                }
                flag.store(true, Ordering::Release);
                if failed {
                    break;
                }
            }
        });
        Self { mode: Mode::Thread { jobs: Some(jobs), replies }, ready, busy: false, next: None }
    }

    /// Computations run inline, when asked for.
    pub(crate) fn inline(compute: &'s mut ComputeFn<'f>) -> Self {
        Self {
            mode: Mode::Inline { compute, done: None },
            ready: Arc::new(AtomicBool::new(false)),
            busy: false,
            next: None,
        }
    }

    /// Set while a result waits for [`Computer::poll`].
    pub(crate) fn wake(&self) -> &AtomicBool {
        &self.ready
    }

    /// Starts `input`, or, while a computation runs, keeps it to start next; returns the
    /// input it replaced (never started), if any.
    pub(crate) fn start(&mut self, input: Input) -> Option<Input> {
        if self.busy {
            return self.next.replace(input);
        }
        self.dispatch(input);
        None
    }

    fn dispatch(&mut self, input: Input) {
        match &mut self.mode {
            Mode::Thread { jobs, .. } => {
                if let Some(jobs) = jobs {
                    // A send fails only if the thread ended after a panic, which the
                    // reply already reports.
                    let _ = jobs.send(input);
                }
                self.busy = true;
            }
            Mode::Inline { compute, done } => {
                *done = Some(run(compute, input));
                self.ready.store(true, Ordering::Release);
            }
        }
    }

    /// Drops the waiting input of `token`, if any (its computation was abandoned before it
    /// started); returns it.
    pub(crate) fn forget(&mut self, token: Token) -> Option<Input> {
        self.next.take_if(|n| n.token == token)
    }

    /// Drops the waiting input, if any; returns it.
    pub(crate) fn forget_all(&mut self) -> Option<Input> {
        self.next.take()
    }

    /// A finished computation, if one is waiting; starts the waiting input then. An error if
    /// the host's `compute` panicked. One computation runs at a time and the thread sets
    /// the flag after each reply, so one flag is one reply.
    pub(crate) fn poll(&mut self) -> Result<Option<Output>, MpiError> {
        if !self.ready.swap(false, Ordering::AcqRel) {
            return Ok(None);
        }
        let reply = match &mut self.mode {
            Mode::Thread { replies, .. } => replies.try_recv().ok(),
            Mode::Inline { done, .. } => done.take(),
        };
        let Some(reply) = reply else { return Ok(None) };
        let output = reply.map_err(|e| MpiError(format!("the compute callback panicked: {e}")))?;
        self.busy = false;
        if let Some(next) = self.next.take() {
            self.dispatch(next);
        }
        Ok(Some(output))
    }

    /// Ends the compute thread once it has finished what it runs (the scope then joins it).
    pub(crate) fn close(&mut self) {
        self.next = None;
        if let Mode::Thread { jobs, .. } = &mut self.mode {
            *jobs = None;
        }
    }
}
