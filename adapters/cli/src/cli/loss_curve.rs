//! The training-loss curve of a TCP run, from the minibatch losses the workers report, and
//! the time to a target loss (`serve --target-loss`): what a run without a built-in test set
//! has instead of a test accuracy.
//!
//! The server keeps one point per model update: the mean of the losses reported with the
//! contributions that update applied. One update's point is noisy (one or a few
//! minibatches), so the curve is read through a moving mean over [`LOSS_WINDOW`] updates.
//! **Crossing rule:** the target loss `L` is reached at the first update `i` that has
//! [`LOSS_WINDOW`] points up to it (itself included) whose mean is at most `L`; the time to
//! target is that update's time on the run's clock. A run of fewer updates never reaches it.

use crate::tcp::LossPoint;
use serde::Serialize;

/// Updates in the moving mean of the loss curve.
pub(super) const LOSS_WINDOW: usize = 10;

/// How many points of the smoothed curve the text summary shows.
const SHOWN_POINTS: usize = 6;

/// The loss curve of a run and its time to a target loss.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LossCurve {
    /// Updates in the moving mean ([`LOSS_WINDOW`]).
    pub window: usize,
    /// The target loss (`--target-loss`), if any.
    pub target_loss: Option<f64>,
    /// Seconds on the run's clock until the moving mean first reached the target.
    pub time_to_target_loss_s: Option<f64>,
    /// The update at which it did.
    pub version_at_target_loss: Option<u64>,
    /// The moving mean at the last update (`None` with fewer than `window` points).
    pub final_mean_loss: Option<f64>,
    /// Every update's mean reported loss, in update order.
    pub points: Vec<LossPoint>,
}

impl LossCurve {
    /// The curve of `points` and its crossing of `target` (see the module's rule).
    pub fn new(points: Vec<LossPoint>, target: Option<f64>) -> Self {
        let means = moving_means(&points);
        let crossing = target.and_then(|l| means.iter().find(|(_, mean)| *mean <= l));
        Self {
            window: LOSS_WINDOW,
            target_loss: target,
            time_to_target_loss_s: crossing.map(|(p, _)| p.t_s),
            version_at_target_loss: crossing.map(|(p, _)| p.version),
            final_mean_loss: means.last().map(|(_, m)| *m),
            points,
        }
    }

    /// The summary's lines: a few points of the smoothed curve, and the time to target.
    pub fn lines(&self) -> Vec<String> {
        let means = moving_means(&self.points);
        let mut out = Vec::new();
        if means.is_empty() {
            out.push(format!(
                "train loss     {} updates reported a loss (fewer than the {} of the moving mean)",
                self.points.len(),
                self.window
            ));
        } else {
            let last = means.len() - 1;
            let mut shown: Vec<usize> = (0..SHOWN_POINTS).map(|k| k * last / (SHOWN_POINTS - 1)).collect();
            shown.dedup();
            let points: Vec<String> = shown
                .iter()
                .filter_map(|i| means.get(*i))
                .map(|(p, m)| format!("{m:.4} (v{}, {:.1} s)", p.version, p.t_s))
                .collect();
            out.push(format!("train loss     {}", points.join("  ")));
            out.push(format!("               mean reported minibatch loss over {} updates", self.window));
        }
        if let Some(l) = self.target_loss {
            let reached = match (self.time_to_target_loss_s, self.version_at_target_loss) {
                (Some(t), Some(v)) => format!("{t:.3} s (version {v})"),
                _ => "not reached".into(),
            };
            out.push(format!("time to loss {l}: {reached}"));
        }
        out
    }
}

/// Each point from the `LOSS_WINDOW`-th on, with the mean loss of the window ending there.
fn moving_means(points: &[LossPoint]) -> Vec<(LossPoint, f64)> {
    points
        .windows(LOSS_WINDOW)
        .filter_map(|w| {
            let mean = w.iter().map(|p| f64::from(p.loss)).sum::<f64>() / LOSS_WINDOW as f64;
            w.last().map(|p| (*p, mean))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn curve(losses: &[f32]) -> Vec<LossPoint> {
        losses
            .iter()
            .enumerate()
            .map(|(i, l)| LossPoint { version: i as u64 + 1, t_s: 0.5 * (i + 1) as f64, loss: *l })
            .collect()
    }

    #[test]
    fn the_target_is_reached_when_the_moving_mean_first_gets_there() {
        // Losses 20, 19, …: the mean of ten ending at loss x is x + 4.5.
        let losses: Vec<f32> = (0..20).map(|i| 20.0 - i as f32).collect();
        let c = LossCurve::new(curve(&losses), Some(10.0));
        // The window ending at loss 5.5 would do; the losses are integers: 5 (mean 9.5) at
        // update 16, whose time is 8 s.
        assert_eq!(c.version_at_target_loss, Some(16));
        assert_eq!(c.time_to_target_loss_s, Some(8.0));
        assert_eq!(c.final_mean_loss, Some(5.5));
        // One low point is not a crossing: the mean of the window is.
        let mut spiky = vec![5.0f32; 30];
        spiky[12] = 0.0;
        let c = LossCurve::new(curve(&spiky), Some(4.0));
        assert_eq!(c.time_to_target_loss_s, None);
        assert!(c.lines().iter().any(|l| l == "time to loss 4: not reached"), "{:?}", c.lines());
    }

    #[test]
    fn fewer_points_than_the_window_never_reach_the_target_and_say_so() {
        let c = LossCurve::new(curve(&[0.1; 9]), Some(1.0));
        assert_eq!((c.time_to_target_loss_s, c.final_mean_loss), (None, None));
        assert!(c.lines()[0].contains("9 updates reported a loss (fewer than the 10"), "{:?}", c.lines());
    }

    #[test]
    fn the_text_shows_a_few_points_not_the_whole_curve() {
        let losses: Vec<f32> = (0..5000).map(|i| 1.0 / (1.0 + i as f32)).collect();
        let c = LossCurve::new(curve(&losses), None);
        let lines = c.lines();
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert_eq!(lines[0].matches(" (v").count(), SHOWN_POINTS, "{}", lines[0]);
        assert!(lines[0].contains("(v10, 5.0 s)") && lines[0].contains("(v5000, 2500.0 s)"), "{}", lines[0]);
        assert_eq!(c.points.len(), 5000, "the JSON keeps every point");
    }
}
