//! Bind the UCX found: by default the system's (Debian's `libucx-dev`, found with
//! pkg-config); with `MEMFABRIC_UCX_PREFIX=DIR`, the UCX installed under DIR (`include/`,
//! `lib/`), such as the newer UCX that PyPI's `libucx` wheels ship (`scripts/ucx-newer.sh`
//! fetches one and builds and tests against it). UCX is never built from source here, so
//! the library we link is one the machine's transports were configured for.
use std::env;
use std::path::{Path, PathBuf};

/// Include directories of the UCX to bind, after telling cargo how to link it.
fn find_ucx() -> Vec<PathBuf> {
    println!("cargo:rerun-if-env-changed=MEMFABRIC_UCX_PREFIX");
    if let Some(prefix) = env::var_os("MEMFABRIC_UCX_PREFIX").filter(|p| !p.is_empty()) {
        let prefix = PathBuf::from(prefix);
        let include = prefix.join("include");
        let lib = prefix.join("lib");
        let version = version_of(&include).unwrap_or_else(|| {
            panic!(
                "MEMFABRIC_UCX_PREFIX={}: no UCX headers under include/ucp/api",
                prefix.display()
            )
        });
        assert!(
            version >= (1, 12),
            "MEMFABRIC_UCX_PREFIX={}: UCX {}.{} is older than 1.12",
            prefix.display(),
            version.0,
            version.1
        );
        println!(
            "cargo:rerun-if-changed={}",
            include.join("ucp/api/ucp_version.h").display()
        );
        println!("cargo:rustc-link-search=native={}", lib.display());
        for l in ["ucp", "uct", "ucs", "ucm"] {
            println!("cargo:rustc-link-lib=dylib={l}");
        }
        // Dependents (memfabricd, the tests) read it as DEP_UCP_LIBDIR, should they want it;
        // scripts/ucx-newer.sh puts it in the binaries' run path.
        println!("cargo:libdir={}", lib.display());
        return vec![include];
    }
    let ucx = pkg_config::Config::new()
        .atleast_version("1.12")
        .probe("ucx")
        .expect("UCX not found: install libucx-dev (scripts/setup.sh does), or set MEMFABRIC_UCX_PREFIX");
    ucx.include_paths
}

/// (major, minor) from `ucp/api/ucp_version.h` under `include`.
fn version_of(include: &Path) -> Option<(u32, u32)> {
    let text = std::fs::read_to_string(include.join("ucp/api/ucp_version.h")).ok()?;
    let field = |name: &str| {
        text.lines().find_map(|l| {
            let mut words = l.split_whitespace();
            (words.next() == Some("#define") && words.next() == Some(name))
                .then(|| words.next()?.trim_end_matches('U').parse().ok())
                .flatten()
        })
    };
    Some((field("UCP_API_MAJOR")?, field("UCP_API_MINOR")?))
}

fn main() {
    let includes = find_ucx();
    println!("cargo:rerun-if-changed=wrapper.h");
    let mut builder = bindgen::Builder::default()
        .header("wrapper.h")
        .allowlist_function("ucp_.*")
        .allowlist_function("ucs_status_string")
        .allowlist_type("ucp_.*")
        .allowlist_type("ucs_status_t")
        .allowlist_var("UCP_.*")
        .allowlist_var("UCS_.*")
        .prepend_enum_name(false)
        .derive_default(true)
        .layout_tests(false)
        .generate_comments(false);
    for p in &includes {
        builder = builder.clang_arg(format!("-I{}", p.display()));
    }
    let bindings = builder.generate().expect("bindgen failed on ucp/api/ucp.h");
    let out = PathBuf::from(env::var("OUT_DIR").unwrap()).join("ucx_sys.rs");
    bindings.write_to_file(out).expect("cannot write bindings");
}
