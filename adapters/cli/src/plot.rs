//! The plot of `syncopate compare --plot FILE.svg`: one figure a person reads at a glance.
//!
//! - Left: test accuracy against virtual time, one line per run: the median over the seeds
//!   with a band from the lowest to the highest seed, a colour of its own per run (a run
//!   whose curve is another's drawn dashed and labelled so), and a bold dashed target line.
//!   The time axis ends a little after the slowest run's median reaches the target (the
//!   whole budget when none does), so the action fills the plot. When the scenario sweeps
//!   one knob of one protocol (`backup b=0..12`), the left panel is instead the time to
//!   target against that knob, with every other run as a dashed line across it.
//! - Right: time to target per run as bars (the median) with a whisker over the seeds,
//!   the axis ending at the longest whisker; runs that never reached it are marked.
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

/// A colour of its own for each of `n` series: the twelve above when they suffice, else
/// hues spread by the golden angle at alternating lightness (distinct for any `n` a plot
/// holds; a clash is nudged).
fn colours(n: usize) -> Vec<RGBColor> {
    if n <= COLOURS.len() {
        return COLOURS[..n].to_vec();
    }
    let mut out: Vec<RGBColor> = Vec::with_capacity(n);
    for i in 0..n {
        let hue = (i as f64 * 137.507_764) % 360.0;
        let light = [0.38, 0.52, 0.30][i % 3];
        let mut c = hsl(hue, 0.70, light);
        while out.contains(&c) {
            c = RGBColor(c.0.wrapping_add(7), c.1, c.2);
        }
        out.push(c);
    }
    out
}

fn hsl(hue: f64, saturation: f64, light: f64) -> RGBColor {
    let c = (1.0 - (2.0 * light - 1.0).abs()) * saturation;
    let h = hue / 60.0;
    let x = c * (1.0 - (h % 2.0 - 1.0).abs());
    let (r, g, b) = match h as u32 {
        0 => (c, x, 0.0),
        1 => (x, c, 0.0),
        2 => (0.0, c, x),
        3 => (0.0, x, c),
        4 => (x, 0.0, c),
        _ => (c, 0.0, x),
    };
    let m = light - c / 2.0;
    let byte = |v: f64| ((v + m) * 255.0).round().clamp(0.0, 255.0) as u8;
    RGBColor(byte(r), byte(g), byte(b))
}

/// A sweep of one knob: the rows of one protocol whose labels differ only in one
/// `key=number` (at least three), as (row, value), in table order; and the key.
fn knob_sweep(labels: &[&str]) -> Option<(String, Vec<(usize, f64)>)> {
    let parse = |label: &str| {
        let label = label.trim_end();
        let (prefix, last) = label.rsplit_once(' ')?;
        let (key, value) = last.split_once('=')?;
        Some((format!("{prefix} {key}"), key.to_owned(), value.parse::<f64>().ok()?))
    };
    let parsed: Vec<Option<(String, String, f64)>> = labels.iter().map(|l| parse(l)).collect();
    let mut best: Option<(String, Vec<(usize, f64)>)> = None;
    for (prefix, key, _) in parsed.iter().flatten() {
        let members: Vec<(usize, f64)> = parsed
            .iter()
            .enumerate()
            .filter_map(|(i, p)| p.as_ref().filter(|p| &p.0 == prefix).map(|p| (i, p.2)))
            .collect();
        if members.len() >= 3 && best.as_ref().is_none_or(|b| b.1.len() < members.len()) {
            best = Some((format!("{} {key}", prefix.rsplit_once(' ').map_or("", |p| p.0)), members));
        }
    }
    best
}

