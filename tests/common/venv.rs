//! A Python virtual environment with packages from PyPI, created once and
//! kept under the target directory (keyed by what it holds), so only the
//! first run of a test pays for `pip install`.
//!
//! Outside CI, when the venv cannot be made (no python3-venv, no network)
//! the caller skips its test with a message; under .ci/run (OUTBOXD_CI=1)
//! that fails it (`common::missing`).

use std::path::{Path, PathBuf};
use std::process::Command;

/// The python of a venv holding `requirement` (a pip requirement such as
/// `Django~=5.2.0`), made if missing; `check` is Python code that must run
/// in it (an import). None (test skipped) when it cannot be made outside CI.
pub fn python_with(requirement: &str, check: &str) -> Option<PathBuf> {
    let key: String = requirement
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' {
                c
            } else {
                '-'
            }
        })
        .collect();
    let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("venv-{key}"));
    let python = root.join("bin/python");
    let works = |python: &Path| {
        Command::new(python)
            .args(["-c", check])
            .output()
            .is_ok_and(|o| o.status.success())
    };
    // Tests of one binary run on threads of one process: one builds, the
    // others wait for it and then find the venv made.
    static BUILDING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _building = BUILDING.lock().unwrap_or_else(|e| e.into_inner());
    if works(&python) {
        return Some(python);
    }
    // Build beside, then rename: a half-made venv is never taken for a
    // made one, and two tests building at once both end with a good one.
    let partial = root.with_extension(format!("partial-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&partial);
    let made = run(Command::new("python3").args(["-m", "venv"]).arg(&partial)).and_then(|()| {
        run(Command::new(partial.join("bin/pip")).args([
            "install",
            "--quiet",
            "--disable-pip-version-check",
            requirement,
        ]))
    });
    match made {
        Ok(()) => {
            if std::fs::rename(&partial, &root).is_err() {
                let _ = std::fs::remove_dir_all(&partial); // another test won the race
            }
            // A venv's scripts name its own path: use the final one.
            if works(&python) {
                return Some(python);
            }
            fail(&format!(
                "the venv at {} does not run {check:?}",
                root.display()
            ))
        }
        Err(e) => {
            let _ = std::fs::remove_dir_all(&partial);
            fail(&format!("cannot make a venv with {requirement}: {e}"))
        }
    }
}

fn run(cmd: &mut Command) -> Result<(), String> {
    let out = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{cmd:?} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Skip outside CI, fail in CI (tests/common: the includer declares `mod
/// common`).
fn fail(why: &str) -> Option<PathBuf> {
    crate::common::missing(&format!("{why} (python3-venv and PyPI are needed)"));
    None
}
