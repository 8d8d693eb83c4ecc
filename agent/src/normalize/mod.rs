//! SQL text -> digest text and digest id.
//!
//! Pure and synchronous: the aggregate stage calls it for every statement,
//! so results are cached by a hash of the raw text (prepared statements and
//! ORM traffic repeat their text exactly). Never fails and never panics:
//! anything sqlparser cannot tokenize (MariaDB-only syntax, truncated text,
//! invalid UTF-8) goes through a byte lexer that yields the same tokens.
//!
//! Rules, chosen to group statements the way the server's own
//! `events_statements_summary_by_digest` does (MariaDB 10.11; a test
//! compares the two):
//! - literals (numbers, strings, hex/bit values) and `NULL` used as a value
//!   become `?`; `IS [NOT] NULL`, `NOT NULL`, TRUE and FALSE stay words;
//! - a sign folds into the literal after it where MariaDB folds it (after
//!   `(`, `,`, a sign, SELECT, AND, OR, XOR, BETWEEN) and stays `- ?`
//!   elsewhere (`= -1`);
//! - a parenthesised list of two or more values becomes `(...)`, two or
//!   more rows (`VALUES (..),(..)`) become `(...) /* , ... */`, and two or
//!   more values in a row elsewhere (`SELECT 1, 2`, `LIMIT 5, 10`) `?, ...`;
//! - comments are dropped, optimizer hints (`/*+ ... */`) too; the body of
//!   an executable comment (`/*!50100 ... */`) is kept because the server
//!   runs it;
//! - keywords are upper-cased, identifiers keep their case and are quoted
//!   with backticks, whitespace is one space between tokens.
//!
//! Known differences from the server: hex strings `X'..'` group with other
//! literals (MariaDB keeps them apart as `(unknown)`), and function names
//! that are not sqlparser keywords keep their case (`now()` vs `NOW()`).
//!
//! `redact` is the other way out for statement text: samples and error
//! messages with their literal values replaced, in the statement's shape.

mod cache;
mod digest;
mod lexer;
pub mod redact;

use std::sync::Arc;

pub use cache::CacheStats;
use cache::TextCache;
pub use digest::MAX_DIGEST_TEXT;
pub use redact::Samples;

/// What a statement text normalizes to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Digest {
    /// Stable 64-bit hash of `text` (XXH3, seed 0): the same text gives the
    /// same id in every agent and version.
    pub id: u64,
    pub text: Arc<str>,
}

impl Digest {
    pub fn from_text(text: &str) -> Self {
        Self { id: xxhash_rust::xxh3::xxh3_64(text.as_bytes()), text: Arc::from(text) }
    }
}

/// Normalizer with a bounded cache of recent results.
pub struct Normalizer {
    cache: TextCache,
}

impl Normalizer {
    /// `cache_entries`: how many distinct raw texts to remember.
    pub fn new(cache_entries: usize) -> Self {
        Self { cache: TextCache::new(cache_entries) }
    }

    pub fn normalize(&mut self, raw: &[u8]) -> Digest {
        let key = xxhash_rust::xxh3::xxh3_128(raw);
        if let Some(hit) = self.cache.get(key) {
            return hit.clone();
        }
        let digest = Digest::from_text(&digest_text(raw));
        self.cache.insert(key, digest.clone());
        digest
    }

    pub fn cache_stats(&self) -> CacheStats {
        self.cache.stats()
    }
}

/// Digest text of one statement, without caching.
pub fn digest_text(raw: &[u8]) -> String {
    let tokens = match std::str::from_utf8(raw) {
        Ok(text) => lexer::tokenize_with_sqlparser(text).unwrap_or_else(|| lexer::tokenize_bytes(raw)),
        Err(_) => lexer::tokenize_bytes(raw),
    };
    digest::build(&tokens)
}

#[cfg(test)]
mod tests;
