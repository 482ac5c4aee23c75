//! The report for people: the trace, the setting, the table, the pick and the phases.

use super::{Advice, MeasuredNoise, STOP_BEYOND, SweepResult, TIE_WITHIN, WorkloadKind};

/// A number of seconds with three significant figures' worth of decimals.
fn secs(x: f64) -> String {
    if !x.is_finite() {
        return "-".into();
    }
    let decimals = if x >= 100.0 {
        1
    } else if x >= 1.0 {
        3
    } else if x >= 0.01 {
        4
    } else {
        6
    };
    format!("{x:.decimals$}")
}

/// `x` with three significant digits.
fn round3(x: f64) -> String {
    if !x.is_finite() || x == 0.0 {
        return format!("{x}");
    }
    let decimals = (2 - x.abs().log10().floor() as i32).max(0) as usize;
    format!("{x:.decimals$}")
}

impl SweepResult {
    /// The table: one row per candidate, fastest first.
    pub fn table(&self) -> String {
        let mut order: Vec<usize> = (0..self.rows.len()).collect();
        order.sort_by(|&a, &b| {
            let (ra, rb) = (&self.rows[a], &self.rows[b]);
            (ra.reached < ra.repeats).cmp(&(rb.reached < rb.repeats)).then(ra.time.mean.total_cmp(&rb.time.mean))
        });
        let mut out = format!(
            "{:<30} {:>12} {:>10} {:>8} {:>8} {:>9} {:>9} {:>10}  {}\n",
            "candidate", "time (s)", "± 95%", "reached", "vs BSP", "updates", "eff batch", "trace used", "note"
        );
        for i in order {
            let r = &self.rows[i];
            let mut note = Vec::new();
            if Some(i) == self.pick {
                note.push("PICK".to_string());
            }
            if Some(i) == self.fastest && self.fastest != self.pick {
                note.push("fastest mean".to_string());
            }
            if r.tied && Some(i) != self.fastest {
                note.push("tied with the fastest".to_string());
            }
            if let Some(f) = r.median_multiple {
                note.push(format!("time knob = {f}x median step"));
            }
            if r.extension {
                note.push("past the sweep's edge".to_string());
            }
            if let Some(s) = &r.stopped_early {
                note.push(format!(
                    "stopped at {} s: mean over {} s, more than {:.0}% over {} ({} s)",
                    secs(s.at_s),
                    secs(s.lower_bound_s),
                    STOP_BEYOND * 100.0,
                    s.by,
                    secs(s.by_mean_s)
                ));
            }
            let time = if r.reached == r.repeats { secs(r.time.mean) } else { format!(">{}", secs(r.time.mean)) };
            out.push_str(&format!(
                "{:<30} {:>12} {:>10} {:>8} {:>8} {:>9.0} {:>9.2} {:>9.0}%  {}\n",
                r.label,
                time,
                secs(r.time.half_width()),
                format!("{}/{}", r.reached, r.repeats),
                r.speedup_vs_bsp
                    .map_or("-".into(), |s| { format!("{}{s:.2}x", if self.speedup_lower_bound { ">" } else { "" }) }),
                r.updates,
                r.effective_batch,
                r.trace_used * 100.0,
                note.join(", ")
            ));
        }
        out
    }
}

