//! Bind the system UCX (Debian's `libucx-dev`), found with pkg-config: UCX is never built
//! from source here, so the library we link is the one the machine's transports were
//! configured for.
use std::env;
use std::path::PathBuf;

fn main() {
    let ucx = pkg_config::Config::new()
        .atleast_version("1.12")
        .probe("ucx")
        .expect("UCX not found: install libucx-dev (scripts/setup.sh does)");
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
    for p in &ucx.include_paths {
        builder = builder.clang_arg(format!("-I{}", p.display()));
    }
    let bindings = builder.generate().expect("bindgen failed on ucp/api/ucp.h");
    let out = PathBuf::from(env::var("OUT_DIR").unwrap()).join("ucx_sys.rs");
    bindings.write_to_file(out).expect("cannot write bindings");
}
