//! `memfabricd`: parse memcached's flags, set up logging, run the server.
use std::io::IsTerminal;

use memfabric_server::cli::{self, Either};
use memfabric_server::runtime;

const LICENSE: &str = "memfabricd is distributed under the BSD-3-Clause license.";

fn main() {
    let parsed = match cli::parse(std::env::args_os()) {
        Ok(p) => p,
        // --help and --version print to stdout and exit 0; a flag getopt would reject
        // (unknown, or missing its value) exits 1, memcached's status, not clap's 2.
        Err(Either::Clap(e)) if e.use_stderr() => {
            let _ = e.print();
            std::process::exit(1);
        }
        Err(Either::Clap(e)) => e.exit(),
        Err(Either::Cli(e)) => {
            eprintln!("{}", e.message);
            std::process::exit(e.code);
        }
    };
    if parsed.license {
        println!("{LICENSE}");
        return;
    }
    // memcached: -v warnings and errors, -vv client traffic, -vvv internal states.
    let level = match parsed.settings.verbose {
        0 => "warn",
        1 => "info",
        2 => "debug",
        _ => "trace",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_env("MEMFABRIC_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    // Colour only for a person at a terminal: a pipe, a file or journald gets plain text.
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(false)
        .init();
    for w in &parsed.warnings {
        tracing::warn!("{w}");
    }
    let settings = parsed.settings;
    let listeners = match runtime::bind(&settings) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(71);
        }
    };
    if let Err(e) = runtime::run(settings, listeners) {
        eprintln!("{e}");
        std::process::exit(1);
    }
}
