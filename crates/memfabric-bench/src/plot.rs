//! PNG plots (plotters, bitmap backend). Text is drawn with ab_glyph from a TrueType font
//! found on the system at run time, so no fontconfig/freetype is needed to build.

use hdrhistogram::Histogram;
use plotters::prelude::*;
use plotters::style::FontStyle;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum PlotError {
    #[error("no TrueType font found (looked in {0}); install fonts-dejavu-core or pass --no-plot")]
    NoFont(String),
    #[error("drawing {path}: {msg}")]
    Draw { path: String, msg: String },
    #[error("nothing to plot")]
    Empty,
}

/// Fonts tried in order; DejaVu ships with Debian's fontconfig.
const FONT_CANDIDATES: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/usr/share/fonts/truetype/freefont/FreeSans.ttf",
];

const FONT: &str = "sans-serif";

fn ensure_font() -> Result<(), PlotError> {
    static LOADED: OnceLock<bool> = OnceLock::new();
    let ok = *LOADED.get_or_init(|| {
        let env = std::env::var("MEMFABRIC_BENCH_FONT")
            .ok()
            .map(PathBuf::from);
        let paths = env
            .into_iter()
            .chain(FONT_CANDIDATES.iter().map(PathBuf::from));
        for p in paths {
            if let Ok(bytes) = std::fs::read(&p) {
                // plotters keeps fonts for the life of the process: leak the bytes once.
                let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
                if plotters::style::register_font(FONT, FontStyle::Normal, bytes).is_ok() {
                    return true;
                }
            }
        }
        false
    });
    if ok {
        Ok(())
    } else {
        Err(PlotError::NoFont(FONT_CANDIDATES.join(", ")))
    }
}

fn draw_err<E: std::fmt::Display>(path: &Path) -> impl Fn(E) -> PlotError + '_ {
    move |e| PlotError::Draw {
        path: path.display().to_string(),
        msg: e.to_string(),
    }
}

/// Colours by series index, readable on white.
fn colour(i: usize) -> RGBColor {
    // The first six as before; four more so that two transports x get/set x p50/p99 (eight
    // lines) never share a colour.
    const C: [RGBColor; 10] = [
        RGBColor(31, 119, 180),
        RGBColor(214, 39, 40),
        RGBColor(44, 160, 44),
        RGBColor(148, 103, 189),
        RGBColor(255, 127, 14),
        RGBColor(23, 190, 207),
        RGBColor(140, 86, 75),
        RGBColor(227, 119, 194),
        RGBColor(127, 127, 127),
        RGBColor(188, 189, 34),
    ];
    C[i % C.len()]
}

/// Points of a latency percentile curve: x = "nines" (0 = p0, 1 = p90, 2 = p99, 3 = p99.9,
/// 4 = p99.99), y = latency in microseconds.
pub fn percentile_curve(h: &Histogram<u64>) -> Vec<(f64, f64)> {
    if h.is_empty() {
        return Vec::new();
    }
    (0..=80)
        .map(|i| {
            let nines = f64::from(i) * 0.05;
            let q = 1.0 - 10f64.powf(-nines);
            (nines, h.value_at_quantile(q) as f64 / 1000.0)
        })
        .collect()
}

fn nines_label(x: &f64) -> String {
    let p = 100.0 * (1.0 - 10f64.powf(-x));
    match x.round() as i64 {
        0 => "p0".into(),
        1 => "p90".into(),
        2 => "p99".into(),
        3 => "p99.9".into(),
        4 => "p99.99".into(),
        _ => format!("p{p:.3}"),
    }
}

/// One panel: a title and named curves.
pub struct Panel {
    pub title: String,
    pub series: Vec<(String, Vec<(f64, f64)>)>,
}

