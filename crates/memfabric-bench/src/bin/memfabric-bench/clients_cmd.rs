//! `memfabric-bench clients`: existing memcached client libraries, unmodified, on
//! libmemfabric (libmemcached's ABI on memfabric) against memfabricd over UCX, side by side
//! with the same libraries on Debian's libmemcached against memcached over TCP, in one run:
//! GET latency from Python (pylibmc; pymemcache as the pure-Python reference) and GETs in
//! batches from C (libmemcached's mget against memfabric.h's iget with N in flight).

use crate::compare_cmd::DEFAULT_UCX_TLS;
use crate::output::{report_plot, write_json};
use crate::Fallible;
use clap::Args;
use memfabric_bench::plot::{self, BarPanel};
use memfabric_bench::report::{table, Machine};
use memfabric_bench::server::{self, ServerSpec};
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::process::Command;

const PROBE_PY: &str = include_str!("clients/probe.py");
const BATCH_C: &str = include_str!("clients/batch.c");
const MEMFABRIC_H: &str = include_str!("../../../../memfabric-c/include/memfabric.h");

#[derive(Args)]
pub(crate) struct ClientsArgs {
    /// GETs measured per row.
    #[arg(long, default_value_t = 20_000)]
    pub(crate) gets: usize,
    /// Value size in bytes.
    #[arg(long, default_value_t = 100)]
    pub(crate) valsize: usize,
    /// Distinct keys (all stored before measuring: every GET hits).
    #[arg(long, default_value_t = 1000)]
    pub(crate) keys: usize,
    /// GETs per batch in the C rows (memcached_iget in flight; keys per memcached_mget).
    #[arg(long, default_value_t = 32)]
    pub(crate) in_flight: usize,
    /// memcached, the reference server.
    #[arg(long, default_value = "/usr/bin/memcached")]
    pub(crate) memcached: PathBuf,
    /// memfabricd (default: next to this binary, on PATH, or target/release).
    #[arg(long)]
    pub(crate) memfabricd: Option<PathBuf>,
    /// libmemfabric.so (default: next to this binary).
    #[arg(long)]
    pub(crate) libmemfabric: Option<PathBuf>,
    /// The Python that runs the probes; it needs pymemcache (default: .venv/bin/python if
    /// present, else python3). pylibmc is Debian's python3-pylibmc, added to its path.
    #[arg(long)]
    pub(crate) python: Option<PathBuf>,
    /// Where Debian's pylibmc lives.
    #[arg(long, default_value = "/usr/lib/python3/dist-packages")]
    pub(crate) pylibmc_dir: PathBuf,
    /// Write the results as JSON here.
    #[arg(long)]
    pub(crate) json: Option<PathBuf>,
    /// Draw the results (PNG) here.
    #[arg(long)]
    pub(crate) plot: Option<PathBuf>,
}

#[derive(Serialize)]
struct Row {
    name: String,
    library: String,
    server: String,
    transport: String,
    p50_us: f64,
    p99_us: f64,
    gets_per_s: Option<f64>,
}

#[derive(Serialize)]
struct Results {
    command: String,
    machine: String,
    ucx_tls: String,
    gets: usize,
    valsize: usize,
    in_flight: usize,
    python: Vec<Row>,
    c: Vec<Row>,
    /// pylibmc on libmemfabric over UCX / pylibmc on libmemcached over TCP (p50).
    pylibmc_ucx_vs_tcp_p50: f64,
    /// memfabric's Python package over UCX / pymemcache over TCP to memcached (p50).
    memfabric_ucx_vs_pymemcache_tcp_p50: f64,
    /// memcached_iget x N in flight over UCX / libmemcached mget of N over TCP (GETs per s).
    iget_ucx_vs_mget_tcp_throughput: f64,
}

fn next_to_exe(name: &str) -> Option<PathBuf> {
    let p = std::env::current_exe().ok()?.parent()?.join(name);
    p.exists().then_some(p)
}

