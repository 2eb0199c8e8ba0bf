//! The real `outboxd` binary, one test binary (tests/README.md): its
//! commands and exit codes, `run` end to end with real sinks, the console
//! over HTTP and in a browser, and the release binaries.
//!
//!   cargo test --test binary                 # all of them
//!   cargo test --test binary cli_ops::       # one file's tests

mod common;

#[path = "binary/capture_cli.rs"]
mod capture_cli;
#[path = "binary/capture_console.rs"]
mod capture_console;
#[path = "binary/cli.rs"]
mod cli;
#[path = "binary/cli_ops.rs"]
mod cli_ops;
#[path = "binary/console.rs"]
mod console;
#[path = "binary/console_auth.rs"]
mod console_auth;
#[path = "binary/console_browser.rs"]
mod console_browser;
#[path = "binary/console_slow_clients.rs"]
mod console_slow_clients;
#[path = "binary/e2e_run.rs"]
mod e2e_run;
#[path = "binary/health_surfaces.rs"]
mod health_surfaces;
#[path = "binary/otlp.rs"]
mod otlp;
#[path = "binary/release.rs"]
mod release;
#[path = "binary/sinks_e2e.rs"]
mod sinks_e2e;
