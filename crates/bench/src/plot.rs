//! SVG plots: throughput and p99 latency against concurrency (log axis), one line per run.

use crate::report::{ReportError, RunReport};
use plotters::prelude::*;
use std::path::Path;

/// One run to draw, with its legend label.
pub struct Series<'a> {
    pub label: String,
    pub run: &'a RunReport,
}

/// Draws throughput (top) and p99 latency (bottom) against concurrency.
pub fn plot_sweep(series: &[Series<'_>], path: &Path) -> Result<(), ReportError> {
    draw(series, path).map_err(|e| ReportError::Plot(format!("{}: {e}", path.display())))
}

type Points = Vec<(f64, f64)>;

fn points(run: &RunReport) -> (Points, Points) {
    let ok = run.levels.iter().filter(|l| l.stats.ok > 0);
    let c = |l: &crate::report::LevelReport| l.stats.concurrency as f64;
    (
        ok.clone()
            .map(|l| (c(l), l.stats.throughput_tok_s))
            .collect(),
        ok.map(|l| (c(l), l.stats.latency_s.p99)).collect(),
    )
}

fn draw(series: &[Series<'_>], path: &Path) -> Result<(), Box<dyn std::error::Error>> {
    let data: Vec<(&str, Points, Points)> = series
        .iter()
        .map(|s| {
            let (thr, lat) = points(s.run);
            (s.label.as_str(), thr, lat)
        })
        .collect();
    let all = || data.iter().flat_map(|(_, t, l)| t.iter().chain(l.iter()));
    let x_max = all().map(|p| p.0).fold(1.0, f64::max) * 1.3;
    let x_min = all().map(|p| p.0).fold(f64::INFINITY, f64::min).min(1.0) / 1.3;
    let thr_max = data
        .iter()
        .flat_map(|d| d.1.iter().map(|p| p.1))
        .fold(1.0, f64::max)
        * 1.1;
    let lat_max = data
        .iter()
        .flat_map(|d| d.2.iter().map(|p| p.1))
        .fold(0.1, f64::max)
        * 1.1;

    let root = SVGBackend::new(path, (960, 800)).into_drawing_area();
    root.fill(&WHITE)?;
    let (top, bottom) = root.split_vertically(400);
    let panels = [
        (
            &top,
            "Throughput vs concurrency",
            "aggregate throughput (tok/s)",
            thr_max,
            true,
        ),
        (
            &bottom,
            "p99 latency vs concurrency",
            "p99 end-to-end latency (s)",
            lat_max,
            false,
        ),
    ];
    for (area, title, y_desc, y_max, is_throughput) in panels {
        let mut chart = ChartBuilder::on(area)
            .caption(title, ("sans-serif", 22))
            .margin(15)
            .x_label_area_size(45)
            .y_label_area_size(70)
            .build_cartesian_2d((x_min..x_max).log_scale(), 0.0..y_max)?;
        chart
            .configure_mesh()
            .x_desc("concurrency (log scale)")
            .y_desc(y_desc)
            .light_line_style(WHITE)
            .x_label_formatter(&|x| format!("{x:.0}"))
            .draw()?;
        for (i, (label, thr, lat)) in data.iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            let pts = if is_throughput { thr } else { lat };
            chart
                .draw_series(LineSeries::new(pts.iter().copied(), color.stroke_width(2)))?
                .label(*label)
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
                });
            chart.draw_series(pts.iter().map(|&p| Circle::new(p, 4, color.filled())))?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()?;
    }
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn svg_has_both_panels_axes_and_legend() {
        let mut report = crate::report::tests_support::sample_report();
        report.levels.push(report.levels[0].clone());
        report.levels[1].stats.concurrency = 8;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sweep.svg");
        plot_sweep(
            &[
                Series {
                    label: "baseline".into(),
                    run: &report,
                },
                Series {
                    label: "candidate".into(),
                    run: &report,
                },
            ],
            &path,
        )
        .unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(svg.starts_with("<svg"));
        for text in [
            "Throughput vs concurrency",
            "p99 latency vs concurrency",
            "concurrency (log scale)",
            "baseline",
            "candidate",
        ] {
            assert!(svg.contains(text), "missing {text}");
        }
    }
}
