//! Reading a caught panic: the worker reports a panicking consumer with
//! it, and the handle a panicked writer thread.

/// The text a panic carried (`panic!("…")` gives a `&str` or a `String`).
pub(crate) fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a non-string panic payload".into())
}
