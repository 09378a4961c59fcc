//! PNG charts next to the report: plotters' bitmap backend, text in DejaVu Sans (read
//! from the system at run time; without it there are no charts and the report says so).

use std::path::Path;

use plotters::prelude::*;
use plotters::style::FontStyle;

use crate::driver::{RunResult, System};
use crate::report::{Measured, group, point_order, spread};

const FONT_FILES: [&str; 2] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
];

type Chart = Result<Option<String>, String>;

/// (x, y) points of each system's line.
type Lines = Vec<(System, Vec<(f64, f64)>)>;

/// Draws one chart into a file; `None` when the runs have nothing for it.
type Drawing = fn(&Path, &[Measured]) -> Chart;

/// Draws every chart the runs allow into `dir`; returns (title, file name) of each.
pub fn draw(dir: &Path, date: &str, runs: &[Measured]) -> Result<Vec<(String, String)>, String> {
    let font = FONT_FILES
        .iter()
        .find_map(|path| std::fs::read(path).ok())
        .ok_or("no DejaVu Sans font (Debian package fonts-dejavu-core)")?;
    // plotters keeps registered fonts for the life of the process.
    let font: &'static [u8] = Box::leak(font.into_boxed_slice());
    plotters::style::register_font("sans-serif", FontStyle::Normal, font)
        .map_err(|_| "DejaVu Sans did not load")?;
    std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
    let mut charts = Vec::new();
    let drawings: [(&str, &str, Drawing); 3] = [
        (
            "Throughput vs commit interval",
            "throughput-commit-interval",
            throughput_vs_interval,
        ),
        ("Latency percentiles", "latency", latency),
        ("Peak RSS", "rss", rss),
    ];
    for (title, stem, draw) in drawings {
        let file = format!("{date}-{stem}.png");
        if let Some(file) = draw(&dir.join(&file), runs)? {
            charts.push((title.to_owned(), file));
        }
    }
    Ok(charts)
}

fn colour(system: System) -> RGBColor {
    match system {
        System::Raw => RGBColor(80, 80, 80),
        System::RawTransactional => RGBColor(150, 150, 150),
        System::AtMostOnce => RGBColor(120, 180, 240),
        System::AtLeastOnce => RGBColor(40, 110, 200),
        System::ExactlyOnce => RGBColor(10, 40, 140),
        System::Streams => RGBColor(220, 90, 30),
        System::RustStream => RGBColor(60, 160, 90),
    }
}

fn median(runs: &[&Measured], pick: impl Fn(&RunResult) -> Option<f64>) -> Option<f64> {
    let values: Vec<f64> = runs.iter().filter_map(|r| pick(&r.result)).collect();
    (!values.is_empty()).then(|| spread(&values)[1])
}

/// One line with its points per system, and the legend.
fn plot_lines<'a, X, Y>(
    chart: &mut ChartContext<'a, BitMapBackend<'a>, Cartesian2d<X, Y>>,
    lines: Lines,
) -> Result<(), String>
where
    X: Ranged<ValueType = f64>,
    Y: Ranged<ValueType = f64>,
{
    for (system, points) in lines {
        let style = colour(system).stroke_width(3);
        chart
            .draw_series(LineSeries::new(points.clone(), style))
            .map_err(|e| e.to_string())?
            .label(system.label())
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], style));
        chart
            .draw_series(
                points
                    .iter()
                    .map(|&p| Circle::new(p, 4, colour(system).filled())),
            )
            .map_err(|e| e.to_string())?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()
        .map_err(|e| e.to_string())
}

fn file_name(path: &Path) -> Option<String> {
    Some(path.file_name()?.to_string_lossy().into_owned())
}

