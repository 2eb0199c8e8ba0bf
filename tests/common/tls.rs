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
    /// The server's certificate (PEM), signed by the CA, for 127.0.0.1
    /// and localhost.
    pub cert: PathBuf,
    /// The server's key (PEM).
    pub key: PathBuf,
    dir: PathBuf,
}

/// A P-256 key: quick to make.
const EC: [&str; 4] = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"];

impl TestCa {
    /// Makes one in `dir`; None (test skipped) without openssl outside CI.
    pub fn new(dir: &Path) -> Option<TestCa> {
        if !crate::common::available("openssl", &["version"]) {
            return None;
        }
        let (ca, ca_key) = (dir.join("ca.pem"), dir.join("ca.key"));
        openssl(
            &[
                &["req", "-x509", "-nodes", "-days", "2"][..],
                &EC,
                &["-keyout", path(&ca_key), "-out", path(&ca)],
                &["-subj", "/CN=outboxd-test-ca"],
                &["-addext", "basicConstraints=critical,CA:TRUE"],
                &["-addext", "keyUsage=critical,keyCertSign"],
            ]
            .concat(),
        );
        let mut made = TestCa {
            ca,
            cert: PathBuf::new(),
            key: PathBuf::new(),
            dir: dir.to_path_buf(),
        };
        (made.cert, made.key) = made.issue("server", "IP:127.0.0.1,DNS:localhost");
        Some(made)
    }

    /// A certificate and key the CA signs, for the subject alternative
    /// names `san` (`DNS:elsewhere.test`), as `NAME.pem` and `NAME.key`.
    pub fn issue(&self, name: &str, san: &str) -> (PathBuf, PathBuf) {
        let file = |ext: &str| self.dir.join(format!("{name}.{ext}"));
        let (cert, key, csr, ext) = (file("pem"), file("key"), file("csr"), file("ext"));
        openssl(
            &[
                &["req", "-nodes"][..],
                &EC,
                &["-keyout", path(&key), "-out", path(&csr)],
                &["-subj", "/CN=outboxd-test-server"],
            ]
            .concat(),
        );
        std::fs::write(&ext, format!("subjectAltName={san}\n")).unwrap();
        let ca_key = self.dir.join("ca.key");
        openssl(&[
            "x509",
            "-req",
            "-days",
            "2",
            "-in",
            path(&csr),
            "-CA",
            path(&self.ca),
            "-CAkey",
            path(&ca_key),
            "-CAcreateserial",
            "-extfile",
            path(&ext),
            "-out",
            path(&cert),
        ]);
        (cert, key)
    }
}

fn path(p: &Path) -> &str {
    p.to_str().unwrap()
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
