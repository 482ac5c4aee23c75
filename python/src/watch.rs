//! What `serve` watches while the TCP server runs, on two threads:
//!
//! - [`Watch`], on the server's thread, turns the run's notes into evaluations, stop
//!   decisions, the step-time trace and log lines, and keeps [`Progress`] up to date;
//! - [`Ticker`], on the calling thread, wakes every [`TICK`]: it lets Python's signal
//!   handlers run (Ctrl-C stops the run cleanly even while no model update comes), ends the
//!   run at its time limit (wall time since `serve` began, less every evaluation), says every report interval which workers a server still waits
//!   for, and stops a run whose every worker has been lost once `lost_after` has passed
//!   without a rejoin (unless told to wait for rejoins).
//!
//! Lock order: [`Progress`]'s mutex is never held while the GIL is taken, so neither thread
//! can wait for the other holding what the other needs.

use core::time::Duration;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Instant;
use syncopate::{ServerEvent, Version};
use syncopate_sim::trace::served::ServedTrace;
use syncopate_transport::tcp::{Note, ServerHandle};

/// How often the calling thread wakes while the server runs.
pub(crate) const TICK: Duration = Duration::from_millis(50);

/// Workers named in one log line; the rest are counted.
const NAMED: usize = 8;

/// The run's state both threads read: who is connected, and the clock.
#[derive(Debug)]
pub(crate) struct Progress {
    /// When `serve` began (the time limit's origin).
    began: Instant,
    /// Seconds spent in finished evaluations since `serve` began.
    eval_all_s: f64,
    /// Per worker: a session of it has joined at least once.
    joined: Vec<bool>,
    /// Per worker: its session is live (joined and not lost since).
    live: Vec<bool>,
    /// When every worker had connected: the run's clock starts.
    started: Option<Instant>,
    /// Seconds spent in finished evaluations since the clock started.
    eval_s: f64,
    /// When the evaluation in progress began (its time is not training time either).
    evaluating_since: Option<Instant>,
    /// Since when no worker has been live, after one had joined.
    all_lost_since: Option<Instant>,
}

impl Progress {
    /// No worker connected yet, the clock not started.
    pub(crate) fn new(workers: u32) -> Self {
        let n = workers as usize;
        Self {
            began: Instant::now(),
            eval_all_s: 0.0,
            joined: vec![false; n],
            live: vec![false; n],
            started: None,
            eval_s: 0.0,
            evaluating_since: None,
            all_lost_since: None,
        }
    }

    /// Training seconds so far: since the clock started, less every evaluation (the one in
    /// progress included).
    fn training_s(&self) -> f64 {
        let Some(t) = self.started else {
            return 0.0;
        };
        let current = self.evaluating_since.map_or(0.0, |e| e.elapsed().as_secs_f64());
        (t.elapsed().as_secs_f64() - self.eval_s - current).max(0.0)
    }

    /// Seconds since `serve` began, less every evaluation (the one in progress included):
    /// what the time limit counts.
    fn limit_s(&self) -> f64 {
        let current = self.evaluating_since.map_or(0.0, |e| e.elapsed().as_secs_f64());
        (self.began.elapsed().as_secs_f64() - self.eval_all_s - current).max(0.0)
    }

    /// Seconds of evaluation since the clock started.
    pub(crate) fn eval_s(&self) -> f64 {
        self.eval_s
    }

    fn join(&mut self, worker: usize) {
        if let (Some(j), Some(l)) = (self.joined.get_mut(worker), self.live.get_mut(worker)) {
            *j = true;
            *l = true;
        }
        self.all_lost_since = None;
    }

    fn lose(&mut self, worker: usize) {
        if let Some(l) = self.live.get_mut(worker) {
            *l = false;
        }
        if self.all_lost_since.is_none() && self.joined.contains(&true) && !self.live.contains(&true) {
            self.all_lost_since = Some(Instant::now());
        }
    }
}

/// Locks `progress`, taking it over from a thread that panicked holding it (the data is
/// plain counters, valid at every step).
pub(crate) fn lock(progress: &Mutex<Progress>) -> MutexGuard<'_, Progress> {
    progress.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The workers whose flag is false, as "0, 3, 5" (at most [`NAMED`], then "+N more").
fn missing(flags: &[bool]) -> String {
    let ids: Vec<usize> = flags.iter().enumerate().filter(|(_, f)| !**f).map(|(i, _)| i).collect();
    let mut text = ids.iter().take(NAMED).map(ToString::to_string).collect::<Vec<_>>().join(", ");
    if ids.len() > NAMED {
        text.push_str(&format!(" (+{} more)", ids.len() - NAMED));
    }
    text
}