fn throughput_vs_interval(path: &Path, runs: &[Measured]) -> Chart {
    let groups = group(runs, "commit interval");
    if groups.is_empty() {
        return Ok(None);
    }
    let mut lines: Lines = Vec::new();
    for system in System::ALL {
        let mut points: Vec<(f64, f64)> = groups
            .iter()
            .filter(|((_, s), _)| *s == system)
            .filter_map(|((point, _), runs)| {
                Some((
                    point_order(point) as f64,
                    median(runs, |r| Some(r.throughput))?,
                ))
            })
            .collect();
        points.sort_by(|a, b| a.0.total_cmp(&b.0));
        if !points.is_empty() {
            lines.push((system, points));
        }
    }
    let x_max = lines
        .iter()
        .flat_map(|(_, p)| p)
        .map(|p| p.0)
        .fold(10.0, f64::max);
    let x_min = lines
        .iter()
        .flat_map(|(_, p)| p)
        .map(|p| p.0)
        .fold(x_max, f64::min);
    let y_max = lines
        .iter()
        .flat_map(|(_, p)| p)
        .map(|p| p.1)
        .fold(1.0, f64::max);
    let root = BitMapBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let mut chart = ChartBuilder::on(&root)
        .caption("Throughput vs commit interval", ("sans-serif", 24))
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(80)
        .build_cartesian_2d(
            (x_min.max(1.0) * 0.8..x_max * 1.25).log_scale(),
            0.0..y_max * 1.1,
        )
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .x_desc("commit interval (ms, log scale)")
        .y_desc("input events/s (median)")
        .draw()
        .map_err(|e| e.to_string())?;
    plot_lines(&mut chart, lines)?;
    root.present().map_err(|e| e.to_string())?;
    Ok(file_name(path))
}

fn latency(path: &Path, runs: &[Measured]) -> Chart {
    let groups = group(runs, "main");
    let mut lines: Lines = Vec::new();
    for system in System::ALL {
        let Some(runs) = groups.get(&(String::new(), system)) else {
            continue;
        };
        let points: Vec<(f64, f64)> = (0..3)
            .filter_map(|i| Some((i as f64, median(runs, |r| r.latency_ms.map(|l| l[i]))?)))
            .collect();
        if !points.is_empty() {
            lines.push((system, points));
        }
    }
    if lines.is_empty() {
        return Ok(None);
    }
    let y_max = lines
        .iter()
        .flat_map(|(_, p)| p)
        .map(|p| p.1)
        .fold(1.0, f64::max);
    let y_min = lines
        .iter()
        .flat_map(|(_, p)| p)
        .map(|p| p.1)
        .fold(y_max, f64::min);
    let root = BitMapBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "End-to-end latency (send → visible under read_committed)",
            ("sans-serif", 22),
        )
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(80)
        .build_cartesian_2d(-0.2..2.2, (y_min.max(0.1) * 0.7..y_max * 1.5).log_scale())
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .x_labels(3)
        .x_label_formatter(&|x: &f64| match x.round() as i64 {
            0 => "p50".into(),
            1 => "p99".into(),
            2 => "p99.9".into(),
            _ => String::new(),
        })
        .y_desc("ms (median of repeats, log scale)")
        .draw()
        .map_err(|e| e.to_string())?;
    plot_lines(&mut chart, lines)?;
    root.present().map_err(|e| e.to_string())?;
    Ok(file_name(path))
}

fn rss(path: &Path, runs: &[Measured]) -> Chart {
    let groups = group(runs, "main");
    let bars: Vec<(System, f64)> = System::ALL
        .into_iter()
        .filter_map(|system| {
            let runs = groups.get(&(String::new(), system))?;
            Some((system, median(runs, |r| Some(r.usage.peak_rss_mib))?))
        })
        .collect();
    if bars.is_empty() {
        return Ok(None);
    }
    let y_max = bars.iter().map(|b| b.1).fold(64.0, f64::max);
    let root = BitMapBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let mut chart = ChartBuilder::on(&root)
        .caption("Peak RSS of the processor at full load", ("sans-serif", 24))
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(80)
        .build_cartesian_2d(0.0..bars.len() as f64, 0.0..y_max * 1.15)
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(0)
        .y_desc("MiB (median of repeats)")
        .draw()
        .map_err(|e| e.to_string())?;
    for (i, (system, mib)) in bars.iter().enumerate() {
        let x = i as f64;
        chart
            .draw_series([Rectangle::new(
                [(x + 0.15, 0.0), (x + 0.85, *mib)],
                colour(*system).filled(),
            )])
            .map_err(|e| e.to_string())?
            .label(format!("{} ({mib:.1} MiB)", system.label()))
            .legend(move |(x, y)| {
                Rectangle::new([(x, y - 5), (x + 14, y + 5)], colour(*system).filled())
            });
    }
    chart
        .draw_series(LineSeries::new(
            [(0.0, 64.0), (bars.len() as f64, 64.0)],
            RED.stroke_width(2),
        ))
        .map_err(|e| e.to_string())?
        .label("64 MiB target")
        .legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], RED.stroke_width(2)));
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(|e| e.to_string())?;
    root.present().map_err(|e| e.to_string())?;
    Ok(file_name(path))
}
