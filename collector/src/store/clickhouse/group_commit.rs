//! Group commit: ClickHouse takes a few large inserts far better than many
//! small ones (each INSERT is a part on disk, merged later), so batches
//! that arrive while a group is being written wait and are written
//! together by the next group, each with its own outcome. No timer: a lone
//! batch is written at once, and groups grow only as the store falls
//! behind. A batch is acknowledged only after its group's records are
//! written and checked, as when stored alone.
//!
//! Each waiting caller sleeps on its own slot's condition variable, and a
//! finished group wakes only its own callers and the one caller that
//! writes next: with many pushes in flight, waking every waiter at every
//! group cost a context switch per waiter per group.
use std::{
    collections::{HashSet, VecDeque},
    panic::{AssertUnwindSafe, catch_unwind},
    sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError},
};

use sqlbee_proto::v1::Batch;

use super::{
    http::Client,
    write::{self, DataRows, Pending, identity_of},
};
use crate::store::{IngestOutcome, StoreError};

/// Batches one group carries at most.
const MAX_GROUP: usize = 64;

type Outcome = Result<IngestOutcome, StoreError>;

struct Slot {
    batch: Batch,
    received: i64,
    content_hash: u64,
    outcome: Mutex<Option<Outcome>>,
    /// Its caller waits here (with the queue's lock) for its outcome or
    /// for its turn to write.
    wake: Condvar,
}

#[derive(Default)]
struct Queue {
    waiting: VecDeque<Arc<Slot>>,
    /// A caller is writing a group.
    writing: bool,
    /// The row buffers the writer borrows, kept from group to group.
    rows: DataRows,
}

#[derive(Default)]
pub(super) struct GroupCommit {
    queue: Mutex<Queue>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl GroupCommit {
    /// Stores `batch` in the next group; the caller that finds no group
    /// being written writes one itself.
    pub(super) fn ingest(&self, db: &Client, batch: Batch, received: i64, content_hash: u64) -> Outcome {
        let slot = Arc::new(Slot { batch, received, content_hash, outcome: Mutex::new(None), wake: Condvar::new() });
        let mut queue = lock(&self.queue);
        queue.waiting.push_back(slot.clone());
        loop {
            if let Some(outcome) = lock(&slot.outcome).take() {
                return outcome;
            }
            if queue.writing {
                queue = slot.wake.wait(queue).unwrap_or_else(PoisonError::into_inner);
                continue;
            }
            queue.writing = true;
            let group = take_group(&mut queue.waiting);
            let mut rows = std::mem::take(&mut queue.rows);
            drop(queue);
            let pending: Vec<Pending<'_>> = group
                .iter()
                .map(|s| Pending { batch: &s.batch, received: s.received, content_hash: s.content_hash })
                .collect();
            let outcomes = catch_unwind(AssertUnwindSafe(|| write::ingest_group(db, &pending, &mut rows)))
                .unwrap_or_else(|_| group.iter().map(|_| Err(failed())).collect());
            for (s, outcome) in group.iter().zip(outcomes) {
                *lock(&s.outcome) = Some(outcome);
            }
            queue = lock(&self.queue);
            queue.rows = rows;
            queue.writing = false;
            // Under the queue's lock, after the outcomes are set: a caller
            // either sees its outcome or is already asleep on its slot.
            for s in &group {
                s.wake.notify_one();
            }
            if let Some(next) = queue.waiting.front() {
                next.wake.notify_one();
            }
        }
    }
}

fn failed() -> StoreError {
    StoreError::Backend { action: "ingest", source: "writing its group failed".into() }
}

/// The oldest waiting batches, one per identity (a second copy of one
/// waits for the next group, so the first copy's record decides it).
fn take_group(waiting: &mut VecDeque<Arc<Slot>>) -> Vec<Arc<Slot>> {
    let mut seen = HashSet::new();
    let mut group = Vec::new();
    let mut later = VecDeque::new();
    while let Some(slot) = waiting.pop_front() {
        if group.len() < MAX_GROUP && seen.insert(identity_of(&slot.batch)) {
            group.push(slot);
        } else {
            later.push_back(slot);
        }
    }
    *waiting = later;
    group
}
