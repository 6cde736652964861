//! Presenting a full comparison ([`SuiteResult`]): text tables for the terminal, Markdown for
//! docs/benchmarks.md (spliced between markers so hand-written parts of the page survive),
//! and PNG plots.

use crate::compare::{CellResult, LatencyRow, SuiteResult};
use crate::metrics::{human, RunSummary};
use crate::plot::{self, Panel, PlotError};
use crate::report::{latency_and_hit_cells, table, Machine};
use std::path::{Path, PathBuf};

/// The generated part of a page starts and ends with these lines.
pub const BEGIN_MARKER: &str = "<!-- compare-report:begin -->";
pub const END_MARKER: &str = "<!-- compare-report:end -->";

/// Byte offset of the first line of `doc` that is exactly `marker` (a marker quoted in prose,
/// inside a longer line, does not count), searching from `from`.
fn marker_line(doc: &str, marker: &str, from: usize) -> Option<usize> {
    let mut at = from;
    for line in doc.get(from..)?.split_inclusive('\n') {
        if line.trim_end_matches(['\r', '\n']) == marker {
            return Some(at);
        }
        at += line.len();
    }
    None
}

/// Replace what lies between the marker lines of `doc` with `section`; without them, append
/// them (and the section) at the end. Everything outside the markers is kept byte for byte.
pub fn splice(doc: &str, section: &str) -> String {
    let body = format!("{BEGIN_MARKER}\n{}\n{END_MARKER}", section.trim_end());
    let begin = marker_line(doc, BEGIN_MARKER, 0);
    let end = begin.and_then(|b| marker_line(doc, END_MARKER, b));
    match (begin, end) {
        (Some(b), Some(e)) => format!("{}{body}{}", &doc[..b], &doc[e + END_MARKER.len()..]),
        _ => format!("{}\n\n{body}\n", doc.trim_end()),
    }
}

fn x(r: f64) -> String {
    if r.is_nan() {
        "-".into()
    } else {
        format!("{r:.2}x")
    }
}

fn opt(v: Option<f64>, prec: usize) -> String {
    v.map_or_else(|| "-".into(), |x| format!("{x:.prec$}"))
}

/// One row per target of a cell: absolute numbers, then ratios to the first target.
fn cell_rows(cell: &CellResult) -> Vec<Vec<String>> {
    cell.totals
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let r = i.checked_sub(1).and_then(|j| cell.ratios.get(j));
            let range = r.map_or_else(
                || "ref".to_string(),
                |r| {
                    let lo = r
                        .throughput_by_round
                        .iter()
                        .copied()
                        .fold(f64::NAN, f64::min);
                    let hi = r
                        .throughput_by_round
                        .iter()
                        .copied()
                        .fold(f64::NAN, f64::max);
                    format!("{lo:.2} - {hi:.2}")
                },
            );
            let mut row = vec![cell.label.clone(), t.server.clone(), human(t.ops_per_sec)];
            row.extend(latency_and_hit_cells(t));
            row.extend([
                opt(t.server_cpu_s_per_mop, 2),
                r.map_or_else(|| "1".into(), |r| x(r.throughput)),
                r.map_or_else(|| "1".into(), |r| x(r.p99)),
                r.map_or_else(|| "1".into(), |r| r.cpu_per_mop.map_or("-".into(), x)),
                range,
            ]);
            row
        })
        .collect()
}

const LATENCY_CPU_HEADERS: [&str; 3] = ["target", "measured ops", "server CPU s/Mop"];

const CELL_HEADERS: [&str; 12] = [
    "load",
    "target",
    "ops/s",
    "p50 us",
    "p99 us",
    "p99.9 us",
    "hit",
    "srv CPU s/Mop",
    "ops/s ratio",
    "p99 ratio",
    "CPU/Mop ratio",
    "per-round ops/s ratio",
];

