//! The plot of `syncopate compare --plot FILE.svg`: one figure a person reads at a glance.
//!
//! - Left: test accuracy against virtual time, one line per run: the median over the seeds
//!   with a band from the lowest to the highest seed, a distinct colour and dash pattern per
//!   run, and a bold dashed target line. The time axis ends a little after the slowest run
//!   reaches the target (the whole budget when none does), so the action fills the plot.
//! - Right: time to target per run as bars (the median) with a whisker over the seeds;
//!   runs that never reached it are marked.
//! - Below, when the scenario has DBW runs: DBW's backup workers `b_t` over time.

use crate::compare::Comparison;
use crate::sim::CurvePoint;
use plotters::coord::Shift;
use plotters::prelude::*;

/// Twelve colours that stay distinct side by side (Tableau 10 and two dark ones).
const COLOURS: [RGBColor; 12] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
    RGBColor(0, 0, 128),
    RGBColor(0, 100, 0),
];

/// How run `i` is drawn: a colour, and solid or dashed from the thirteenth run on.
fn style(i: usize) -> (RGBColor, bool) {
    (COLOURS[i % COLOURS.len()], (i / COLOURS.len()) % 2 == 1)
}

/// The median, lowest and highest accuracy over the seeds at each time of the first seed's
/// curve (each seed's curve read as a step function: its last evaluation at or before t).
fn band(seeds: &[Vec<CurvePoint>]) -> Vec<(f64, f64, f64, f64)> {
    let Some(first) = seeds.first() else { return Vec::new() };
    let at = |curve: &[CurvePoint], t: f64| {
        let i = curve.partition_point(|p| p.time_s <= t);
        curve.get(i.saturating_sub(1)).map_or(0.0, |p| p.accuracy)
    };
    first
        .iter()
        .map(|p| {
            let mut v: Vec<f64> = seeds.iter().map(|c| at(c, p.time_s)).collect();
            v.sort_by(f64::total_cmp);
            let n = v.len();
            let median = if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 };
            (p.time_s, median, v[0], v[n - 1])
        })
        .collect()
}

/// The end of the time axis: 1.5 × the latest time any seed of any run reached the target,
/// within the budget; the whole budget when no run reached it.
fn time_axis_end(c: &Comparison) -> f64 {
    let latest = c
        .times_to_target
        .iter()
        .flatten()
        .flatten()
        .copied()
        .fold(None, |m: Option<f64>, t| Some(m.map_or(t, |m| m.max(t))));
    let end = latest.map_or(c.max_time_s, |t| (t * 1.5).min(c.max_time_s));
    end.max(1e-3)
}

/// Renders the plot of `c` as SVG text.
pub fn comparison_svg(c: &Comparison) -> Result<String, String> {
    let mut svg = String::new();
    {
        let has_dbw = c.backup_workers.iter().any(|s| !s.is_empty());
        let height = if has_dbw { 980 } else { 720 };
        let root = SVGBackend::with_string(&mut svg, (1400, height)).into_drawing_area();
        draw(&root, c, has_dbw).map_err(|e| format!("cannot draw the plot: {e}"))?;
        root.present().map_err(|e| format!("cannot draw the plot: {e}"))?;
    }
    Ok(svg)
}

type DrawResult = Result<(), Box<dyn std::error::Error>>;

fn draw(root: &DrawingArea<SVGBackend<'_>, Shift>, c: &Comparison, has_dbw: bool) -> DrawResult {
    root.fill(&WHITE)?;
    let seeds = if c.seeds.end.wrapping_sub(c.seeds.start) == 1 {
        format!("seed {}", c.seeds.start)
    } else {
        format!("seeds {}..{} (median, band: lowest to highest seed)", c.seeds.start, c.seeds.end.wrapping_sub(1))
    };
    let root = root.titled(&format!("{} — {seeds}", c.scenario), ("sans-serif", 22))?;
    let (top, bottom) = if has_dbw { root.split_vertically(700) } else { (root.clone(), root.clone()) };
    let (left, right) = top.split_horizontally(900);
    let x_end = time_axis_end(c);
    accuracy(&left, c, x_end)?;
    bars(&right, c)?;
    if has_dbw {
        backups(&bottom, c, x_end)?;
    }
    Ok(())
}

