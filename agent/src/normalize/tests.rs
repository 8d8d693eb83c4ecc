//! Normalizer tests: a grouped corpus of real-world statements, spellings
//! MariaDB's lexer reads in its own way, the kernel hash's contract,
//! hostile input, and property tests.

mod bad_input;
mod corpus;
mod grouping;
mod kernel_hash;
mod lexers;
mod properties;

use super::{Digest, digest_text};

/// The digest the aggregate stage gets for `sql`.
fn digest_of(sql: impl AsRef<[u8]>) -> Digest {
    Digest::from_text(&digest_text(sql.as_ref()))
}

/// Every corpus statement with the index of its group.
fn corpus_statements() -> impl Iterator<Item = (usize, &'static str)> {
    let groups = corpus::GROUPS.iter().enumerate();
    groups.flat_map(|(group, g)| g.statements.iter().map(move |sql| (group, *sql)))
}