/// Rows of the latency section: (op, size) with each target's p50/p99/p99.9 and its p50 and
/// p99 as ratios to the first target's.
fn latency_rows(rows: &[LatencyRow], targets: &[String]) -> (Vec<String>, Vec<Vec<String>>) {
    let mut headers = vec!["op".to_string(), "size".to_string()];
    for (i, t) in targets.iter().enumerate() {
        headers.push(format!("{t} p50 / p99 / p99.9 us"));
        if i > 0 {
            headers.push(format!("{t} p50, p99 ratio"));
        }
    }
    let mut keys: Vec<(String, usize)> = Vec::new();
    for r in rows {
        let k = (r.result.op.clone(), r.result.size);
        if !keys.contains(&k) {
            keys.push(k);
        }
    }
    let find = |t: &str, k: &(String, usize)| {
        rows.iter()
            .find(|r| r.target == t && r.result.op == k.0 && r.result.size == k.1)
    };
    let out = keys
        .iter()
        .map(|k| {
            let mut row = vec![k.0.clone(), size_label(k.1)];
            let base = targets.first().and_then(|t| find(t, k));
            for (i, t) in targets.iter().enumerate() {
                match find(t, k) {
                    Some(r) => {
                        let r = &r.result;
                        row.push(format!(
                            "{:.1} / {:.1} / {:.1}",
                            r.p50_us, r.p99_us, r.p999_us
                        ));
                        if i > 0 {
                            row.push(base.map_or("-".into(), |b| {
                                format!(
                                    "{}, {}",
                                    x(r.p50_us / b.result.p50_us),
                                    x(r.p99_us / b.result.p99_us)
                                )
                            }));
                        }
                    }
                    None => {
                        row.push("-".into());
                        if i > 0 {
                            row.push("-".into());
                        }
                    }
                }
            }
            row
        })
        .collect();
    (headers, out)
}

/// Per-kind latency of the YCSB cells: workload, kind, then p50/p99 per target.
fn ycsb_kind_rows(cells: &[CellResult]) -> (Vec<String>, Vec<Vec<String>>) {
    let targets: Vec<String> = cells
        .first()
        .map(|c| c.totals.iter().map(|t| t.server.clone()).collect())
        .unwrap_or_default();
    let mut headers = vec!["workload".to_string(), "op".to_string()];
    for (i, t) in targets.iter().enumerate() {
        headers.push(format!("{t} p50 / p99 / p99.9 us"));
        if i > 0 {
            headers.push(format!("{t} p99 ratio"));
        }
    }
    let mut rows = Vec::new();
    for c in cells {
        let kinds: Vec<_> = c
            .totals
            .first()
            .map(|t| t.by_kind.iter().map(|k| k.kind).collect())
            .unwrap_or_default();
        for kind in kinds {
            let mut row = vec![c.label.clone(), kind.name().to_string()];
            let of = |t: &RunSummary| t.by_kind.iter().find(|k| k.kind == kind).cloned();
            let base = c.totals.first().and_then(of);
            for (i, t) in c.totals.iter().enumerate() {
                let k = of(t);
                row.push(k.as_ref().map_or("-".into(), |k| {
                    format!("{:.1} / {:.1} / {:.1}", k.p50_us, k.p99_us, k.p999_us)
                }));
                if i > 0 {
                    row.push(match (&base, &k) {
                        (Some(b), Some(k)) => x(k.p99_us / b.p99_us),
                        _ => "-".into(),
                    });
                }
            }
            rows.push(row);
        }
    }
    (headers, rows)
}

fn ceiling_rows(res: &SuiteResult) -> Vec<Vec<String>> {
    let us_per_op = |v: Option<f64>| v.map_or("-".into(), |s| format!("{s:.2}"));
    res.ceiling
        .iter()
        .map(|row| {
            let c = &row.run;
            // Ops per second one fully busy generator core could drive at this CPU cost.
            let per_core = c
                .generator_cpu_s_per_mop
                .filter(|s| *s > 0.0)
                .map(|s| 1e6 / s);
            let cells: Vec<&CellResult> = res
                .throughput
                .iter()
                .filter(|cell| cell.clients == row.clients)
                .collect();
            // The generator's cost per op against the reference server, same client count,
            // and the share of its threads' time that cost took up in that run.
            let reference = cells.first().and_then(|cell| cell.totals.first());
            let vs_reference = reference.and_then(|t| t.generator_cpu_s_per_mop);
            let busy = reference.and_then(|t| {
                let per_op = t.generator_cpu_s_per_mop? / 1e6;
                Some(per_op * t.ops_per_sec / row.clients.max(1) as f64)
            });
            let best = cells
                .iter()
                .flat_map(|cell| &cell.totals)
                .max_by(|a, b| a.ops_per_sec.total_cmp(&b.ops_per_sec));
            vec![
                row.clients.to_string(),
                human(c.ops_per_sec),
                us_per_op(c.generator_cpu_s_per_mop),
                per_core.map_or("-".into(), human),
                us_per_op(vs_reference),
                busy.map_or("-".into(), |b| format!("{:.0}%", 100.0 * b)),
                best.map_or("-".into(), |b| {
                    format!("{} ({})", human(b.ops_per_sec), b.server)
                }),
            ]
        })
        .collect()
}