fn accuracy(area: &DrawingArea<SVGBackend<'_>, Shift>, c: &Comparison, x_end: f64) -> DrawResult {
    let y_min = (c.target_accuracy - 0.3).clamp(0.0, 0.9);
    let mut chart = ChartBuilder::on(area)
        .caption("test accuracy (median over seeds)", ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(45)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..x_end, y_min..1.0)?;
    chart.configure_mesh().x_desc("virtual time (s)").y_desc("test accuracy").light_line_style(WHITE).draw()?;
    let clip = |y: f64| y.clamp(y_min, 1.0);
    for (i, (label, seeds)) in c.rows.iter().map(|r| &r.label).zip(&c.curves).enumerate() {
        let (colour, dashed) = style(i);
        let points: Vec<(f64, f64, f64, f64)> = band(seeds).into_iter().filter(|p| p.0 <= x_end).collect();
        if seeds.len() > 1 {
            let outline: Vec<(f64, f64)> =
                points.iter().map(|p| (p.0, clip(p.3))).chain(points.iter().rev().map(|p| (p.0, clip(p.2)))).collect();
            chart.draw_series(std::iter::once(Polygon::new(outline, colour.mix(0.12).filled())))?;
        }
        let line: Vec<(f64, f64)> = points.iter().map(|p| (p.0, clip(p.1))).collect();
        let stroke = colour.stroke_width(2);
        if dashed {
            chart
                .draw_series(DashedLineSeries::new(line, 8, 5, stroke))?
                .label(label.clone())
                .legend(move |(x, y)| plotters::element::DashedPathElement::new([(x, y), (x + 22, y)], 6, 3, stroke));
        } else {
            chart
                .draw_series(LineSeries::new(line, stroke))?
                .label(label.clone())
                .legend(move |(x, y)| PathElement::new([(x, y), (x + 22, y)], stroke));
        }
    }
    let target = BLACK.stroke_width(2);
    chart
        .draw_series(DashedLineSeries::new([(0.0, c.target_accuracy), (x_end, c.target_accuracy)], 10, 6, target))?
        .label(format!("target {:.2}", c.target_accuracy))
        .legend(move |(x, y)| PathElement::new([(x, y), (x + 22, y)], target));
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .label_font(("sans-serif", 13))
        .draw()?;
    Ok(())
}

fn bars(area: &DrawingArea<SVGBackend<'_>, Shift>, c: &Comparison) -> DrawResult {
    let n = c.rows.len();
    let slowest = c.times_to_target.iter().flatten().flatten().copied().fold(0.0f64, f64::max).max(1e-3);
    // Room on the right of the longest whisker for its label.
    let longest = slowest * 1.9;
    let mut chart = ChartBuilder::on(area)
        .caption("time to target (s): median, whisker over seeds", ("sans-serif", 16))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(10)
        .build_cartesian_2d(0.0..longest, 0.0..n.max(1) as f64)?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .disable_y_axis()
        .light_line_style(WHITE)
        .x_desc("virtual seconds")
        .draw()?;
    for (i, (row, times)) in c.rows.iter().zip(&c.times_to_target).enumerate() {
        let (colour, _) = style(i);
        let y = (n - 1 - i) as f64;
        let reached: Vec<f64> = times.iter().flatten().copied().collect();
        let mut name = row.label.clone();
        let mut label_at = slowest * 0.02;
        if row.reference {
            name.push_str(" [reference]");
        }
        match row.time_to_target_s {
            Some(t) => {
                chart
                    .draw_series(std::iter::once(Rectangle::new([(0.0, y + 0.15), (t, y + 0.85)], colour.filled())))?;
                let lo = reached.iter().copied().fold(f64::INFINITY, f64::min);
                let hi = reached.iter().copied().fold(0.0f64, f64::max);
                if reached.len() > 1 {
                    let whisker = BLACK.stroke_width(1);
                    chart.draw_series([
                        PathElement::new([(lo, y + 0.5), (hi, y + 0.5)], whisker),
                        PathElement::new([(lo, y + 0.35), (lo, y + 0.65)], whisker),
                        PathElement::new([(hi, y + 0.35), (hi, y + 0.65)], whisker),
                    ])?;
                }
                name = format!("{name}  {t:.3} s");
                label_at = t.max(hi) + slowest * 0.03;
            }
            None => name = format!("{name}  not reached"),
        }
        chart.draw_series(std::iter::once(Text::new(
            name,
            (label_at, y + 0.5),
            ("sans-serif", 12).into_font().color(&BLACK).pos(plotters::style::text_anchor::Pos::new(
                plotters::style::text_anchor::HPos::Left,
                plotters::style::text_anchor::VPos::Center,
            )),
        )))?;
    }
    Ok(())
}

