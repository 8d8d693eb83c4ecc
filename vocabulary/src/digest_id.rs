//! What a digest id is, for the agent that makes it and the collector that
//! checks it: XXH3-64 (seed 0) of the digest text, so the same text has the
//! same id in every agent and version, and an id cannot be sent under
//! another statement's text.

/// The id of the row that counts statements past an agent's digest limit:
/// not a hash, so no text can collide with it.
pub const OVERFLOW_ID: u64 = 0;
/// The text the overflow row carries; the only text id 0 may have.
pub const OVERFLOW_TEXT: &str = "(overflow: digest limit reached)";

/// The id of `text`.
pub fn of(text: &str) -> u64 {
    xxhash_rust::xxh3::xxh3_64(text.as_bytes())
}

/// Whether `id` may be sent with `text`.
pub fn matches(id: u64, text: &str) -> bool {
    if id == OVERFLOW_ID { text == OVERFLOW_TEXT } else { id == of(text) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_is_the_hash_of_its_text() {
        assert_eq!(of("SELECT ?"), 0xa3a8_f2b7_cf2a_1b0e);
        assert!(matches(of("SELECT ?"), "SELECT ?"));
        assert!(!matches(of("SELECT ?"), "SELECT ? FROM t"));
        assert!(matches(OVERFLOW_ID, OVERFLOW_TEXT));
        assert!(!matches(OVERFLOW_ID, "SELECT ?"));
    }
}