const CEILING_HEADERS: [&str; 7] = [
    "client threads",
    "responder ops/s",
    "generator CPU us/op",
    "ops/s per generator core",
    "generator CPU us/op vs memcached",
    "generator threads busy vs memcached",
    "best server target, same clients",
];

/// Server CPU seconds per million ops over a target's whole latency section (per row, 1000
/// ops are too few for /proc's 10 ms clock ticks).
fn latency_cpu_rows(rows: &[LatencyRow], targets: &[String]) -> Vec<Vec<String>> {
    targets
        .iter()
        .map(|t| {
            let (cpu, ops) = rows
                .iter()
                .filter(|r| &r.target == t)
                .filter_map(|r| {
                    let c = r.result.server_cpu_s_per_mop?;
                    Some((c * r.result.ops as f64 / 1e6, r.result.ops))
                })
                .fold((0.0, 0u64), |(c, o), (c2, o2)| (c + c2, o + o2));
            let per_mop = (ops > 0).then(|| cpu * 1e6 / ops as f64);
            vec![t.clone(), human(ops as f64), opt(per_mop, 2)]
        })
        .collect()
}

/// Everything as plain-text tables (stdout).
pub fn text(res: &SuiteResult) -> String {
    let mut out = String::new();
    if !res.latency.is_empty() {
        let (h, rows) = latency_rows(&res.latency, &res.targets);
        let h: Vec<&str> = h.iter().map(String::as_str).collect();
        out.push_str(&format!(
            "\nlatency, one op at a time ({}):\n",
            res.latency_placement
        ));
        out.push_str(&table(&h, &rows));
        out.push_str(&table(
            &LATENCY_CPU_HEADERS,
            &latency_cpu_rows(&res.latency, &res.targets),
        ));
    }
    for (title, cells) in [("throughput", &res.throughput), ("YCSB", &res.ycsb)] {
        if cells.is_empty() {
            continue;
        }
        out.push_str(&format!("\n{title}:\n"));
        let rows: Vec<Vec<String>> = cells.iter().flat_map(cell_rows).collect();
        out.push_str(&table(&CELL_HEADERS, &rows));
    }
    if !res.ycsb.is_empty() {
        let (h, rows) = ycsb_kind_rows(&res.ycsb);
        let h: Vec<&str> = h.iter().map(String::as_str).collect();
        out.push_str("\nYCSB latency by operation:\n");
        out.push_str(&table(&h, &rows));
    }
    if !res.ceiling.is_empty() {
        out.push_str("\nload generator ceiling (in-process responder):\n");
        out.push_str(&table(&CEILING_HEADERS, &ceiling_rows(res)));
    }
    out
}

fn md_table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut s = format!("| {} |\n", headers.join(" | "));
    s.push('|');
    for i in 0..headers.len() {
        s.push_str(if i < 2 { "---|" } else { "---:|" });
    }
    s.push('\n');
    for r in rows {
        s.push_str(&format!("| {} |\n", r.join(" | ")));
    }
    s
}

/// What the Markdown report says about how it was made.
pub struct ReportContext<'a> {
    pub command: &'a str,
    pub machine: &'a Machine,
    pub servers: &'a [String],
    pub ucx_tls: &'a str,
    pub settings: &'a [String],
    pub wall_seconds: f64,
    /// The share of the machine's CPU time its hypervisor took during the run.
    pub steal_share: Option<f64>,
    pub commit: Option<String>,
    /// (caption, path relative to the page) of each plot.
    pub plots: &'a [(String, String)],
}

