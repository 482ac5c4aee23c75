//! Progress on stderr: a bar or counter on a terminal, lines in a pipe or a log, nothing
//! with JSON output.

use std::io::IsTerminal;

/// Progress without a terminal: one line on stderr per finished unit of work
/// (`compare: 3/17 simulations done, 4.2 s`), so a long run in a pipe or a log is not
/// silent. Silent on a terminal (the progress bar shows it) and with JSON output.
pub(crate) struct ProgressLines {
    what: &'static str,
    unit: &'static str,
    total: u64,
    done: std::sync::atomic::AtomicU64,
    started: std::time::Instant,
    on: bool,
}

impl ProgressLines {
    pub(crate) fn new(what: &'static str, unit: &'static str, total: u64, json: bool) -> Self {
        let on = !json && !std::io::stderr().is_terminal();
        let done = std::sync::atomic::AtomicU64::new(0);
        Self { what, unit, total, done, started: std::time::Instant::now(), on }
    }

    /// Counts one finished unit and prints its line.
    pub(crate) fn one_done(&self) {
        let done = self.done.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
        if self.on {
            let (what, unit, total) = (self.what, self.unit, self.total);
            eprintln!("{what}: {done}/{total} {unit} done, {:.1} s", self.started.elapsed().as_secs_f64());
        }
    }
}

/// A counter of finished work on stderr when it is a terminal and the output is not JSON,
/// for work whose total is not known in advance (a bar would have to grow, and go
/// backwards).
pub(crate) fn progress_counter(unit: &str, json: bool) -> indicatif::ProgressBar {
    if json || !std::io::stderr().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new_spinner();
    if let Ok(style) = indicatif::ProgressStyle::with_template(&format!(
        "{{spinner}} [{{elapsed_precise}}] {{pos}} {unit} done {{msg}}"
    )) {
        bar.set_style(style);
    }
    bar
}

/// A progress bar on stderr when it is a terminal and the output is not JSON.
pub(crate) fn progress_bar(len: u64, json: bool) -> indicatif::ProgressBar {
    if json || !std::io::stderr().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(len);
    if let Ok(style) =
        indicatif::ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:40} {pos}/{len} {msg}")
    {
        bar.set_style(style);
    }
    bar
}
