//! The TCP worker: connect, handshake (learning the run's settings from the server),
//! drive the protocol's worker state machine with gradients from the caller, and reconnect
//! with jittered exponential backoff when the connection is lost. Every session starts a
//! fresh state machine with the epoch the server assigned, so a reconnecting worker rejoins
//! at the server's current model. A `Stop` from the server ends the run; a refusal the
//! worker cannot fix by retrying (wrong secret, wrong version, other settings) ends it with
//! an error.
//!
//! **Retrying.** A worker keeps trying for as long as the server answers: a busy server, a
//! connection cut before the handshake ends (an eviction under attack, a deadline) or a lost
//! session never make it give up. Only an unreachable server (connection refused, no route,
//! connect timeout) for [`Backoff::give_up_after`] in a row does. Waits double from
//! [`Backoff::initial`] to [`Backoff::max`], each drawn uniformly from its upper half
//! (jitter, so restarted workers do not retry in lockstep), and every retry is logged with
//! its reason and wait (after ten in a row, every tenth).

mod connect;
mod drive;
mod job;
mod session;
pub(crate) mod step;

pub use connect::Backoff;
pub(crate) use connect::{ConnectError, Opened, Retry, open};
pub(crate) use drive::fits_wire;
pub use job::{WorkerJob, WorkerOptions, WorkerReport};

use super::TcpError;
use super::handshake::HandshakeError;
use drive::SessionEnd;
use job::killed;
use std::time::Instant as StdInstant;

/// Runs a worker until the server says stop. `job` computes the gradients; `log` sees one
/// line per connection event.
pub fn run_worker(
    options: &WorkerOptions,
    job: &mut dyn WorkerJob,
    log: &mut dyn FnMut(&str),
) -> Result<WorkerReport, TcpError> {
    let started = StdInstant::now();
    let mut report = WorkerReport::default();
    let me = options.id.0;
    let who = format!("worker {me}");
    crate::tcp::check_lost_after(options.lost_after).map_err(|e| TcpError(format!("{who}: lost_after: {e}")))?;
    let mut pinned = match &options.expect {
        Some(s) => Some(s.digest().map_err(|e| TcpError(format!("{who}: {e}")))?),
        None => None,
    };
    let mut prepared = false;
    let mut retry = Retry::new(options.backoff, u64::from(me));
    loop {
        let attempt = |log: &mut dyn FnMut(&str)| {
            if killed(options) {
                return Err(ConnectError::Killed);
            }
            session::establish(options, &mut pinned, &mut prepared, &mut report, job, log)
        };
        let established = retry.until_connected(&who, log, attempt, |e| match e {
            ConnectError::Unreachable(e) => format!("server unreachable ({e})"),
            ConnectError::Handshake(e) => e.to_string(),
            ConnectError::Job(e) => e.clone(),
            ConnectError::Killed => "killed".to_owned(),
        });
        let session = match established {
            Ok(session) => session,
            Err(ConnectError::Killed) => break,
            Err(ConnectError::Unreachable(e)) => {
                return Err(TcpError(format!(
                    "{who}: cannot reach the server at {}: {e} (gave up after {:.0} s unreachable)",
                    options.addr,
                    retry.give_up_after_s()
                )));
            }
            // A refusal this worker sent names what it could not run.
            Err(ConnectError::Handshake(HandshakeError::Refusing { message, worker: Some(_), .. })) => {
                return Err(TcpError(format!("{who}: refusing the server's run: {message}")));
            }
            Err(ConnectError::Handshake(e)) => return Err(TcpError(format!("{who}: {e}"))),
            Err(ConnectError::Job(e)) => return Err(TcpError(format!("{who}: {e}"))),
        };
        let written_before = report.sent + report.resent;
        match session::run(session, options, &mut report, job, log) {
            SessionEnd::Stopped => {
                report.stopped = true;
                break;
            }
            SessionEnd::Killed => break,
            SessionEnd::Lost(why) => {
                retry.reset();
                let seen = report.last_version.map_or_else(|| "none".to_owned(), |v| v.to_string());
                let written = report.sent + report.resent - written_before;
                let why = format!(
                    "connection lost after {written} contributions written ({why}; newest model computed on: version {seen})"
                );
                retry.pause(&who, &why, log);
            }
        }
    }
    report.wall_s = started.elapsed().as_secs_f64();
    Ok(report)
}

#[cfg(test)]
mod tests;
