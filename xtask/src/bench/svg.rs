//! The latency plot, written by hand as SVG (no plotting crate).
//!
//! One solid curve per case: fio's completion-latency percentiles (fio prints
//! 17 of them, 1 … 99.99 %), x = latency in µs on a log scale, y = percentile
//! on a "nines" scale (`-log10(1 - p)`: 0, 90, 99, 99.9, 99.99 % are evenly
//! spaced), which is where schedulers differ: the tail. When the hypervisor
//! printed its kick→schedule-in histogram, the same colour dashed shows that
//! distribution (points at bucket upper bounds, i.e. an upper estimate).

use super::aggregate::Summary;
use std::fmt::Write as _;

const W: f64 = 860.0;
const PLOT_H: f64 = 420.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 50.0;
const LEGEND_ROW: f64 = 18.0;
/// The highest percentile drawn (fio's highest default percentile).
const MAX_NINES: f64 = 4.0;

const COLORS: [&str; 10] =
    ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"];

fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// `-log10(1 - p/100)`, capped at [`MAX_NINES`].
fn nines(p: f64) -> f64 {
    let f = 1.0 - p / 100.0;
    if f <= 0.0 {
        MAX_NINES
    } else {
        (-f.log10()).clamp(0.0, MAX_NINES)
    }
}

/// The kick→run histogram as (percent, µs) points: for each non-empty
/// bucket, its lower bound at the share below it and its upper bound at the
/// share up to it (both clamped to the exact min/max), so the curve is
/// drawn straight within a bucket and never claims more precision than the
/// log2 buckets have. The top share is placed at `(count - 0.5) / count`
/// (100 % is off the nines scale).
fn kick_points(s: &Summary) -> Vec<(f64, f64)> {
    let Some(h) = s.kick_to_run.as_ref().filter(|h| h.count() > 0) else { return Vec::new() };
    let n = h.count() as f64;
    let (min, max) = (h.min().unwrap_or(0), h.max().unwrap_or(0));
    let share = |seen: u64| if seen >= h.count() { 100.0 * (n - 0.5) / n } else { 100.0 * seen as f64 / n };
    let mut pts = Vec::new();
    let mut seen = 0u64;
    for i in 0..hypervisor::stats::NR_BUCKETS {
        let c = h.bucket(i);
        if c == 0 {
            continue;
        }
        let (lo, hi) = hypervisor::stats::Log2Histogram::bucket_range(i).unwrap_or((0, 0));
        pts.push((share(seen), lo.clamp(min, max) as f64 / 1000.0));
        seen += c;
        pts.push((share(seen), hi.clamp(min, max) as f64 / 1000.0));
    }
    pts
}

/// A case, its clat percentile points and its kick→schedule-in points, as
/// (percentile, µs).
type Curve<'a> = (&'a Summary, Vec<(f64, f64)>, Vec<(f64, f64)>);

/// The percentile axis' ticks and labels.
const PTICKS: [(f64, &str); 6] =
    [(0.0, "0%"), (50.0, "50%"), (90.0, "90%"), (99.0, "99%"), (99.9, "99.9%"), (99.99, "99.99%")];

/// Where a point goes: latency across on a log scale over the whole decades
/// `x0..=x1`, percentile up in nines.
struct Scale {
    x0: f64,
    x1: f64,
}

impl Scale {
    fn px(&self, us: f64) -> f64 {
        let pw = W - LEFT - RIGHT;
        LEFT + (us.max(10f64.powf(self.x0)).log10() - self.x0) / (self.x1 - self.x0) * pw
    }

    fn py(&self, p: f64) -> f64 {
        TOP + PLOT_H - nines(p) / MAX_NINES * PLOT_H
    }
}

/// The SVG document (one `<polyline class="clat">` per case with
/// percentiles, one `class="kick"` per case with a histogram).
pub fn latency_plot(summaries: &[Summary]) -> String {
    let curves: Vec<Curve> = summaries
        .iter()
        .map(|s| {
            let clat: Vec<(f64, f64)> = s
                .fio
                .clat_percentiles_us
                .iter()
                .copied()
                .filter(|&(p, v)| p < 100.0 && v > 0.0 && v.is_finite())
                .collect();
            (s, clat, kick_points(s))
        })
        .collect();

    let scale = x_scale(&curves);
    let has_kick = curves.iter().any(|c| !c.2.is_empty());
    let legend_rows = curves.len() + usize::from(has_kick);
    let h = TOP + PLOT_H + BOTTOM + LEGEND_ROW * legend_rows as f64 + 10.0;

    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{h}" viewBox="0 0 {W} {h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="{W}" height="{h}" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{}" y="22" text-anchor="middle" font-size="15">fio completion latency per case (solid){}</text>"#,
        W / 2.0,
        if has_kick { "; hypervisor kick→schedule-in (dashed)" } else { "" }
    );
    plot_grid(&mut s, &scale);
    plot_axis_labels(&mut s, &scale);
    plot_curves(&mut s, &scale, &curves);
    plot_legend(&mut s, &curves, has_kick);
    s.push_str("</svg>\n");
    s
}

/// The latency axis: whole decades around every point.
fn x_scale(curves: &[Curve]) -> Scale {
    let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
    for (_, a, b) in curves {
        for &(_, v) in a.iter().chain(b.iter()).filter(|p| p.1 > 0.0) {
            lo = lo.min(v);
            hi = hi.max(v);
        }
    }
    if !lo.is_finite() {
        (lo, hi) = (1.0, 10_000.0);
    }
    let x0 = lo.log10().floor();
    let x1 = (hi.log10().ceil()).max(x0 + 1.0);
    Scale { x0, x1 }
}