/// Latency-by-percentile curves, one panel per value size, side by side.
pub fn latency_percentiles(path: &Path, title: &str, panels: &[Panel]) -> Result<(), PlotError> {
    ensure_font()?;
    if panels.is_empty() {
        return Err(PlotError::Empty);
    }
    let width = 560 * panels.len() as u32;
    let root = BitMapBackend::new(path, (width.max(640), 480)).into_drawing_area();
    root.fill(&WHITE).map_err(draw_err(path))?;
    let root = root.titled(title, (FONT, 22)).map_err(draw_err(path))?;
    let areas = root.split_evenly((1, panels.len()));
    for (panel, area) in panels.iter().zip(areas.iter()) {
        let ys = panel
            .series
            .iter()
            .flat_map(|(_, pts)| pts.iter().map(|p| p.1));
        let (lo, hi) = ys.fold((f64::MAX, 0f64), |(lo, hi), y| (lo.min(y), hi.max(y)));
        if hi <= 0.0 {
            continue;
        }
        let lo = (lo.max(0.1) * 0.8).min(hi / 2.0);
        let mut chart = ChartBuilder::on(area)
            .caption(&panel.title, (FONT, 18))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(0f64..4f64, (lo..hi * 1.25).log_scale())
            .map_err(draw_err(path))?;
        chart
            .configure_mesh()
            .x_labels(5)
            .y_labels(12)
            .x_label_formatter(&nines_label)
            .y_desc("latency (us, log)")
            .y_label_formatter(&us_label)
            .x_desc("percentile")
            .label_style((FONT, 14))
            .draw()
            .map_err(draw_err(path))?;
        for (i, (name, pts)) in panel.series.iter().enumerate() {
            let c = colour(i);
            chart
                .draw_series(LineSeries::new(pts.iter().copied(), c.stroke_width(2)))
                .map_err(draw_err(path))?
                .label(name.as_str())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2))
                });
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .label_font((FONT, 14))
            .draw()
            .map_err(draw_err(path))?;
    }
    root.present().map_err(draw_err(path))?;
    Ok(())
}

/// One panel of bars: a title, the y axis description and (label, value) per bar.
pub struct BarPanel {
    pub title: String,
    pub y_desc: String,
    pub bars: Vec<(String, f64)>,
}

/// Bar charts side by side, one per panel, each bar labelled with its value.
pub fn bars(path: &Path, title: &str, panels: &[BarPanel]) -> Result<(), PlotError> {
    ensure_font()?;
    if panels.iter().all(|p| p.bars.is_empty()) {
        return Err(PlotError::Empty);
    }
    // Wide enough per bar that names like "memfabricd-flash-ucx" do not run together.
    let most = panels.iter().map(|p| p.bars.len()).max().unwrap_or(1) as u32;
    let width = (150 * most).max(520) * panels.len() as u32;
    let root = BitMapBackend::new(path, (width.max(640), 480)).into_drawing_area();
    root.fill(&WHITE).map_err(draw_err(path))?;
    let root = root.titled(title, (FONT, 22)).map_err(draw_err(path))?;
    let areas = root.split_evenly((1, panels.len()));
    for (panel, area) in panels.iter().zip(areas.iter()) {
        let n = panel.bars.len();
        let hi = panel.bars.iter().fold(0f64, |m, b| m.max(b.1));
        if n == 0 {
            continue;
        }
        // Room above the tallest bar for its value.
        let yhi = if hi > 0.0 { hi * 1.2 } else { 1.0 };
        let names: Vec<String> = panel.bars.iter().map(|b| b.0.clone()).collect();
        let x_label = |x: &f64| {
            let i = x.round();
            // Ticks fall between bars too; only a bar's centre gets its name.
            if (x - i).abs() < 0.01 && i >= 0.0 {
                names.get(i as usize).cloned().unwrap_or_default()
            } else {
                String::new()
            }
        };
        let mut chart = ChartBuilder::on(area)
            .caption(&panel.title, (FONT, 18))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(-0.5f64..(n as f64 - 0.5), 0f64..yhi)
            .map_err(draw_err(path))?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(2 * n + 1)
            .x_label_formatter(&x_label)
            .y_desc(panel.y_desc.as_str())
            .y_labels(10)
            .label_style((FONT, 13))
            .draw()
            .map_err(draw_err(path))?;
        for (i, (_, v)) in panel.bars.iter().enumerate() {
            let x = i as f64;
            let c = colour(i);
            chart
                .draw_series(std::iter::once(Rectangle::new(
                    [(x - 0.35, 0.0), (x + 0.35, *v)],
                    c.filled(),
                )))
                .map_err(draw_err(path))?;
            chart
                .draw_series(std::iter::once(Text::new(
                    value_label(*v),
                    (x - 0.2, *v + yhi * 0.06),
                    (FONT, 14),
                )))
                .map_err(draw_err(path))?;
        }
    }
    root.present().map_err(draw_err(path))?;
    Ok(())
}

/// A bar's value: three significant digits or so.
fn value_label(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}

