//! A prepared statement's text with the values it ran with in place of its
//! `?` placeholders: a statement EXPLAIN takes. Placeholders are found
//! with the normalizer's lexer, so a `?` in a string or a comment stays.
use super::lexer::{Lexer, Tok};

/// The text with each placeholder replaced by the literal in its place;
/// None unless there are exactly as many literals as placeholders.
pub fn bind(text: &[u8], literals: &[String]) -> Option<Vec<u8>> {
    let mut bound = Vec::with_capacity(text.len() + literals.iter().map(String::len).sum::<usize>());
    let mut literals = literals.iter();
    let mut lexer = Lexer::new(text);
    let mut copied = 0;
    while let Some(token) = lexer.next() {
        let end = lexer.position();
        if token == Tok::Value && end > copied && text[end - 1] == b'?' {
            bound.extend_from_slice(&text[copied..end - 1]);
            bound.extend_from_slice(literals.next()?.as_bytes());
            copied = end;
        }
    }
    if literals.next().is_some() {
        return None;
    }
    bound.extend_from_slice(&text[copied..]);
    Some(bound)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn literals(values: &[&str]) -> Vec<String> {
        values.iter().map(|v| v.to_string()).collect()
    }

    #[test]
    fn each_placeholder_takes_its_value_in_order() {
        let text = b"SELECT c FROM t WHERE id = ? AND k IN (?,?) -- why?\n /* ? */ AND s = '?'";
        let bound = bind(text, &literals(&["7", "'a'", "NULL"])).unwrap();
        assert_eq!(
            String::from_utf8(bound).unwrap(),
            "SELECT c FROM t WHERE id = 7 AND k IN ('a',NULL) -- why?\n /* ? */ AND s = '?'"
        );
    }

    #[test]
    fn a_count_that_does_not_match_binds_nothing() {
        assert_eq!(bind(b"SELECT ? + ?", &literals(&["1"])), None);
        assert_eq!(bind(b"SELECT ?", &literals(&["1", "2"])), None);
        assert_eq!(bind(b"SELECT 1", &[]).as_deref(), Some(&b"SELECT 1"[..]));
    }
}