/// The grid lines (every 1..9 × decade across, every percentile tick up)
/// and the two axes.
fn plot_grid(s: &mut String, scale: &Scale) {
    let (x0, x1) = (scale.x0, scale.x1);
    let _ = writeln!(s, r##"<g stroke="#ddd" stroke-width="1">"##);
    let mut d = x0;
    while d <= x1 + 1e-9 {
        for k in 1..10 {
            let v = 10f64.powf(d) * k as f64;
            if v > 10f64.powf(x1) * 1.0001 {
                break;
            }
            let x = scale.px(v);
            let _ = writeln!(
                s,
                r#"<line x1="{x:.1}" y1="{TOP}" x2="{x:.1}" y2="{}"{}/>"#,
                TOP + PLOT_H,
                if k == 1 { "" } else { r#" stroke-opacity="0.4""# }
            );
        }
        d += 1.0;
    }
    for (p, _) in PTICKS {
        let y = scale.py(p);
        let _ = writeln!(s, r#"<line x1="{LEFT}" y1="{y:.1}" x2="{}" y2="{y:.1}"/>"#, W - RIGHT);
    }
    let _ = writeln!(s, "</g>");
    let _ = writeln!(
        s,
        r##"<g stroke="#000" stroke-width="1"><line x1="{LEFT}" y1="{b}" x2="{r}" y2="{b}"/><line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{b}"/></g>"##,
        b = TOP + PLOT_H,
        r = W - RIGHT
    );
}

/// The decade labels, the percentile labels and the axis titles.
fn plot_axis_labels(s: &mut String, scale: &Scale) {
    let (x0, x1) = (scale.x0, scale.x1);
    let pw = W - LEFT - RIGHT;
    let _ = writeln!(s, r#"<g text-anchor="middle">"#);
    let mut d = x0;
    while d <= x1 + 1e-9 {
        let v = 10f64.powf(d);
        let label = if v >= 1000.0 { format!("{} ms", v / 1000.0) } else { format!("{v} µs") };
        let _ = writeln!(s, r#"<text x="{:.1}" y="{}">{}</text>"#, scale.px(v), TOP + PLOT_H + 16.0, esc(&label));
        d += 1.0;
    }
    let _ = writeln!(s, r#"<text x="{}" y="{}">latency (log scale)</text>"#, LEFT + pw / 2.0, TOP + PLOT_H + 34.0);
    let _ = writeln!(s, "</g>");
    let _ = writeln!(s, r#"<g text-anchor="end">"#);
    for (p, label) in PTICKS {
        let _ = writeln!(s, r#"<text x="{}" y="{:.1}">{label}</text>"#, LEFT - 6.0, scale.py(p) + 4.0);
    }
    let _ = writeln!(s, "</g>");
    let _ = writeln!(
        s,
        r#"<text transform="translate(16,{}) rotate(-90)" text-anchor="middle">percentile</text>"#,
        TOP + PLOT_H / 2.0
    );
}

/// One solid clat polyline per case, and a dashed kick polyline for each
/// case with a histogram, in the case's color.
fn plot_curves(s: &mut String, scale: &Scale, curves: &[Curve]) {
    for (i, (sum, clat, kick)) in curves.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let pts = |v: &[(f64, f64)]| {
            v.iter().map(|&(p, us)| format!("{:.1},{:.1}", scale.px(us), scale.py(p))).collect::<Vec<_>>().join(" ")
        };
        let _ = writeln!(
            s,
            r#"<polyline class="clat" fill="none" stroke="{color}" stroke-width="2" points="{}"><title>{}</title></polyline>"#,
            pts(clat),
            esc(&sum.case.to_string())
        );
        if !kick.is_empty() {
            let _ = writeln!(
                s,
                r#"<polyline class="kick" fill="none" stroke="{color}" stroke-width="1.5" stroke-dasharray="5,4" points="{}"><title>{} kick→schedule-in</title></polyline>"#,
                pts(kick),
                esc(&sum.case.to_string())
            );
        }
    }
}

/// The legend below the plot: a row per case (p99 and IOPS), and one for
/// the dashed lines when there are any.
fn plot_legend(s: &mut String, curves: &[Curve], has_kick: bool) {
    let mut y = TOP + PLOT_H + BOTTOM + 8.0;
    for (i, (sum, _, _)) in curves.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let _ = writeln!(
            s,
            r#"<line x1="{LEFT}" y1="{y:.1}" x2="{}" y2="{y:.1}" stroke="{color}" stroke-width="2"/><text x="{}" y="{:.1}">{} (p99 {:.0} µs, {:.0} IOPS)</text>"#,
            LEFT + 30.0,
            LEFT + 38.0,
            y + 4.0,
            esc(&sum.case.to_string()),
            sum.fio.clat_p99_us,
            sum.fio.iops
        );
        y += LEGEND_ROW;
    }
    if has_kick {
        let _ = writeln!(
            s,
            r##"<line x1="{LEFT}" y1="{y:.1}" x2="{}" y2="{y:.1}" stroke="#000" stroke-width="1.5" stroke-dasharray="5,4"/><text x="{}" y="{:.1}">dashed: kick→schedule-in of the fio vCPU (log2 buckets)</text>"##,
            LEFT + 30.0,
            LEFT + 38.0,
            y + 4.0
        );
    }
}
