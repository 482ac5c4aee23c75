//! SVG plots of test accuracy against time, one line per run.

use crate::sim::CurvePoint;
use plotters::prelude::*;
use std::path::Path;

/// Draws `curves` (label, points) into an SVG file at `path`.
pub fn accuracy_svg(path: &Path, title: &str, curves: &[(String, Vec<CurvePoint>)], target: f64) -> Result<(), String> {
    let fail = |e: &dyn std::fmt::Display| format!("{}: cannot draw the plot: {e}", path.display());
    let max_t = curves.iter().flat_map(|(_, c)| c.iter().map(|p| p.time_s)).fold(0.0f64, f64::max).max(1e-3);
    let min_acc = curves.iter().flat_map(|(_, c)| c.iter().map(|p| p.accuracy)).fold(1.0f64, f64::min).clamp(0.0, 0.8);
    let root = SVGBackend::new(path, (1000, 650)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| fail(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..max_t, min_acc..1.0)
        .map_err(|e| fail(&e))?;
    chart.configure_mesh().x_desc("virtual time (s)").y_desc("test accuracy").draw().map_err(|e| fail(&e))?;
    chart
        .draw_series(LineSeries::new([(0.0, target), (max_t, target)], BLACK.mix(0.3)))
        .map_err(|e| fail(&e))?
        .label(format!("target {target:.2}"))
        .legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], BLACK.mix(0.3)));
    for (i, (label, points)) in curves.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        chart
            .draw_series(LineSeries::new(
                points.iter().map(|p| (p.time_s, p.accuracy.max(min_acc))),
                color.stroke_width(2),
            ))
            .map_err(|e| fail(&e))?
            .label(label.clone())
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], color.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(|e| fail(&e))?;
    root.present().map_err(|e| fail(&e))
}