/// The generated section of docs/benchmarks.md.
pub fn markdown(res: &SuiteResult, ctx: &ReportContext<'_>) -> String {
    let mut s = String::new();
    s.push_str("## Results: memcached vs memfabricd over TCP and UCX (generated)\n\n");
    s.push_str(
        "This section is written by the command below; do not edit it by hand (it is \
         replaced on the next run). Ratios are to `memcached-tcp`, measured in the same run \
         with the same load; on this shared machine they are the signal, absolute numbers \
         are not.\n\n",
    );
    s.push_str(&format!("```sh\n{}\n```\n\n", ctx.command));
    s.push_str(&format!(
        "- Machine: {} (load average at the start).\n",
        ctx.machine.line()
    ));
    if let Some(c) = &ctx.commit {
        s.push_str(&format!("- Built from {c}.\n"));
    }
    for srv in ctx.servers {
        s.push_str(&format!("- `{srv}`\n"));
    }
    s.push_str(&format!("- UCX_TLS={} (client and server).\n", ctx.ucx_tls));
    for line in ctx.settings {
        s.push_str(&format!("- {line}\n"));
    }
    s.push_str(&format!(
        "- Whole run: {:.0} s of wall time{}.\n\n",
        ctx.wall_seconds,
        ctx.steal_share.map_or(String::new(), |x| format!(
            "; the hypervisor took {:.1}% of this machine's CPU time meanwhile (steal, \
             /proc/stat: other guests on the host)",
            100.0 * x
        ))
    ));
    if !res.latency.is_empty() {
        s.push_str("### Latency by value size, one op at a time\n\n");
        if !res.latency_placement.is_empty() {
            s.push_str(&format!("Placement: {}.\n\n", res.latency_placement));
        }
        let (h, rows) = latency_rows(&res.latency, &res.targets);
        let h: Vec<&str> = h.iter().map(String::as_str).collect();
        s.push_str(&md_table(&h, &rows));
        s.push_str("\nServer CPU over the whole latency section:\n\n");
        s.push_str(&md_table(
            &LATENCY_CPU_HEADERS,
            &latency_cpu_rows(&res.latency, &res.targets),
        ));
        s.push('\n');
    }
    if !res.throughput.is_empty() {
        s.push_str("### Throughput by client threads (closed loop)\n\n");
        let rows: Vec<Vec<String>> = res.throughput.iter().flat_map(cell_rows).collect();
        s.push_str(&md_table(&CELL_HEADERS, &rows));
        s.push('\n');
    }
    if !res.ycsb.is_empty() {
        s.push_str("### YCSB\n\n");
        if !res.ycsb_load.is_empty() {
            let rows: Vec<Vec<String>> = res
                .ycsb_load
                .iter()
                .map(|l| {
                    vec![
                        l.server.clone(),
                        l.records.to_string(),
                        format!("{:.2}", l.seconds),
                        human(l.ops_per_sec),
                    ]
                })
                .collect();
            s.push_str(
                "Load phase (pipelined inserts over TCP, 8 connections x 32 in flight):\n\n",
            );
            s.push_str(&md_table(
                &["server", "records", "seconds", "inserts/s"],
                &rows,
            ));
            s.push('\n');
        }
        s.push_str("Run phase:\n\n");
        let rows: Vec<Vec<String>> = res.ycsb.iter().flat_map(cell_rows).collect();
        s.push_str(&md_table(&CELL_HEADERS, &rows));
        s.push_str("\nBy operation:\n\n");
        let (h, rows) = ycsb_kind_rows(&res.ycsb);
        let h: Vec<&str> = h.iter().map(String::as_str).collect();
        s.push_str(&md_table(&h, &rows));
        s.push('\n');
    }
    if !res.ceiling.is_empty() {
        s.push_str("### The load generator's ceiling\n\n");
        s.push_str(
            "The throughput load against an in-process responder (a hash map behind the text \
             protocol, one thread per connection) after the servers stopped. The generator's \
             CPU is that of its own threads (/proc/thread-self), so the responder's work is \
             not counted; \"ops/s per generator core\" = 1 / CPU per op is what one fully \
             busy generator thread could drive. The responder itself costs about as much per \
             request as a real server (same syscalls), so its ops/s is not the ceiling: the \
             CPU per op is. \"busy\" is the share of the generator threads' time spent on CPU \
             in the memcached-tcp run (near 100% would mean the generator set the pace). A UCX \
             client spins while it waits, so over UCX its CPU is its wall time: the ops/s it \
             reached there is a lower bound of its UCX ceiling.\n\n",
        );
        s.push_str(&md_table(&CEILING_HEADERS, &ceiling_rows(res)));
        s.push('\n');
    }
    for (caption, path) in ctx.plots {
        s.push_str(&format!("![{caption}]({path})\n\n"));
    }
    s
}

fn size_label(n: usize) -> String {
    if n >= 1024 && n.is_multiple_of(1024) {
        format!("{} KB", n / 1024)
    } else {
        format!("{n} B")
    }
}

