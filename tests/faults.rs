//! Faults, one test binary (tests/README.md): storage faults through a
//! fault-injecting VFS, `outboxd run` on a hostile machine, the memory
//! each sink needs (VmHWM, `prlimit --as`), and producers contending with
//! a relay. The kill -9 suites have mains of their own
//! (process_faults.rs, exactly_once.rs).
//!
//!   cargo test --test faults                 # all of them
//!   cargo test --test faults storage_faults::

mod common;

#[path = "faults/host_contention.rs"]
mod host_contention;
#[path = "faults/liveness.rs"]
mod liveness;
#[path = "faults/run_faults.rs"]
mod run_faults;
#[path = "faults/sink_memory.rs"]
mod sink_memory;
#[path = "faults/storage_faults.rs"]
mod storage_faults;
