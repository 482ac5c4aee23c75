//! The checks of the `trace_csv` fuzz target, shared with `tests/tests/fuzz_parsers_corpus.rs`.
//!
//! Every input is read as a step-time trace file (`advise --trace`, `compare --trace`). No
//! panic and no error of more than one line. What is read has step times in the allowed
//! range and finite gradient columns; checked as a table (strict and truncating) it gives
//! every worker steps, and replay models for them; written again (`write_csv_with`) it
//! reads back as the same steps (step times to the 9 decimals written), and writing that is
//! a fixed point.

use syncopate_adapters::trace::{self, GradientStats, Step};

/// Runs every check on `data`; panics on a violation. Returns 1 if the trace was read.
pub(crate) fn check(data: &[u8]) -> usize {
    let path = crate::scratch::dir("trace_csv").join("fuzz.csv");
    crate::scratch::write(&path, data);
    let lines = match trace::read_lines_with_stats(&path) {
        Err(e) => {
            assert!(!e.contains('\n'), "a trace error of more than one line: {e:?}");
            return 0;
        }
        Ok(lines) => lines,
    };
    assert!(!lines.is_empty());
    for (_, s, g) in &lines {
        assert!((trace::MIN_STEP_SECONDS..=trace::MAX_STEP_SECONDS).contains(&s.seconds), "step time {}", s.seconds);
        for v in [g.loss, g.grad_norm, g.mean_norm].into_iter().flatten() {
            assert!(v.is_finite());
        }
    }
    let numbered: Vec<(usize, Step)> = lines.iter().map(|(n, s, _)| (*n, *s)).collect();
    let strict = trace::check_table(&numbered, "fuzz.csv", false);
    match trace::read(&path) {
        Ok(steps) => assert!(strict.is_ok() && steps.len() == lines.len()),
        Err(e) => assert!(strict.is_err() && !e.contains('\n'), "{e:?}"),
    }
    if let Ok((workers, shortest)) = trace::check_table(&numbered, "fuzz.csv", true) {
        assert!(workers >= 1 && shortest >= 1);
        let steps = trace::truncate_to_shortest(numbered.clone(), shortest);
        assert_eq!(steps.len() as u64, u64::from(workers) * shortest);
        let models = syncopate_adapters::sim::compute_models(&steps, workers, "fuzz.csv")
            .unwrap_or_else(|e| panic!("a full table has no replay models: {e}"));
        assert_eq!(models.len(), workers as usize);
    }
    let first = write(&lines);
    crate::scratch::write(&path, &first);
    let again = trace::read_lines_with_stats(&path).unwrap_or_else(|e| panic!("a written trace refused: {e}"));
    assert_eq!(again.len(), lines.len());
    for ((_, a, ga), (_, b, gb)) in lines.iter().zip(&again) {
        assert_eq!((a.worker, a.step, ga), (b.worker, b.step, gb), "a written trace reads back differently");
        assert!((a.seconds - b.seconds).abs() <= 1e-9, "step time {} written as {}", a.seconds, b.seconds);
    }
    assert!(write(&again) == first, "writing a written trace again changed it");
    1
}

/// The trace file of `lines`: with gradient columns if any line has one.
fn write(lines: &[(usize, Step, GradientStats)]) -> Vec<u8> {
    let steps: Vec<Step> = lines.iter().map(|(_, s, _)| *s).collect();
    let stats: Vec<GradientStats> = lines.iter().map(|(_, _, g)| *g).collect();
    let stats = if stats.iter().all(GradientStats::is_empty) { &[][..] } else { &stats[..] };
    let mut out = Vec::new();
    trace::write_csv_with(&mut out, &steps, stats).unwrap_or_else(|e| panic!("writing a trace: {e}"));
    out
}