/// Sends `line` to the caller's `log` (or standard error); the exception a `log` raises.
fn log(log: Option<&PyObject>, line: &str) -> Option<PyErr> {
    Python::with_gil(|py| match log {
        Some(f) => f.call1(py, (line,)).err(),
        None => {
            eprintln!("syncopate serve: {line}");
            None
        }
    })
}

/// The server thread's side: what the run's notes are turned into.
pub(crate) struct Watch<'a> {
    pub(crate) evaluate: Option<&'a PyObject>,
    pub(crate) every: u64,
    /// The version of the last evaluation (or 0).
    pub(crate) evaluated: u64,
    pub(crate) target: Option<f64>,
    pub(crate) max_updates: Option<u64>,
    pub(crate) log: Option<&'a PyObject>,
    /// What `evaluate` gets: a read-only view of the model.
    pub(crate) view: &'a PyObject,
    pub(crate) handle: ServerHandle,
    pub(crate) progress: &'a Mutex<Progress>,
    /// `(version, seconds spent evaluating up to and including it)` per evaluation.
    pub(crate) eval_marks: Vec<(u64, f64)>,
    /// `(version, training seconds, result)` per evaluation.
    pub(crate) evaluations: Vec<(u64, f64, PyObject)>,
    pub(crate) time_to_target_s: Option<f64>,
    /// The first exception `evaluate` or `log` raised; the run stops at it.
    pub(crate) failure: Option<PyErr>,
    pub(crate) lost: Vec<u32>,
    /// The step-time trace being recorded (`record_trace`).
    pub(crate) trace: Option<ServedTrace>,
}

impl Watch<'_> {
    pub(crate) fn note(&mut self, note: Note<'_>) {
        match note {
            Note::Log(line) => self.log_line(line),
            Note::Started => lock(self.progress).started = Some(Instant::now()),
            Note::Event(ServerEvent::WorkerJoined { worker, .. }) => lock(self.progress).join(worker.index()),
            Note::Event(ServerEvent::WorkerLost { worker }) => {
                self.lost.push(worker.0);
                lock(self.progress).lose(worker.index());
            }
            Note::Event(ServerEvent::Stalled { waiting_for, missing, .. }) => {
                // Before the clock starts, the ticker names the workers still to connect.
                if lock(self.progress).started.is_some() {
                    self.log_line(&format!("stalled: waiting for worker {} ({missing} missing)", waiting_for.0));
                }
            }
            Note::Event(_) => {}
            Note::Model { version, .. } => self.model(version),
            Note::Contribution { worker, msg, step_seconds } => {
                if let Some(t) = self.trace.as_mut() {
                    t.record(worker, msg, step_seconds);
                }
            }
        }
    }

    fn log_line(&mut self, line: &str) {
        if let Some(e) = log(self.log, line) {
            self.fail(e);
        }
    }

    fn fail(&mut self, e: PyErr) {
        if self.failure.is_none() {
            self.failure = Some(e);
        }
        self.handle.stop();
    }

    fn model(&mut self, version: Version) {
        if self.failure.is_some() {
            return;
        }
        if let Some(evaluate) = self.evaluate {
            // Every `every`-th version, even when one step of the server made several.
            if version.0 / self.every > self.evaluated / self.every {
                self.evaluated = version.0;
                self.evaluate(evaluate, version.0);
            }
        }
        if self.max_updates.is_some_and(|m| version.0 >= m) {
            self.handle.stop();
        }
    }

    fn evaluate(&mut self, evaluate: &PyObject, version: u64) {
        let at = {
            let mut p = lock(self.progress);
            p.evaluating_since = Some(Instant::now());
            p.training_s()
        };
        let outcome = Python::with_gil(|py| -> PyResult<(PyObject, Option<f64>)> {
            let result = evaluate.call1(py, (self.view.bind(py),))?;
            let score = match self.target {
                Some(_) => Some(result.extract::<f64>(py).map_err(|_| {
                    PyValueError::new_err(format!(
                        "evaluate returned {}, not a number to compare with the target",
                        result.bind(py).get_type().name().map(|n| n.to_string()).unwrap_or_default()
                    ))
                })?),
                None => None,
            };
            Ok((result, score))
        });
        let spent = {
            let mut p = lock(self.progress);
            if let Some(b) = p.evaluating_since.take() {
                let spent = b.elapsed().as_secs_f64();
                p.eval_all_s += spent;
                if p.started.is_some() {
                    p.eval_s += spent;
                }
            }
            p.eval_s
        };
        self.eval_marks.push((version, spent));
        match outcome {
            Ok((result, score)) => {
                self.evaluations.push((version, at, result));
                if let (Some(target), Some(score)) = (self.target, score) {
                    if score >= target && self.time_to_target_s.is_none() {
                        self.time_to_target_s = Some(at);
                        self.handle.stop();
                    }
                }
            }
            Err(e) => self.fail(e),
        }
    }
}