fn run_json(cmd: &mut Command, what: &str) -> Fallible<serde_json::Value> {
    let out = cmd.output().map_err(|e| format!("{what}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{what} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        )
        .into());
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().last().unwrap_or_default();
    Ok(serde_json::from_str(line).map_err(|e| format!("{what}: {e}: {text}"))?)
}

fn gcc(out: &Path, src: &Path, args: &[&str]) -> Fallible<()> {
    let o = Command::new("gcc")
        .args(["-O2", "-Wall", "-o"])
        .arg(out)
        .arg(src)
        .args(args)
        .output()
        .map_err(|e| format!("gcc: {e} (apt install gcc libmemcached-dev)"))?;
    if !o.status.success() {
        return Err(format!("gcc: {}", String::from_utf8_lossy(&o.stderr)).into());
    }
    Ok(())
}

fn f(v: &serde_json::Value, k: &str) -> f64 {
    v.get(k)
        .and_then(serde_json::Value::as_f64)
        .unwrap_or(f64::NAN)
}

pub(crate) fn clients_cmd(a: ClientsArgs) -> Fallible<()> {
    let command = std::env::args().collect::<Vec<_>>().join(" ");
    let ucx_tls = std::env::var("UCX_TLS").unwrap_or_else(|_| {
        std::env::set_var("UCX_TLS", DEFAULT_UCX_TLS);
        DEFAULT_UCX_TLS.to_string()
    });
    let libmemfabric = match &a.libmemfabric {
        Some(p) => p.clone(),
        None => next_to_exe("libmemfabric.so")
            .ok_or("libmemfabric.so is not next to memfabric-bench: cargo build --release -p memfabric-c, or --libmemfabric")?,
    };
    let (memfabricd, _) = server::locate_memfabricd(a.memfabricd.as_deref())?;
    let python = a.python.clone().unwrap_or_else(|| {
        let venv = PathBuf::from(".venv/bin/python");
        if venv.exists() {
            venv
        } else {
            PathBuf::from("python3")
        }
    });

    // A scratch directory: libmemfabric under libmemcached's SONAME, Debian's pylibmc
    // alone on a Python path, the probes.
    let tmp = std::env::temp_dir().join(format!("memfabric-bench-clients-{}", std::process::id()));
    let soname = tmp.join("lib");
    let pyl = tmp.join("pylibmc");
    std::fs::create_dir_all(&soname)?;
    std::fs::create_dir_all(&pyl)?;
    let _cleanup = Cleanup(tmp.clone());
    std::os::unix::fs::symlink(
        std::fs::canonicalize(&libmemfabric)?,
        soname.join("libmemcached.so.11"),
    )?;
    for entry in std::fs::read_dir(&a.pylibmc_dir)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name == "pylibmc" || name.starts_with("_pylibmc") {
            std::os::unix::fs::symlink(entry.path(), pyl.join(&name))?;
        }
    }
    let probe = tmp.join("probe.py");
    std::fs::write(&probe, PROBE_PY)?;
    std::fs::write(tmp.join("batch.c"), BATCH_C)?;
    std::fs::write(tmp.join("memfabric.h"), MEMFABRIC_H)?;
    let batch_plain = tmp.join("batch-libmemcached");
    let batch_mf = tmp.join("batch-memfabric");
    gcc(&batch_plain, &tmp.join("batch.c"), &["-lmemcached"])?;
    let libdir = libmemfabric
        .parent()
        .unwrap_or(Path::new("."))
        .display()
        .to_string();
    gcc(
        &batch_mf,
        &tmp.join("batch.c"),
        &[
            "-DWITH_MEMFABRIC",
            "-I",
            &tmp.display().to_string(),
            "-L",
            &libdir,
            "-lmemfabric",
        ],
    )?;

    eprintln!("starting memcached and memfabricd (UCX_TLS={ucx_tls})");
    let spec = |name: &str, path: &Path, extra: Vec<String>| ServerSpec {
        name: name.into(),
        path: path.to_path_buf(),
        threads: 1,
        memory_mb: 256,
        extra_args: extra,
    };
    let memcached = spec("memcached", &a.memcached, Vec::new()).start()?;
    let fabric = spec("memfabricd", &memfabricd, Vec::new()).start_with_ucx_port()?;

    struct Case<'s> {
        name: &'s str,
        library: &'s str,
        ours: bool,
        server: &'s server::ServerProcess,
        transport: &'s str,
    }
    let cases = [
        Case {
            name: "pymemcache -> memcached",
            library: "pymemcache",
            ours: false,
            server: &memcached,
            transport: "tcp",
        },
        Case {
            name: "pylibmc/libmemcached -> memcached",
            library: "pylibmc",
            ours: false,
            server: &memcached,
            transport: "tcp",
        },
        Case {
            name: "pylibmc/libmemfabric -> memcached",
            library: "pylibmc",
            ours: true,
            server: &memcached,
            transport: "tcp",
        },
        Case {
            name: "pylibmc/libmemfabric -> memfabricd",
            library: "pylibmc",
            ours: true,
            server: &fabric,
            transport: "ucx",
        },
        Case {
            name: "memfabric -> memcached",
            library: "memfabric",
            ours: false,
            server: &memcached,
            transport: "tcp",
        },
        Case {
            name: "memfabric -> memfabricd",
            library: "memfabric",
            ours: false,
            server: &fabric,
            transport: "ucx",
        },
    ];
    let total = cases.len() + 4;
    let mut step = 0;
    let mut progress = |what: &str| {
        step += 1;
        eprintln!("[{step}/{total}] {what}");
    };
    let mut python_rows = Vec::new();
    for c in &cases {
        progress(c.name);
        let mut cmd = Command::new(&python);
        cmd.arg(&probe)
            .args([c.library, "127.0.0.1", &c.server.addr.port().to_string()])
            .args([
                a.gets.to_string(),
                a.valsize.to_string(),
                a.keys.to_string(),
                "0".into(),
            ])
            .env("PYTHONPATH", &pyl)
            .env("MEMFABRIC_TRANSPORT", c.transport);
        if c.ours {
            cmd.env("LD_LIBRARY_PATH", &soname);
        } else {
            cmd.env_remove("LD_LIBRARY_PATH");
        }
        let v = run_json(&mut cmd, c.name)?;
        let loaded = v.get("loaded").and_then(|l| l.as_str()).unwrap_or("");
        let want = match (c.library, c.ours) {
            ("pymemcache", _) => "none",
            ("memfabric", _) if c.transport == "ucx" => "memfabric-ucx",
            ("memfabric", _) => "memfabric-tcp",
            (_, true) => "libmemfabric",
            _ => "libmemcached",
        };
        if loaded != want {
            return Err(format!("{}: loaded {loaded}, expected {want}", c.name).into());
        }
        python_rows.push(Row {
            name: c.name.into(),
            library: match c.library {
                "pylibmc" => format!("pylibmc + {want}"),
                other => other.to_string(),
            },
            server: c.server.name.clone(),
            transport: c.transport.into(),
            p50_us: f(&v, "p50_us"),
            p99_us: f(&v, "p99_us"),
            gets_per_s: None,
        });
    }
    let batches = [
        (
            "mget: libmemcached -> memcached",
            &batch_plain,
            "mget",
            false,
            &memcached,
            "tcp",
        ),
        (
            "mget: libmemfabric -> memfabricd",
            &batch_plain,
            "mget",
            true,
            &fabric,
            "ucx",
        ),
        (
            "iget: libmemfabric -> memcached",
            &batch_mf,
            "iget",
            true,
            &memcached,
            "tcp",
        ),
        (
            "iget: libmemfabric -> memfabricd",
            &batch_mf,
            "iget",
            true,
            &fabric,
            "ucx",
        ),
    ];
    let mut c_rows = Vec::new();
    for (name, exe, mode, ours, srv, transport) in batches {
        progress(name);
        let mut cmd = Command::new(exe);
        cmd.args([mode, "127.0.0.1", &srv.addr.port().to_string()])
            .args([
                a.gets.to_string(),
                a.valsize.to_string(),
                a.keys.to_string(),
                a.in_flight.to_string(),
            ])
            .env("MEMFABRIC_TRANSPORT", transport);
        if ours {
            cmd.env(
                "LD_LIBRARY_PATH",
                if mode == "iget" {
                    libdir.clone()
                } else {
                    soname.display().to_string()
                },
            );
        } else {
            cmd.env_remove("LD_LIBRARY_PATH");
        }
        let v = run_json(&mut cmd, name)?;
        c_rows.push(Row {
            name: name.into(),
            library: if ours {
                "libmemfabric".into()
            } else {
                "libmemcached".into()
            },
            server: srv.name.clone(),
            transport: transport.into(),
            p50_us: f(&v, "p50_us"),
            p99_us: f(&v, "p99_us"),
            gets_per_s: Some(f(&v, "gets_per_s")),
        });
    }

    let results = Results {
        command,
        machine: Machine::describe().line(),
        ucx_tls,
        gets: a.gets,
        valsize: a.valsize,
        in_flight: a.in_flight,
        pylibmc_ucx_vs_tcp_p50: python_rows[3].p50_us / python_rows[1].p50_us,
        memfabric_ucx_vs_pymemcache_tcp_p50: python_rows[5].p50_us / python_rows[0].p50_us,
        iget_ucx_vs_mget_tcp_throughput: c_rows[3].gets_per_s.unwrap_or(0.0)
            / c_rows[0].gets_per_s.unwrap_or(f64::NAN),
        python: python_rows,
        c: c_rows,
    };
    let py_table: Vec<Vec<String>> = results
        .python
        .iter()
        .map(|r| {
            vec![
                r.name.clone(),
                r.transport.clone(),
                format!("{:.1}", r.p50_us),
                format!("{:.1}", r.p99_us),
                format!("{:.2}x", r.p50_us / results.python[1].p50_us),
            ]
        })
        .collect();
    println!(
        "GET from Python, {} B values, {} GETs per row ({})",
        a.valsize, a.gets, results.machine
    );
    println!(
        "{}",
        table(
            &[
                "client -> server",
                "transport",
                "p50 us",
                "p99 us",
                "p50 vs pylibmc/libmemcached"
            ],
            &py_table
        )
    );
    let c_table: Vec<Vec<String>> = results
        .c
        .iter()
        .map(|r| {
            vec![
                r.name.clone(),
                r.transport.clone(),
                format!("{:.1}", r.p50_us),
                format!("{:.1}", r.p99_us),
                format!("{:.0}", r.gets_per_s.unwrap_or(0.0)),
                format!(
                    "{:.2}x",
                    r.gets_per_s.unwrap_or(0.0) / results.c[0].gets_per_s.unwrap_or(f64::NAN)
                ),
            ]
        })
        .collect();
    println!(
        "\nGETs from C in batches of {} (p50/p99 per batch)",
        a.in_flight
    );
    println!(
        "{}",
        table(
            &[
                "batch -> server",
                "transport",
                "p50 us",
                "p99 us",
                "GETs/s",
                "vs libmemcached mget"
            ],
            &c_table
        )
    );
    println!(
        "\nmemfabric (Python) over UCX: {:.2}x the GET p50 of pymemcache over TCP; pylibmc on libmemfabric over UCX: {:.2}x the GET p50 of pylibmc on libmemcached over TCP; memcached_iget x {} over UCX: {:.2}x the GETs/s of libmemcached's mget over TCP",
        results.memfabric_ucx_vs_pymemcache_tcp_p50,
        results.pylibmc_ucx_vs_tcp_p50,
        a.in_flight,
        results.iget_ucx_vs_mget_tcp_throughput
    );
    if let Some(p) = &a.json {
        write_json(p, &results)?;
    }
    if let Some(p) = &a.plot {
        let panels = [
            BarPanel {
                title: "GET p50 from Python (us)".into(),
                y_desc: "microseconds".into(),
                bars: results
                    .python
                    .iter()
                    .map(|r| (short(&r.name), r.p50_us))
                    .collect(),
            },
            BarPanel {
                title: format!("GETs/s from C, {} per batch", a.in_flight),
                y_desc: "GETs per second".into(),
                bars: results
                    .c
                    .iter()
                    .map(|r| (short(&r.name), r.gets_per_s.unwrap_or(0.0)))
                    .collect(),
            },
        ];
        report_plot(
            plot::bars(p, "memcached clients on libmemfabric", &panels),
            p,
        );
    }
    Ok(())
}

/// A bar's label: "pylibmc/libmemfabric -> memfabricd" is "pylibmc+lmf/mfd",
/// "memfabric -> memcached" "mf.py/mc".
fn short(name: &str) -> String {
    name.replace("libmemcached", "lmc")
        .replace("libmemfabric", "lmf")
        .replace("pylibmc/", "pylibmc+")
        .replace("memfabric -> ", "mf.py -> ")
        .replace(" -> memfabricd", "/mfd")
        .replace(" -> memcached", "/mc")
        .replace(": ", " ")
}

/// Removes the scratch directory when the command ends, also on error.
struct Cleanup(PathBuf);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
