//! Places in flight per key (a client address, a token, an agent): at
//! most `limit` taken at once for one key, each given back when its
//! `Place` is dropped. Keys with nothing in flight are forgotten, so the
//! map holds only what is in flight now.
use std::{
    collections::HashMap,
    hash::Hash,
    sync::{Arc, Mutex},
};

#[derive(Debug)]
pub struct Places<K: Eq + Hash + Clone> {
    limit: usize,
    held: Arc<Mutex<HashMap<K, usize>>>,
}

impl<K: Eq + Hash + Clone> Clone for Places<K> {
    fn clone(&self) -> Self {
        Places { limit: self.limit, held: self.held.clone() }
    }
}

impl<K: Eq + Hash + Clone> Places<K> {
    pub fn new(limit: usize) -> Places<K> {
        Places { limit: limit.max(1), held: Arc::default() }
    }

    pub fn limit(&self) -> usize {
        self.limit
    }

    /// A place for `key`, or None when `limit` are taken already.
    pub fn take(&self, key: K) -> Option<Place<K>> {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        let count = held.entry(key.clone()).or_default();
        if *count >= self.limit {
            return None;
        }
        *count += 1;
        Some(Place { key: Some(key), held: self.held.clone() })
    }
}

/// One taken place, given back on drop.
#[derive(Debug)]
pub struct Place<K: Eq + Hash + Clone> {
    key: Option<K>,
    held: Arc<Mutex<HashMap<K, usize>>>,
}

impl<K: Eq + Hash + Clone> Drop for Place<K> {
    fn drop(&mut self) {
        let Some(key) = self.key.take() else { return };
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(count) = held.get_mut(&key) {
            *count -= 1;
            if *count == 0 {
                held.remove(&key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn places_per_key_come_back_on_drop() {
        let places = Places::new(2);
        let a1 = places.take("a").unwrap();
        let _a2 = places.take("a").unwrap();
        assert!(places.take("a").is_none(), "a third place for one key");
        let _b = places.take("b").unwrap();
        drop(a1);
        let _a3 = places.take("a").unwrap();
        drop((_a2, _a3, _b));
        assert!(places.held.lock().unwrap().is_empty(), "keys with nothing in flight are forgotten");
    }
}