/// The calling thread's side: signals, the time limit, and what the server waits for.
pub(crate) struct Ticker<'a> {
    pub(crate) progress: &'a Mutex<Progress>,
    pub(crate) handle: ServerHandle,
    pub(crate) log: Option<&'a PyObject>,
    /// How often a waiting server says for whom.
    pub(crate) report_every: Duration,
    /// How long a server whose every worker was lost waits for one to rejoin.
    pub(crate) lost_after: Duration,
    /// Wait for rejoins without end instead.
    pub(crate) wait_for_rejoin: bool,
    /// Seconds (since `serve` began, less evaluations) after which the run stops.
    pub(crate) time_limit_s: Option<f64>,
    /// When the last report was made (or the run began).
    pub(crate) last_report: Instant,
    /// Whether the loss of every worker has been reported.
    pub(crate) announced_all_lost: bool,
    /// Why the ticker stopped the run, if it did.
    pub(crate) stopped: Option<&'static str>,
    /// The exception a signal handler raised (`KeyboardInterrupt` for Ctrl-C).
    pub(crate) interrupt: Option<PyErr>,
    /// The exception the caller's `log` raised.
    pub(crate) failure: Option<PyErr>,
    /// `stop_when(live, joined)`: called at every wake-up with the number of workers connected
    /// and the number that ever joined; the run stops when it returns true (an exception stops
    /// it too, and `serve` raises it).
    pub(crate) stop_when: Option<&'a PyObject>,
}

impl Ticker<'_> {
    /// One wake-up of the calling thread while the server runs.
    pub(crate) fn tick(&mut self) {
        if self.stopped.is_some() {
            return;
        }
        if let Err(e) = Python::with_gil(|py| py.check_signals()) {
            self.interrupt = Some(e);
            self.stop("interrupted");
            self.say("interrupted: the workers are told to stop; the model and the report are kept");
            return;
        }
        if let Some(f) = self.stop_when {
            let (live, joined) = {
                let p = lock(self.progress);
                (p.live.iter().filter(|l| **l).count(), p.joined.iter().filter(|j| **j).count())
            };
            match Python::with_gil(|py| f.call1(py, (live, joined)).and_then(|r| r.bind(py).is_truthy())) {
                Ok(false) => {}
                Ok(true) => return self.stop("stopped"),
                Err(e) => {
                    self.failure.get_or_insert(e);
                    return self.stop("stopped");
                }
            }
        }
        let (lines, stop) = self.decide(Instant::now());
        for line in &lines {
            self.say(line);
        }
        if let Some(reason) = stop {
            self.stop(reason);
        }
    }

    fn stop(&mut self, reason: &'static str) {
        self.stopped.get_or_insert(reason);
        self.handle.stop();
    }

    fn say(&mut self, line: &str) {
        if let Some(e) = log(self.log, line) {
            self.failure.get_or_insert(e);
            self.stop("stopped");
        }
    }

    /// The lines to log and the reason to stop, if any, at `now` (the lock is released
    /// before anything is logged).
    fn decide(&mut self, now: Instant) -> (Vec<String>, Option<&'static str>) {
        let p = lock(self.progress);
        let mut lines = Vec::new();
        if self.time_limit_s.is_some_and(|limit| p.limit_s() >= limit) {
            return (lines, Some("time_limit"));
        }
        let due = now.duration_since(self.last_report) >= self.report_every;
        if let Some(since) = p.all_lost_since {
            let lost = missing(&p.live);
            if !self.announced_all_lost {
                self.announced_all_lost = true;
                self.last_report = now;
                lines.push(if self.wait_for_rejoin {
                    format!("every worker has been lost (workers {lost}); waiting for them to rejoin")
                } else {
                    format!(
                        "every worker has been lost (workers {lost}); stopping in {:.1} s unless one rejoins",
                        self.lost_after.as_secs_f64()
                    )
                });
            } else if self.wait_for_rejoin && due {
                self.last_report = now;
                lines.push(format!("waiting for workers {lost} to rejoin"));
            }
            if !self.wait_for_rejoin && now.duration_since(since) >= self.lost_after {
                lines.push(format!(
                    "no worker rejoined within {:.1} s: stopping (wait_for_rejoin=True waits)",
                    self.lost_after.as_secs_f64()
                ));
                return (lines, Some("all_workers_lost"));
            }
            return (lines, None);
        }
        self.announced_all_lost = false;
        if p.started.is_none() && due {
            self.last_report = now;
            let connected = p.joined.iter().filter(|j| **j).count();
            lines.push(format!(
                "waiting for workers {} to connect ({connected} of {} connected)",
                missing(&p.joined),
                p.joined.len()
            ));
        }
        (lines, None)
    }
}
