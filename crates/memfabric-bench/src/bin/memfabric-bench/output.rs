//! Output shared by the subcommands: JSON and plot files, and the labels runs are
//! reported under.

use crate::Fallible;
use memfabric_bench::load::LoadConfig;
use memfabric_bench::plot;
use memfabric_bench::workload::Pattern;
use serde::Serialize;
use std::path::Path;

pub(crate) fn write_json<T: Serialize>(path: &Path, v: &T) -> Fallible<()> {
    let text = serde_json::to_string_pretty(v)?;
    std::fs::write(path, text + "\n").map_err(|e| format!("{}: {e}", path.display()))?;
    eprintln!("wrote {}", path.display());
    Ok(())
}

pub(crate) fn report_plot(r: Result<(), plot::PlotError>, path: &Path) {
    match r {
        Ok(()) => eprintln!("wrote {}", path.display()),
        // A missing font must not throw away a finished benchmark: say so and go on.
        Err(e) => eprintln!("plot skipped: {e}"),
    }
}

/// "mix 90:10 get:set", "interleaved", ...
pub(crate) fn pattern_label(c: &LoadConfig) -> String {
    match c.pattern {
        Pattern::Mix => format!("mix {} get:set", c.mix),
        p => p.name().to_string(),
    }
}