/// Latency against message size (log2 x axis), one line per named series.
pub fn latency_vs_size(
    path: &Path,
    title: &str,
    series: &[(String, Vec<(usize, f64)>)],
) -> Result<(), PlotError> {
    lines_log2_x(
        path,
        title,
        ("value size (bytes, log2)", "latency (us, log)"),
        YAxis::Log,
        series,
    )
}

/// How [`lines_log2_x`] scales y.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum YAxis {
    /// Logarithmic, from a little under the smallest value (latencies).
    Log,
    /// Linear from zero (throughput).
    LinearFromZero,
}

/// Lines over a log2 x axis (sizes, client counts: powers of two), one per named series;
/// `desc` is the (x, y) axis descriptions.
pub fn lines_log2_x(
    path: &Path,
    title: &str,
    desc: (&str, &str),
    y_axis: YAxis,
    series: &[(String, Vec<(usize, f64)>)],
) -> Result<(), PlotError> {
    let (x_desc, y_desc) = desc;
    ensure_font()?;
    let xs = series.iter().flat_map(|(_, p)| p.iter().map(|q| q.0));
    let (xmin, xmax) = xs.fold((usize::MAX, 0usize), |(a, b), x| (a.min(x), b.max(x)));
    let ys = series.iter().flat_map(|(_, p)| p.iter().map(|q| q.1));
    let (ymin, ymax) = ys.fold((f64::MAX, 0f64), |(a, b), y| (a.min(y), b.max(y)));
    if xmax == 0 || ymax <= 0.0 {
        return Err(PlotError::Empty);
    }
    let root = BitMapBackend::new(path, (800, 500)).into_drawing_area();
    root.fill(&WHITE).map_err(draw_err(path))?;
    // x is log2(size) on a linear axis, so ticks fall on powers of two (1, 2, 4, ... 1K).
    let xlo = (xmin.max(1) as f64).log2().floor() - 0.5;
    let xhi = (xmax.max(1) as f64).log2().ceil() + 0.5;
    // y is drawn on a linear axis; a log axis plots log10(y) and labels ticks with 10^tick,
    // so both scales share one chart type.
    let to_axis = |y: f64| match y_axis {
        YAxis::Log => y.max(1e-3).log10(),
        YAxis::LinearFromZero => y,
    };
    let (ylo, yhi) = match y_axis {
        YAxis::Log => (
            to_axis((ymin.max(0.1) * 0.8).min(ymax / 2.0)),
            to_axis(ymax * 1.3),
        ),
        YAxis::LinearFromZero => (0.0, ymax * 1.15),
    };
    let y_label = |v: &f64| match y_axis {
        YAxis::Log => us_label(&10f64.powf(*v)),
        YAxis::LinearFromZero => us_label(v),
    };
    let mut chart = ChartBuilder::on(&root)
        .caption(title, (FONT, 22))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(65)
        .build_cartesian_2d(xlo..xhi, ylo..yhi)
        .map_err(draw_err(path))?;
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc(y_desc)
        .x_labels((xhi - xlo).ceil() as usize + 1)
        .y_labels(12)
        .y_label_formatter(&y_label)
        .x_label_formatter(&|x| size_label(2f64.powf(x.round())))
        .label_style((FONT, 14))
        .draw()
        .map_err(draw_err(path))?;
    for (i, (name, pts)) in series.iter().enumerate() {
        let c = colour(i);
        let pts: Vec<(f64, f64)> = pts
            .iter()
            .map(|&(x, y)| ((x.max(1) as f64).log2(), to_axis(y)))
            .collect();
        chart
            .draw_series(LineSeries::new(pts.iter().copied(), c.stroke_width(2)))
            .map_err(draw_err(path))?
            .label(name.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2)));
        chart
            .draw_series(pts.iter().map(|&p| Circle::new(p, 3, c.filled())))
            .map_err(draw_err(path))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font((FONT, 14))
        .draw()
        .map_err(draw_err(path))?;
    root.present().map_err(draw_err(path))?;
    Ok(())
}

fn size_label(x: f64) -> String {
    if x >= 1024.0 * 1024.0 {
        format!("{:.0}M", x / (1024.0 * 1024.0))
    } else if x >= 1024.0 {
        format!("{:.0}K", x / 1024.0)
    } else {
        format!("{x:.0}")
    }
}

fn us_label(y: &f64) -> String {
    if *y >= 10.0 {
        format!("{y:.0}")
    } else {
        format!("{y:.1}")
    }
}