impl Advice {
    /// The report for people: the trace, how the runs were set up, the table, the pick with
    /// its ties, and the phases.
    pub fn report(&self, name: &str) -> String {
        let t = &self.trace;
        let s = &self.whole.setting;
        let mut out = format!(
            "trace {name}: {} workers x {} steps, median step {} s, p90 {} s, slowest step {} s, slowest worker {:.2}x the median worker; BSP replays it in {} s\n",
            t.workers,
            t.steps,
            secs(t.median_step_s),
            secs(t.p90_step_s),
            secs(t.max_step_s),
            t.slowest_worker_ratio,
            secs(t.bsp_replay_s)
        );
        out.push_str(&format!(
            "runs: {} ({}, batch {}, lr {:.4}), target {}; budget {} s ({}), first horizon {} s; network {} ms latency; run seeds {:?}, data seeds {:?}\n",
            match s.workload {
                WorkloadKind::Nqm => "nqm",
                WorkloadKind::Digits => "digits",
                WorkloadKind::Mnist5k => "mnist5k",
            },
            s.model,
            s.batch_size,
            s.learning_rate,
            s.target_note,
            secs(s.budget_s),
            s.budget_note,
            secs(s.first_horizon_s),
            s.latency_s * 1000.0,
            self.whole.run_seeds,
            self.whole.split_seeds
        ));
        if let Some(b) = s.critical_batch {
            let estimated = matches!(self.measured_noise, Some(MeasuredNoise::Estimated(_)));
            let advice = if self.noise_from_trace {
                "from the trace's gradient norms; --noise-scale overrides"
            } else if s.noise == 1.0 {
                "set --noise-scale to your model's"
            } else if estimated {
                "--noise-scale, not the trace's estimate"
            } else {
                "--noise-scale"
            };
            out.push_str(&format!(
                "gradient noise: the NQM's critical batch at the target is {} examples ({}); {advice}\n",
                round3(b),
                if s.noise == 1.0 {
                    "the built-in noise".to_string()
                } else {
                    format!("noise covariance x{}", round3(s.noise))
                }
            ));
        }
        match &self.measured_noise {
            Some(MeasuredNoise::Estimated(e)) => out.push_str(&format!(
                "noise scale from the trace: B = {} worker gradients (95%: {} to {}; x the examples per worker gradient for examples), tr(Σ)/b {} and |G|² {} from {} gradients of steps {}..{}{}\n",
                round3(e.gradients),
                round3(e.low),
                if e.high.is_finite() { round3(e.high) } else { "unbounded".into() },
                round3(e.noise.mean),
                round3(e.signal.mean),
                e.rows,
                e.from_step,
                e.until_step,
                e.loss.map_or(String::new(), |l| format!(", mean minibatch loss {}", round3(l)))
            )),
            Some(MeasuredNoise::NotEstimated(why)) => {
                out.push_str(&format!("noise scale from the trace: no estimate: {why}\n"));
            }
            None => {}
        }
        out.push_str(&self.whole.table());
        out.push_str("time: mean time to target over the seed pairs with its 95% interval (t); a miss counts as the end of its run (\">\": a lower bound); eff batch: gradients averaged per step of the reference learning rate\n");
        let stopped = self.whole.rows.iter().filter(|r| r.stopped_early.is_some()).count();
        if stopped > 0 {
            out.push_str(&format!(
                "race: {stopped} candidate(s) stopped early: with misses counted at their horizon, their mean was already more than {:.0}% over the fastest finished candidate's, so neither the fastest nor the pick\n",
                STOP_BEYOND * 100.0
            ));
        }
        for note in self.whole.extended.iter().flatten() {
            out.push_str(&format!("sweep extended: {note}\n"));
        }
        match self.whole.pick.and_then(|i| self.whole.rows.get(i)) {
            Some(p) => {
                out.push_str(&format!(
                    "recommendation: {} ({} ± {} s{})\n",
                    p.label,
                    secs(p.time.mean),
                    secs(p.time.half_width()),
                    p.speedup_vs_bsp.map_or(String::new(), |x| {
                        let over = if self.whole.speedup_lower_bound { "over " } else { "" };
                        format!(", {over}{x:.2}x BSP")
                    })
                ));
                let tied: Vec<&str> = self
                    .whole
                    .rows
                    .iter()
                    .enumerate()
                    .filter(|(i, r)| r.tied && Some(*i) != self.whole.pick)
                    .map(|(_, r)| r.label.as_str())
                    .collect();
                let largest = self.whole.rows.iter().filter(|r| r.protocol == p.protocol).filter_map(|r| r.count_knob).max();
                if let (Some(k), Some(largest), None) = (p.count_knob, largest, &self.whole.extended) {
                    if k == largest && self.whole.rows.iter().filter(|r| r.protocol == p.protocol).count() > 1 {
                        out.push_str(&format!(
                            "  note: its knob is the largest of its sweep ({}); a scenario file with larger values may find a faster setting\n",
                            p.label
                        ));
                    }
                }
                if tied.is_empty() {
                    out.push_str("  the next candidates are measurably slower (paired 95% intervals exclude a tie)\n");
                } else {
                    out.push_str(&format!(
                        "  cannot be told apart from it on these seeds: {} (the pick is the simplest of the tied within {:.0}% of the fastest)\n",
                        tied.join(", "),
                        TIE_WITHIN * 100.0
                    ));
                }
            }
            None => out.push_str("recommendation: none: no candidate reached the target on every seed; raise --budget or lower --target\n"),
        }
        if !self.sensitivity.is_empty() {
            out.push_str(
                "how the pick depends on the gradient noise (the whole trace swept again at each critical batch):\n",
            );
            for n in &self.sensitivity {
                let sw = &n.sweep;
                let line = sw.pick.and_then(|i| sw.rows.get(i)).map_or("no pick".to_string(), |r| {
                    format!(
                        "{} ({} ± {} s, effective batch {:.1} gradients)",
                        r.label,
                        secs(r.time.mean),
                        secs(r.time.half_width()),
                        r.effective_batch
                    )
                });
                out.push_str(&format!("  critical batch {} examples: {line}\n", round3(n.critical_batch)));
            }
        }
        if self.phases.len() > 1 {
            out.push_str(&format!("phases: the step times change regime {} time(s)\n", self.phases.len() - 1));
            for p in &self.phases {
                let pick = p.sweep.as_ref().map_or("-".to_string(), |s| {
                    s.pick.and_then(|i| s.rows.get(i)).map_or("none".into(), |r| {
                        format!(
                            "{} ({} ± {} s on the phase alone)",
                            r.label,
                            secs(r.time.mean),
                            secs(r.time.half_width())
                        )
                    })
                });
                out.push_str(&format!(
                    "  steps {}..{}: median step {} s, spread {:.2}x: {pick}\n",
                    p.from_step,
                    p.until_step,
                    secs(p.median_step_s),
                    p.spread
                ));
            }
            match &self.switch {
                Some(s) => out.push_str(&format!("  {s}\n")),
                None => out.push_str("  every phase has the same pick: no switch needed\n"),
            }
        } else {
            out.push_str("phases: one regime (no change point in the step-time distribution)\n");
        }
        out
    }
}
