//! Envelope JSON from anywhere (a queue, a replay file): decoding never
//! panics, and whatever decodes survives a round trip unchanged.
#![no_main]

use libfuzzer_sys::fuzz_target;
use outboxd::Envelope;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(env) = serde_json::from_str::<Envelope>(text) {
        let again: Envelope =
            serde_json::from_str(&env.to_json()).expect("an envelope's own JSON decodes");
        assert_eq!(again, env, "round trip changed the envelope");
    }
});