fn backups(area: &DrawingArea<SVGBackend<'_>, Shift>, c: &Comparison, x_end: f64) -> DrawResult {
    let most = c.backup_workers.iter().flatten().map(|p| p.1).max().unwrap_or(1).max(1);
    let mut chart = ChartBuilder::on(area)
        .caption(format!("DBW: backup workers b_t over time (seed {})", c.seeds.start), ("sans-serif", 16))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..x_end, 0.0..(f64::from(most) + 1.0))?;
    chart.configure_mesh().x_desc("virtual time (s)").y_desc("b_t").light_line_style(WHITE).draw()?;
    for (i, (row, series)) in c.rows.iter().zip(&c.backup_workers).enumerate() {
        if series.is_empty() {
            continue;
        }
        let (colour, _) = style(i);
        let stroke = colour.stroke_width(2);
        let mut steps = Vec::with_capacity(series.len() * 2);
        let mut previous: Option<f64> = None;
        for &(t, b) in series.iter().filter(|p| p.0 <= x_end) {
            if let Some(prev) = previous {
                steps.push((t, prev));
            }
            steps.push((t, f64::from(b)));
            previous = Some(f64::from(b));
        }
        chart
            .draw_series(LineSeries::new(steps, stroke))?
            .label(row.label.clone())
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 22, y)], stroke));
    }
    chart.configure_series_labels().position(SeriesLabelPosition::UpperRight).border_style(BLACK).draw()?;
    Ok(())
}

/// A single step series over virtual time (for example DBW's `b_t`), written to `path` as
/// SVG: `title` above, `y_desc` on the vertical axis.
pub fn trajectory_svg(path: &std::path::Path, title: &str, y_desc: &str, points: &[(f64, f64)]) -> Result<(), String> {
    let fail = |e: &dyn std::fmt::Display| format!("{}: cannot draw the plot: {e}", path.display());
    let max_t = points.iter().map(|p| p.0).fold(0.0f64, f64::max).max(1e-3);
    let max_y = points.iter().map(|p| p.1).fold(0.0f64, f64::max).max(1.0) * 1.05;
    let root = SVGBackend::new(path, (900, 420)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| fail(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..max_t, 0.0..max_y)
        .map_err(|e| fail(&e))?;
    chart.configure_mesh().x_desc("virtual time (s)").y_desc(y_desc).draw().map_err(|e| fail(&e))?;
    let steps = points.windows(2).flat_map(|w| [(w[0].0, w[0].1), (w[1].0, w[0].1)]).chain(points.last().copied());
    chart.draw_series(LineSeries::new(steps, COLOURS[0].stroke_width(2))).map_err(|e| fail(&e))?;
    root.present().map_err(|e| fail(&e))
}

/// The plot of `syncopate advise --plot FILE.svg`: one panel per sweep (the whole trace,
/// then each phase), time to target per candidate as the mean with its 95% interval,
/// fastest first; the pick in bold, tied candidates in orange, the rest grey.
pub fn advice_svg(a: &syncopate_sim::advise::Advice) -> Result<String, String> {
    let mut sweeps = vec![("whole trace".to_string(), &a.whole)];
    for p in &a.phases {
        if let Some(s) = &p.sweep {
            sweeps.push((format!("steps {}..{} alone", p.from_step, p.until_step), s));
        }
    }
    let rows = a.whole.rows.len().max(1) as u32;
    let panel = 90 + 22 * rows;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (1100, panel * sweeps.len() as u32 + 40)).into_drawing_area();
        let draw = || -> DrawResult {
            root.fill(&WHITE)?;
            let t = &a.trace;
            let title = format!(
                "advise: {} workers x {} steps, median step {:.4} s — time to target, mean and 95% interval",
                t.workers, t.steps, t.median_step_s
            );
            let root = root.titled(&title, ("sans-serif", 20))?;
            let areas = root.split_evenly((sweeps.len(), 1));
            for ((name, sweep), area) in sweeps.iter().zip(&areas) {
                intervals(area, name, sweep)?;
            }
            Ok(())
        };
        draw().map_err(|e| format!("cannot draw the plot: {e}"))?;
        root.present().map_err(|e| format!("cannot draw the plot: {e}"))?;
    }
    Ok(svg)
}

