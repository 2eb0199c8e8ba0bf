//! A throwaway certificate authority for TLS tests, made with the openssl
//! CLI (Debian's `openssl`; .ci/run installs it when missing): a CA, and a
//! server certificate it signs for 127.0.0.1 and localhost, valid two days.
//! And a TLS receiver: `openssl s_server` with that certificate, which
//! completes handshakes and is stopped on drop.

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// The files of a throwaway CA and its server certificate.
pub struct TestCa {
    /// The CA's certificate (PEM): what a client must trust.
    pub ca: PathBuf,
    /// The server's certificate (PEM), signed by the CA.
    pub cert: PathBuf,
    /// The server's key (PEM).
    pub key: PathBuf,
}

impl TestCa {
    /// Makes one in `dir`; None (test skipped) without openssl outside CI.
    pub fn new(dir: &Path) -> Option<TestCa> {
        if !crate::common::available("openssl", &["version"]) {
            return None;
        }
        let p = |name: &str| dir.join(name).to_str().unwrap().to_string();
        let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"];
        openssl(
            &[
                &["req", "-x509", "-nodes", "-days", "2"][..],
                &ec,
                &["-keyout", &p("ca.key"), "-out", &p("ca.pem")],
                &["-subj", "/CN=outboxd-test-ca"],
                &["-addext", "basicConstraints=critical,CA:TRUE"],
                &["-addext", "keyUsage=critical,keyCertSign"],
            ]
            .concat(),
        );
        openssl(
            &[
                &["req", "-nodes"][..],
                &ec,
                &["-keyout", &p("server.key"), "-out", &p("server.csr")],
                &["-subj", "/CN=localhost"],
            ]
            .concat(),
        );
        std::fs::write(
            dir.join("server.ext"),
            "subjectAltName=IP:127.0.0.1,DNS:localhost\n",
        )
        .unwrap();
        openssl(&[
            "x509",
            "-req",
            "-days",
            "2",
            "-in",
            &p("server.csr"),
            "-CA",
            &p("ca.pem"),
            "-CAkey",
            &p("ca.key"),
            "-CAcreateserial",
            "-extfile",
            &p("server.ext"),
            "-out",
            &p("server.pem"),
        ]);
        Some(TestCa {
            ca: dir.join("ca.pem"),
            cert: dir.join("server.pem"),
            key: dir.join("server.key"),
        })
    }
}

fn openssl(args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A free loopback port (bound, then freed).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `openssl s_server` on a loopback port with the CA's server certificate.
pub struct TlsReceiver {
    pub port: u16,
    child: Child,
}

impl TlsReceiver {
    /// Started and accepting (its "ACCEPT" line read).
    pub fn start(ca: &TestCa) -> TlsReceiver {
        let port = free_port();
        let mut child = Command::new("openssl")
            .args(["s_server", "-www", "-accept"])
            .arg(format!("127.0.0.1:{port}"))
            .arg("-cert")
            .arg(&ca.cert)
            .arg("-key")
            .arg(&ca.key)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if line.contains("ACCEPT") {
                    let _ = tx.send(());
                }
            }
        });
        // A server that exits ends the reader and disconnects the channel.
        rx.recv_timeout(Duration::from_secs(30))
            .expect("openssl s_server did not start accepting");
        TlsReceiver { port, child }
    }
}

impl Drop for TlsReceiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
