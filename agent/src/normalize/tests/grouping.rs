//! The corpus groups: one digest within a group, distinct digests across
//! groups, and the exact text where the corpus pins it.
use std::collections::HashMap;

use super::corpus::GROUPS;
use super::{Digest, corpus_statements, digest_of};

/// Fails with every offending line at once, so one run shows the whole
/// picture after a change to the normalizer.
fn assert_none(failures: Vec<String>, what: &str) {
    assert!(failures.is_empty(), "{} {what}:\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn corpus_is_large_and_pins_enough_texts() {
    assert!(corpus_statements().count() >= 220);
    assert!(GROUPS.iter().filter(|g| g.text.is_some()).count() >= 40);
    assert!(GROUPS.iter().all(|g| !g.statements.is_empty()));
}

#[test]
fn statements_of_a_group_share_a_digest() {
    let mut failures = Vec::new();
    for group in GROUPS {
        let first = digest_of(group.statements[0]);
        for sql in &group.statements[1..] {
            let digest = digest_of(sql);
            if digest != first {
                let (head, head_text) = (group.statements[0], &first.text);
                failures.push(format!("  {sql:?}\n    => {}\n  but {head:?}\n    => {head_text}", digest.text));
            }
        }
    }
    assert_none(failures, "statements split from their group");
}

#[test]
fn different_groups_have_different_digests() {
    // Every statement, not one per group: a statement that drifted out of
    // its group must not land in another one either.
    let mut owner: HashMap<u64, (usize, &str)> = HashMap::new();
    let mut failures = Vec::new();
    for (group, sql) in corpus_statements() {
        let digest = digest_of(sql);
        let &mut (owner_group, owner_sql) = owner.entry(digest.id).or_insert((group, sql));
        if owner_group != group {
            failures.push(format!("  {sql:?}\n  and {owner_sql:?}\n    => {}", digest.text));
        }
    }
    assert_none(failures, "statements grouped across groups");
}

#[test]
fn pinned_digest_texts() {
    let mut failures = Vec::new();
    for group in GROUPS {
        let Some(expected) = group.text else { continue };
        for sql in group.statements {
            let text = digest_of(sql).text;
            if &*text != expected {
                failures.push(format!("  {sql:?}\n    => {text}\n  expected {expected}"));
            }
        }
    }
    assert_none(failures, "unexpected digest texts");
}

#[test]
fn digest_id_is_a_stable_hash_of_the_text() {
    // Ids are compared across agents and versions: pin one value so a change
    // of hash function or seed cannot go unnoticed.
    assert_eq!(Digest::from_text("SELECT ?").id, 0xa3a8_f2b7_cf2a_1b0e);
    assert_eq!(digest_of("SELECT 1").id, Digest::from_text("SELECT ?").id);
}