/// One latency-by-percentile panel per cell, one curve per target.
pub fn percentile_panels(cells: &[CellResult]) -> Vec<Panel> {
    cells
        .iter()
        .map(|c| Panel {
            title: c.label.clone(),
            series: c
                .totals
                .iter()
                .zip(&c.hists)
                .map(|(t, h)| (t.server.clone(), plot::percentile_curve(h)))
                .collect(),
        })
        .collect()
}

/// Draw the plots of a comparison into `dir` as `<stem>-latency.png`, `-throughput.png`,
/// `-ycsb.png`; returns (caption, file) of each one drawn. A plot that fails is reported and
/// skipped: it must not throw away a finished run.
pub fn draw_plots(res: &SuiteResult, dir: &Path, stem: &str) -> Vec<(String, PathBuf)> {
    let mut drawn = Vec::new();
    if let Err(e) = std::fs::create_dir_all(dir) {
        eprintln!("plots skipped: {}: {e}", dir.display());
        return drawn;
    }
    let mut keep = |caption: &str, path: PathBuf, r: Result<(), PlotError>| match r {
        Ok(()) => drawn.push((caption.to_string(), path)),
        Err(e) => eprintln!("plot {} skipped: {e}", path.display()),
    };
    if !res.latency.is_empty() {
        let mut series = Vec::new();
        for t in &res.targets {
            for op in ["get", "set"] {
                let pts: Vec<(usize, f64)> = res
                    .latency
                    .iter()
                    .filter(|r| &r.target == t && r.result.op == op)
                    .map(|r| (r.result.size, r.result.p50_us))
                    .collect();
                if !pts.is_empty() {
                    series.push((format!("{t} {op} p50"), pts));
                }
            }
        }
        let path = dir.join(format!("{stem}-latency.png"));
        let r = plot::latency_vs_size(
            &path,
            "latency by value size, one op at a time (p50)",
            &series,
        );
        keep("latency by value size", path, r);
    }
    if !res.throughput.is_empty() {
        let mut series: Vec<(String, Vec<(usize, f64)>)> = Vec::new();
        for (i, t) in res.targets.iter().enumerate() {
            let pts: Vec<(usize, f64)> = res
                .throughput
                .iter()
                .filter_map(|c| Some((c.clients, c.totals.get(i)?.ops_per_sec / 1000.0)))
                .collect();
            series.push((t.clone(), pts));
        }
        let path = dir.join(format!("{stem}-throughput.png"));
        let r = plot::lines_log2_x(
            &path,
            "throughput by client threads (closed loop)",
            ("client threads", "thousand ops/s"),
            plot::YAxis::LinearFromZero,
            &series,
        );
        keep("throughput by client threads", path, r);
    }
    if !res.ycsb.is_empty() {
        let path = dir.join(format!("{stem}-ycsb.png"));
        let panels = percentile_panels(&res.ycsb);
        let r = plot::latency_percentiles(&path, "YCSB: latency by percentile", &panels);
        keep("YCSB latency by percentile", path, r);
    }
    drawn
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splice_replaces_only_between_the_markers() {
        let doc = format!("# T\nintro\n{BEGIN_MARKER}\nold\n{END_MARKER}\n## hand\nkept\n");
        let out = splice(&doc, "new table\n");
        assert_eq!(
            out,
            format!("# T\nintro\n{BEGIN_MARKER}\nnew table\n{END_MARKER}\n## hand\nkept\n")
        );
        // Again: idempotent.
        assert_eq!(splice(&out, "new table"), out);
    }

    #[test]
    fn markers_quoted_in_prose_are_not_markers() {
        let doc = format!(
            "between `{BEGIN_MARKER}` and `{END_MARKER}`, the report\n{BEGIN_MARKER}\nold\n{END_MARKER}\nend\n"
        );
        let out = splice(&doc, "new");
        assert_eq!(
            out,
            format!(
                "between `{BEGIN_MARKER}` and `{END_MARKER}`, the report\n{BEGIN_MARKER}\nnew\n{END_MARKER}\nend\n"
            )
        );
    }

    #[test]
    fn splice_appends_when_there_are_no_markers() {
        let out = splice("# T\n", "gen");
        assert_eq!(out, format!("# T\n\n{BEGIN_MARKER}\ngen\n{END_MARKER}\n"));
    }
}
