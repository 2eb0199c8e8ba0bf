//! Build facts for `outboxd --version`: the target triple and the git commit
//! the binary was built from.
//!
//! The commit comes from `OUTBOXD_BUILD_COMMIT` when set (a packager building
//! from a tarball who knows it), else from git when this package is the top of
//! a git work tree, else it is "unknown" (a tarball without .git, or a copy
//! inside someone else's repository, whose commit would be the wrong one).
//!
//! The outputs are named apart from the input on purpose: cargo also puts
//! them in the environment of `cargo test` and `cargo run`, and a nested
//! build (tests/binary/release.rs runs scripts/release.sh) must not take them for
//! a packager's OUTBOXD_BUILD_COMMIT, which would rebuild the crate.

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    let target = std::env::var("TARGET").unwrap_or_else(|_| "unknown".into());
    println!("cargo:rustc-env=OUTBOXD_VERSION_TARGET={target}");
    println!("cargo:rerun-if-env-changed=OUTBOXD_BUILD_COMMIT");
    // Without any rerun-if-changed line cargo reruns this script whenever any
    // file of the package changes; with one, only for the files named.
    println!("cargo:rerun-if-changed=build.rs");
    let commit = std::env::var("OUTBOXD_BUILD_COMMIT")
        .ok()
        .map(|c| c.trim().to_string())
        .filter(|c| !c.is_empty())
        .or_else(git_commit)
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=OUTBOXD_VERSION_COMMIT={commit}");
}

/// The abbreviated commit of HEAD, when this package is a git work tree's
/// top. Names the files whose change means HEAD moved, so a new commit
/// rebuilds with the new id and nothing else does.
fn git_commit() -> Option<String> {
    let manifest_dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR")?);
    let top = git(&["rev-parse", "--show-toplevel"])?;
    if !same_dir(Path::new(&top), &manifest_dir) {
        return None;
    }
    let commit = git(&["rev-parse", "--short=12", "HEAD"])?;
    // HEAD (a checkout of another branch), the branch's ref (a commit on
    // it) and packed-refs (where a ref may live instead). `--git-path`
    // resolves each for a linked worktree too.
    let mut watched = vec!["HEAD".to_string(), "packed-refs".to_string()];
    if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
        watched.push(branch);
    }
    for name in watched {
        if let Some(path) = git(&["rev-parse", "--git-path", &name]) {
            // A path that does not exist would make cargo rerun this script
            // on every build.
            if Path::new(&path).exists() {
                println!("cargo:rerun-if-changed={path}");
            }
        }
    }
    Some(commit)
}

/// One line of git's output, or None when git is missing or fails (not a
/// repository, or one owned by another user).
fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let line = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (!line.is_empty()).then_some(line)
}

fn same_dir(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}
