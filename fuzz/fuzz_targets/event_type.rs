//! EventType::parse never panics; what it accepts is canonical (parses to
//! itself) and its version agrees with its suffix.
#![no_main]

use libfuzzer_sys::fuzz_target;
use outboxd::EventType;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(t) = EventType::parse(text) {
        assert_eq!(t.as_str(), text);
        let again = EventType::parse(t.as_str()).expect("an accepted type parses again");
        assert_eq!(again, t);
        assert!(t.as_str().ends_with(&format!(".v{}", t.version())));
        assert!(!t.name().is_empty());
    }
});
