//! `memfabric-bench throughput`: closed-loop load against a running server, one run per
//! value size.

use crate::args::{OutputArgs, TransportKind, WorkloadArgs};
use crate::output::{pattern_label, report_plot, write_json};
use crate::Fallible;
use clap::Args;
use memfabric_bench::load;
use memfabric_bench::metrics::RunSummary;
use memfabric_bench::plot::{self, Panel};
use memfabric_bench::report::{self, Machine};
use serde::Serialize;
use std::net::SocketAddr;

#[derive(Args)]
pub(crate) struct ThroughputArgs {
    /// Server address (with `--transport ucx`: memfabricd's `--ucx-port`).
    #[arg(long, default_value = "127.0.0.1:11211")]
    pub(crate) server: SocketAddr,
    /// tcp, or ucx (memfabricd only; each client thread has its own client and UCX worker,
    /// and its `--conns` are request queues over it).
    #[arg(long, value_enum, default_value_t = TransportKind::Tcp)]
    pub(crate) transport: TransportKind,
    /// Speak TLS (a server with -Z), trusting the PEM CA certificates in this file; the
    /// server's certificate must name the --server IP. tcp transport only. The preload
    /// then sends one SET at a time per connection: memcached 1.6.18 with -Z stops
    /// answering a connection that pipelines more than ~256 KB of SETs (docs/security.md).
    #[arg(long, value_name = "FILE")]
    pub(crate) tls_ca: Option<std::path::PathBuf>,
    /// Server process id, to measure its CPU time (utime+stime from /proc).
    #[arg(long)]
    pub(crate) server_pid: Option<u32>,
    /// Label of the server in reports.
    #[arg(long, default_value = "server")]
    pub(crate) name: String,
    #[command(flatten)]
    pub(crate) workload: WorkloadArgs,
    #[command(flatten)]
    pub(crate) out: OutputArgs,
}

pub(crate) fn throughput_cmd(a: ThroughputArgs) -> Fallible<()> {
    let base = a.workload.load_config(&a.name)?;
    let connector = match &a.tls_ca {
        Some(ca) => {
            if a.transport.name() != "tcp" {
                return Err("--tls-ca needs --transport tcp".into());
            }
            let config = memfabric_client::tls::client_config(&memfabric_client::TlsConfig {
                ca_file: Some(ca.clone()),
                ..Default::default()
            })?;
            Box::new(memfabric_bench::transport::TcpConnector {
                addr: a.server,
                tls: Some(config),
            })
        }
        None => a.transport.connector(a.server),
    };
    let connector = connector.as_ref();
    let machine = Machine::describe();
    println!("machine: {}", machine.line());
    let mut summaries = Vec::new();
    let mut panels = Vec::new();
    for &size in &a.workload.value_size {
        let mut cfg = base.clone();
        cfg.value_size = size;
        if !a.workload.no_preload {
            let depth = if a.tls_ca.is_some() { 1 } else { 32 };
            let p = load::preload(connector, &cfg.keys, size, 8, depth)?;
            eprintln!(
                "preloaded {} keys of {size} B in {:.1}s",
                p.stored,
                p.elapsed.as_secs_f64()
            );
        }
        let m = load::measured_run(connector, &cfg, a.server_pid)?;
        summaries.push(m.summary(&a.name, size));
        let stats = m.stats;
        panels.push(Panel {
            title: format!("{size} B values"),
            series: vec![(a.name.clone(), plot::percentile_curve(&stats.all_hist()))],
        });
    }
    println!(
        "workload: {} keys, {}, {:?}, {} thread(s) x {} conn(s), depth {}, {}, {}",
        base.keys.n,
        pattern_label(&base),
        base.dist,
        base.threads,
        base.conns_per_thread,
        base.depth,
        a.transport.name(),
        base.rate.map_or_else(
            || "closed loop".to_string(),
            |r| format!("open loop at {r} ops/s (latency from the scheduled send time)")
        )
    );
    print!("{}", report::runs_table(&summaries));
    if let Some(p) = &a.out.json {
        #[derive(Serialize)]
        struct Out<'a> {
            machine: &'a Machine,
            server: String,
            transport: TransportKind,
            workload: &'a WorkloadArgs,
            results: &'a [RunSummary],
        }
        write_json(
            p,
            &Out {
                machine: &machine,
                server: a.server.to_string(),
                transport: a.transport,
                workload: &a.workload,
                results: &summaries,
            },
        )?;
    }
    if let Some(p) = &a.out.plot {
        report_plot(
            plot::latency_percentiles(p, &format!("{} latency by percentile", a.name), &panels),
            p,
        );
    }
    Ok(())
}
