//! Certificates for TLS tests, made with the `openssl` command (scripts/setup.sh installs
//! it) in a scratch directory removed on drop: a CA; signed by it, `server` (for
//! 127.0.0.1 and localhost), `server2` (the same names, another key: for reload tests)
//! and `client` (for client authentication); and `stranger`, a client certificate no
//! CA here signed. Every key is EC P-256 and every certificate X.509 v3 (rustls takes no
//! v1 certificates).
use std::path::{Path, PathBuf};
use std::process::Command;

/// See the module documentation.
pub struct TestCerts {
    dir: PathBuf,
}

impl Drop for TestCerts {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

const EC: [&str; 5] = [
    "-newkey",
    "ec",
    "-pkeyopt",
    "ec_paramgen_curve:prime256v1",
    "-nodes",
];

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("openssl (scripts/setup.sh installs it)");
    assert!(out.status.success(), "openssl {args:?}: {out:?}");
}

impl TestCerts {
    /// Makes the set in a directory named after `name` and this process.
    pub fn make(name: &str) -> TestCerts {
        let dir =
            std::env::temp_dir().join(format!("memfabric-certs-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("certificate directory");
        let self_signed = |key: &str, crt: &str, cn: &str| {
            let subj = format!("/CN={cn}");
            let tail = ["-keyout", key, "-out", crt, "-days", "2", "-subj", &subj];
            openssl(&dir, &[&["req", "-x509"][..], &EC, &tail].concat());
        };
        self_signed("ca.key", "ca.crt", "memfabric-test-ca");
        std::fs::write(
            dir.join("server.ext"),
            "subjectAltName=DNS:localhost,IP:127.0.0.1\n",
        )
        .expect("extension file");
        std::fs::write(dir.join("client.ext"), "extendedKeyUsage=clientAuth\n")
            .expect("extension file");
        for (who, ext) in [
            ("server", "server.ext"),
            ("server2", "server.ext"),
            ("client", "client.ext"),
        ] {
            let (key, csr, crt) = (
                format!("{who}.key"),
                format!("{who}.csr"),
                format!("{who}.crt"),
            );
            let subj = format!("/CN={who}");
            openssl(
                &dir,
                &[
                    &["req"][..],
                    &EC,
                    &["-keyout", &key, "-out", &csr, "-subj", &subj],
                ]
                .concat(),
            );
            openssl(
                &dir,
                &[
                    "x509",
                    "-req",
                    "-in",
                    &csr,
                    "-CA",
                    "ca.crt",
                    "-CAkey",
                    "ca.key",
                    "-CAcreateserial",
                    "-out",
                    &crt,
                    "-days",
                    "2",
                    "-extfile",
                    ext,
                ],
            );
        }
        self_signed("stranger.key", "stranger.crt", "stranger");
        TestCerts { dir }
    }

    /// A file of the set: `ca.crt`, `server.crt`, `server.key`, `client.crt`, ...
    pub fn path(&self, file: &str) -> PathBuf {
        self.dir.join(file)
    }

    /// memcached's (and memfabricd's) `-Z -o ssl_chain_cert=...,ssl_key=...` for
    /// `server`, with `extra` options appended (comma separated, or empty).
    pub fn server_flags(&self, extra: &str) -> Vec<String> {
        let mut o = format!(
            "ssl_chain_cert={},ssl_key={}",
            self.path("server.crt").display(),
            self.path("server.key").display()
        );
        if !extra.is_empty() {
            o.push(',');
            o.push_str(extra);
        }
        vec!["-Z".into(), "-o".into(), o]
    }
}
