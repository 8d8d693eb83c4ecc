//! Bounded cache of normalization results keyed by a 128-bit hash of the raw
//! text. Two generations: when the young one is full it becomes the old one
//! and the previous old one is dropped, so memory is bounded by twice the
//! generation size and every operation is O(1).
use std::collections::HashMap;

use super::Digest;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    pub hits: u64,
    pub misses: u64,
    pub entries: usize,
}

pub struct TextCache {
    young: HashMap<u128, Digest>,
    old: HashMap<u128, Digest>,
    generation: usize,
    hits: u64,
    misses: u64,
}

impl TextCache {
    pub fn new(entries: usize) -> Self {
        let generation = (entries / 2).max(1);
        Self { young: HashMap::new(), old: HashMap::new(), generation, hits: 0, misses: 0 }
    }

    pub fn get(&mut self, key: u128) -> Option<&Digest> {
        if self.young.contains_key(&key) {
            self.hits += 1;
            return self.young.get(&key);
        }
        if let Some(found) = self.old.remove(&key) {
            self.hits += 1;
            self.insert_young(key, found);
            return self.young.get(&key);
        }
        self.misses += 1;
        None
    }

    pub fn insert(&mut self, key: u128, digest: Digest) {
        self.insert_young(key, digest);
    }

    fn insert_young(&mut self, key: u128, digest: Digest) {
        if self.young.len() >= self.generation {
            self.old = std::mem::take(&mut self.young);
        }
        self.young.insert(key, digest);
    }

    pub fn stats(&self) -> CacheStats {
        CacheStats { hits: self.hits, misses: self.misses, entries: self.young.len() + self.old.len() }
    }
}
