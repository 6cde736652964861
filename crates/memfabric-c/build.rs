//! Link arguments of the cdylib.
//!
//! Debian's libmemcached.so.11 is linked with Cyrus SASL, and applications built against
//! it (python3-pylibmc calls `sasl_client_init`/`sasl_done` itself) find libsasl2's
//! symbols through it. libmemfabric stands in for it, so it must bring libsasl2 along:
//! linked by its SONAME (no -dev package needed) and kept although nothing here calls it.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux") {
        println!("cargo:rustc-cdylib-link-arg=-Wl,--no-as-needed,-l:libsasl2.so.2,--as-needed");
    }
}