fn intervals(
    area: &DrawingArea<SVGBackend<'_>, Shift>,
    name: &str,
    s: &syncopate_sim::advise::SweepResult,
) -> DrawResult {
    let mut order: Vec<usize> = (0..s.rows.len()).collect();
    order.sort_by(|&a, &b| s.rows[a].time.mean.total_cmp(&s.rows[b].time.mean));
    let finite = |x: f64| if x.is_finite() { x } else { 0.0 };
    let hi = s.rows.iter().map(|r| finite(r.time.high).max(r.time.mean)).fold(0.0f64, f64::max).max(1e-6);
    let n = order.len().max(1);
    let mut chart = ChartBuilder::on(area)
        .caption(
            format!("{name}: {} — seeds {:?}, data seeds {:?}", s.setting.target_note, s.run_seeds, s.split_seeds),
            ("sans-serif", 14),
        )
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(10)
        .build_cartesian_2d(0.0..hi * 1.7, 0.0..n as f64)?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .disable_y_axis()
        .x_desc("virtual seconds to target")
        .light_line_style(WHITE)
        .draw()?;
    for (rank, &i) in order.iter().enumerate() {
        let r = &s.rows[i];
        let y = (n - 1 - rank) as f64 + 0.5;
        let colour = if Some(i) == s.pick {
            COLOURS[0]
        } else if r.tied {
            COLOURS[1]
        } else {
            COLOURS[7]
        };
        let (lo, up) = (finite(r.time.low).max(0.0), finite(r.time.high).min(hi * 1.05).max(r.time.mean));
        let stroke = colour.stroke_width(if Some(i) == s.pick { 3 } else { 2 });
        chart.draw_series([
            PathElement::new([(lo, y), (up, y)], stroke),
            PathElement::new([(lo, y - 0.25), (lo, y + 0.25)], stroke),
            PathElement::new([(up, y - 0.25), (up, y + 0.25)], stroke),
        ])?;
        let marker = if r.reached == r.repeats { colour.filled() } else { WHITE.filled() };
        chart.draw_series(std::iter::once(Circle::new((r.time.mean, y), 4, marker)))?;
        if r.reached < r.repeats {
            chart.draw_series(std::iter::once(Circle::new((r.time.mean, y), 4, colour.stroke_width(1))))?;
        }
        let mut text = format!("{}  {:.4} ± {:.4} s", r.label, r.time.mean, r.time.half_width());
        if r.reached < r.repeats {
            text.push_str(&format!(" (reached {}/{})", r.reached, r.repeats));
        }
        if Some(i) == s.pick {
            text.push_str("  PICK");
        } else if r.tied {
            text.push_str("  tied");
        }
        chart.draw_series(std::iter::once(Text::new(
            text,
            (up + hi * 0.02, y),
            ("sans-serif", 12).into_font().color(&BLACK).pos(plotters::style::text_anchor::Pos::new(
                plotters::style::text_anchor::HPos::Left,
                plotters::style::text_anchor::VPos::Center,
            )),
        )))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(time_s: f64, accuracy: f64) -> CurvePoint {
        CurvePoint { time_s, version: 0, accuracy, loss: 0.0 }
    }

    #[test]
    fn band_is_the_median_and_range_over_seeds() {
        let seeds = vec![
            vec![point(0.0, 0.1), point(1.0, 0.5)],
            vec![point(0.0, 0.2), point(1.0, 0.9)],
            vec![point(0.0, 0.3), point(0.5, 0.7)],
        ];
        let b = band(&seeds);
        assert_eq!(b, [(0.0, 0.2, 0.1, 0.3), (1.0, 0.7, 0.5, 0.9)]);
    }

    #[test]
    fn runs_get_distinct_styles() {
        let styles: Vec<(RGBColor, bool)> = (0..20).map(style).collect();
        for (i, a) in styles.iter().enumerate() {
            for b in &styles[i + 1..] {
                assert_ne!((a.0.0, a.0.1, a.0.2, a.1), (b.0.0, b.0.1, b.0.2, b.1));
            }
        }
    }
}