/// The first earlier run whose median curve is the same as run `i`'s (it would hide it).
fn same_curve_as(bands: &[Vec<(f64, f64, f64, f64)>], i: usize) -> Option<usize> {
    let mine = bands.get(i)?;
    (0..i).find(|&j| bands.get(j).is_some_and(|b| !b.is_empty() && b == mine))
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

/// The end of the time axis: 1.25 × the latest median time to target of a run, within the
/// budget; the whole budget when no run reached it.
fn time_axis_end(medians: &[Option<f64>], budget_s: f64) -> f64 {
    let latest = medians.iter().flatten().copied().fold(None, |m: Option<f64>, t| Some(m.map_or(t, |m| m.max(t))));
    let end = latest.map_or(budget_s, |t| (t * 1.25).min(budget_s));
    end.max(1e-3)
}

/// The end of the time-to-target axis: 5% past the longest whisker (the latest time any
/// seed reached the target).
fn bars_axis_end(times: &[Vec<Option<f64>>]) -> f64 {
    times.iter().flatten().flatten().copied().fold(0.0f64, f64::max).max(1e-3) * 1.05
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
    let medians: Vec<Option<f64>> = c.rows.iter().map(|r| r.time_to_target_s).collect();
    let x_end = time_axis_end(&medians, c.max_time_s);
    let labels: Vec<&str> = c.rows.iter().map(|r| r.label.as_str()).collect();
    match knob_sweep(&labels) {
        Some((knob, members)) => sweep(&left, c, &knob, &members)?,
        None => accuracy(&left, c, x_end)?,
    }
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
    let palette = colours(c.rows.len());
    let bands: Vec<Vec<(f64, f64, f64, f64)>> =
        c.curves.iter().map(|seeds| band(seeds).into_iter().filter(|p| p.0 <= x_end).collect()).collect();
    for (i, (row, seeds)) in c.rows.iter().zip(&c.curves).enumerate() {
        let colour = palette[i];
        let same = same_curve_as(&bands, i);
        let dashed = same.is_some();
        let label = match same.and_then(|j| c.rows.get(j)) {
            Some(other) => format!("{} (same curve as {})", row.label.trim_end(), other.label.trim_end()),
            None => row.label.clone(),
        };
        let points = bands[i].clone();
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

/// Time to target against the swept knob (`members`: row and knob value), the median with
/// a whisker over the seeds; every other run that reached the target a dashed level line
/// across the sweep.
fn sweep(
    area: &DrawingArea<SVGBackend<'_>, Shift>,
    c: &Comparison,
    knob: &str,
    members: &[(usize, f64)],
) -> DrawResult {
    let palette = colours(c.rows.len());
    let reached: Vec<f64> = c.times_to_target.iter().flatten().flatten().copied().collect();
    let lo = reached.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = reached.iter().copied().fold(0.0f64, f64::max);
    let (lo, hi) = if lo.is_finite() && hi > lo { (lo, hi) } else { (0.0, hi.max(1e-3)) };
    let pad = (hi - lo) * 0.08;
    let (y_lo, y_hi) = ((lo - pad).max(0.0), hi + pad);
    let x_lo = members.iter().map(|m| m.1).fold(f64::INFINITY, f64::min);
    let x_hi = members.iter().map(|m| m.1).fold(f64::NEG_INFINITY, f64::max);
    let x_pad = ((x_hi - x_lo) * 0.04).max(0.5);
    let mut chart = ChartBuilder::on(area)
        .caption(format!("time to target against {knob} (median, whisker over seeds)"), ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(45)
        .y_label_area_size(60)
        .build_cartesian_2d((x_lo - x_pad)..(x_hi + x_pad), y_lo..y_hi)?;
    chart.configure_mesh().x_desc(knob).y_desc("virtual seconds to target").light_line_style(WHITE).draw()?;
    let colour = palette[members[0].0];
    let line: Vec<(f64, f64)> =
        members.iter().filter_map(|&(i, x)| c.rows[i].time_to_target_s.map(|t| (x, t))).collect();
    let stroke = colour.stroke_width(2);
    chart
        .draw_series(LineSeries::new(line.clone(), stroke))?
        .label(knob.to_owned())
        .legend(move |(x, y)| PathElement::new([(x, y), (x + 22, y)], stroke));
    chart.draw_series(line.iter().map(|&p| Circle::new(p, 4, colour.filled())))?;
    for &(i, x) in members {
        let times: Vec<f64> = c.times_to_target[i].iter().flatten().copied().collect();
        if times.len() > 1 {
            let (a, b) =
                (times.iter().copied().fold(f64::INFINITY, f64::min), times.iter().copied().fold(0.0, f64::max));
            chart.draw_series(std::iter::once(PathElement::new([(x, a), (x, b)], colour.stroke_width(1))))?;
        }
    }
    let in_sweep: Vec<usize> = members.iter().map(|m| m.0).collect();
    for (i, row) in c.rows.iter().enumerate().filter(|(i, _)| !in_sweep.contains(i)) {
        let Some(t) = row.time_to_target_s else { continue };
        let stroke = palette[i].stroke_width(2);
        chart
            .draw_series(DashedLineSeries::new([(x_lo - x_pad, t), (x_hi + x_pad, t)], 10, 6, stroke))?
            .label(format!("{} {t:.3} s", row.label.trim_end()))
            .legend(move |(x, y)| plotters::element::DashedPathElement::new([(x, y), (x + 22, y)], 6, 3, stroke));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .label_font(("sans-serif", 13))
        .draw()?;
    Ok(())
}

fn bars(area: &DrawingArea<SVGBackend<'_>, Shift>, c: &Comparison) -> DrawResult {
    let n = c.rows.len();
    let palette = colours(n);
    let longest = bars_axis_end(&c.times_to_target);
    let slowest = longest;
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
        let colour = palette[i];
        let y = (n - 1 - i) as f64;
        let reached: Vec<f64> = times.iter().flatten().copied().collect();
        let mut name = row.label.clone();
        let label_at = slowest * 0.01;
        if row.reference {
            name.push_str(" [reference]");
        }
        match row.time_to_target_s {
            Some(t) => {
                chart.draw_series(std::iter::once(Rectangle::new([(0.0, y + 0.1), (t, y + 0.5)], colour.filled())))?;
                let lo = reached.iter().copied().fold(f64::INFINITY, f64::min);
                let hi = reached.iter().copied().fold(0.0f64, f64::max);
                if reached.len() > 1 {
                    let whisker = BLACK.stroke_width(1);
                    chart.draw_series([
                        PathElement::new([(lo, y + 0.3), (hi, y + 0.3)], whisker),
                        PathElement::new([(lo, y + 0.15), (lo, y + 0.45)], whisker),
                        PathElement::new([(hi, y + 0.15), (hi, y + 0.45)], whisker),
                    ])?;
                }
                name = format!("{name}  {t:.3} s");
            }
            None => name = format!("{name}  not reached"),
        }
        // The label above its bar, so the axis ends at the data.
        chart.draw_series(std::iter::once(Text::new(
            name,
            (label_at, y + 0.75),
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
    let runs: Vec<&str> =
        c.rows.iter().zip(&c.backup_workers).filter(|(_, s)| !s.is_empty()).map(|(r, _)| r.label.trim_end()).collect();
    // One run is named in the caption; several get a legend, with headroom above the
    // highest b_t so that it never covers a line.
    let (caption, headroom) = match runs.as_slice() {
        [one] => (format!("{one}: backup workers b_t over time (seed {})", c.seeds.start), 1.1),
        _ => (format!("DBW: backup workers b_t over time (seed {})", c.seeds.start), 1.6),
    };
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 16))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..x_end, 0.0..(f64::from(most) * headroom + 0.5))?;
    chart.configure_mesh().x_desc("virtual time (s)").y_desc("b_t").light_line_style(WHITE).draw()?;
    let palette = colours(c.rows.len());
    for (i, (row, series)) in c.rows.iter().zip(&c.backup_workers).enumerate() {
        if series.is_empty() {
            continue;
        }
        let colour = palette[i];
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
    if runs.len() > 1 {
        chart.configure_series_labels().position(SeriesLabelPosition::UpperRight).border_style(BLACK).draw()?;
    }
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
    let lo = s.rows.iter().map(|r| finite(r.time.low).min(r.time.mean)).fold(hi, f64::min).max(0.0);
    let (x_lo, x_hi) = interval_axis(lo, hi);
    let n = order.len().max(1);
    let mut chart = ChartBuilder::on(area)
        .caption(
            format!("{name}: {} — seeds {:?}, data seeds {:?}", s.setting.target_note, s.run_seeds, s.split_seeds),
            ("sans-serif", 14),
        )
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(10)
        .build_cartesian_2d(x_lo..x_hi, 0.0..n as f64)?;
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
        let (lo, up) = (finite(r.time.low).max(x_lo), finite(r.time.high).min(x_hi).max(r.time.mean));
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
        let mut text = format!("{}  {} s", r.label, with_uncertainty(r.time.mean, r.time.half_width()));
        if r.reached < r.repeats {
            text.push_str(&format!(" (reached {}/{})", r.reached, r.repeats));
        }
        if Some(i) == s.pick {
            text.push_str("  PICK");
        } else if r.tied {
            text.push_str("  tied");
        }
        // The label above its interval, so the axis spans the data only.
        chart.draw_series(std::iter::once(Text::new(
            text,
            (lo, y + 0.3),
            ("sans-serif", 12).into_font().color(&BLACK).pos(plotters::style::text_anchor::Pos::new(
                plotters::style::text_anchor::HPos::Left,
                plotters::style::text_anchor::VPos::Center,
            )),
        )))?;
    }
    Ok(())
}

/// The horizontal axis of an interval panel: the intervals' span (`lo..hi`) with 5% of it
/// on each side, so intervals of 9 to 12 s are told apart rather than squeezed at the
/// right of an axis from 0.
fn interval_axis(lo: f64, hi: f64) -> (f64, f64) {
    let pad = ((hi - lo) * 0.05).max(hi * 1e-3).max(1e-9);
    ((lo - pad).max(0.0), hi + pad)
}

/// `mean ± half` with the uncertainty to two significant digits (whole numbers at least)
/// and the mean to the same decimal place: `20.16 ± 0.42`, `1530 ± 123`.
fn with_uncertainty(mean: f64, half: f64) -> String {
    if !(half.is_finite() && half > 0.0) {
        return format!("{mean:.3} ± {half}");
    }
    let decimals = (1 - half.log10().floor() as i32).max(0) as usize;
    format!("{mean:.decimals$} ± {half:.decimals$}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uncertainty_has_two_significant_digits() {
        assert_eq!(with_uncertainty(20.156_04, 0.419_3), "20.16 ± 0.42");
        assert_eq!(with_uncertainty(1.234_567, 0.012_34), "1.235 ± 0.012");
        assert_eq!(with_uncertainty(1530.2, 123.0), "1530 ± 123");
        assert_eq!(with_uncertainty(9.87, 4.2), "9.9 ± 4.2");
    }

    #[test]
    fn axes_end_at_the_data() {
        assert_eq!(time_axis_end(&[Some(0.2), None, Some(0.3)], 1.75), 0.3 * 1.25);
        assert_eq!(time_axis_end(&[None, None], 1.75), 1.75);
        let whiskers = vec![vec![Some(0.9), Some(1.2)], vec![None, Some(0.4)]];
        assert!((bars_axis_end(&whiskers) - 1.2 * 1.05).abs() < 1e-12);
        let (a, b) = interval_axis(9.0, 12.0);
        assert!(a > 8.5 && a < 9.0 && b > 12.0 && b < 12.5, "{a}..{b}");
    }

    #[test]
    fn colours_are_unique_for_any_number_of_runs() {
        for n in [1, 12, 13, 17, 40, 100] {
            let c = colours(n);
            for (i, a) in c.iter().enumerate() {
                assert!(!c[i + 1..].contains(a), "{n} runs: colour {i} repeats");
            }
        }
    }

    #[test]
    fn a_one_knob_sweep_is_found_by_its_labels() {
        let labels = ["bsp", "backup b=0", "backup b=1", "backup b=4", "dbw", "ssp s=3"];
        let (knob, members) = knob_sweep(&labels).unwrap();
        assert_eq!(knob, "backup b");
        assert_eq!(members, [(1, 0.0), (2, 1.0), (3, 4.0)]);
        assert!(knob_sweep(&["bsp", "backup b=1", "dbw"]).is_none());
    }

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
}
