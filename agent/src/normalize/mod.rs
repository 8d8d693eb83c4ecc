//! SQL text -> digest text and digest id.
//!
//! Pure and synchronous: the aggregate stage calls it for every statement,
//! so results are cached by a hash of the raw text (prepared statements and
//! ORM traffic repeat their text exactly). Never fails and never panics:
//! any bytes (invalid UTF-8, a statement cut at the capture limit) give a
//! digest.
//!
//! Statements are grouped the way the server's own digests
//! (`events_statements_summary_by_digest`) group them: the text is read as
//! MariaDB's lexer reads it (`lexer`, with MariaDB's keywords in
//! `keywords`) and reduced as the server reduces its tokens (`digest`).
//! So literals become `?`, lists and rows of them collapse, keywords are
//! upper case, names keep their case in backquotes, comments go but the
//! body of an executable comment (`/*!50100 ... */`) stays, and `@a` and
//! `@b` share a digest (`@?`) as they do in the server. A test compares the
//! grouping with a real server's on thousands of statements of MariaDB's
//! own test suite (`agent/tests/digest_agreement.rs`).
//!
//! The kernel's text hash (`sqlbee_kernel_abi::text_hash`) groups statements
//! before they reach the normalizer; it may split what the normalizer
//! groups, never merge what it keeps apart.
//!
//! `tags` reads what frameworks write about a statement in its comments
//! (sqlcommenter, marginalia) before the digest drops them.
//!
//! `changes` reads which statements change the server rather than its
//! rows (schema, settings, privileges, ...), and what they name.
//!
//! `redact` is the other way out for statement text: samples and error
//! messages with their literal values replaced, in the statement's shape.

mod bind;
mod cache;
mod changes;
mod digest;
mod keywords;
mod lexer;
pub mod redact;
mod tables;
pub mod tags;

use std::sync::Arc;

pub use bind::bind;
pub use cache::CacheStats;
use cache::TextCache;
pub use changes::{Change, ChangeKind, change_of};
pub use digest::MAX_DIGEST_TEXT;
pub use redact::Samples;
pub use tables::{Describer, TableUse, Tables, tables_of};
pub use tags::{QueryTags, TagReader, Trace};

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
        Self { id: sqlbee_vocabulary::digest_id::of(text), text: Arc::from(text) }
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

/// MariaDB's keywords as the normalizer knows them: each word, upper case,
/// and whether it is one only right before `(` (`COUNT(`). A test compares
/// them with a server's `information_schema.KEYWORDS`.
pub fn keyword_list() -> impl Iterator<Item = (&'static str, bool)> {
    keywords::WORDS.iter().map(|&(word, _, function_only)| (word, function_only))
}

/// Digest text of one statement, without caching.
pub fn digest_text(raw: &[u8]) -> String {
    digest::build(raw)
}

#[cfg(test)]
mod tests;
