//! One store call at a time per reader: a reader (a client address) waits
//! for its own previous call before it may take one of the UI's places,
//! so a script looping heavy `/api/top` reads holds at most one of them
//! and another user's page finds the other. A turn is given back with the
//! store work it allowed, not with the request (see `store_task`).
use std::{
    collections::HashMap,
    net::IpAddr,
    sync::{Arc, Mutex},
};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

tokio::task_local! {
    /// The address of the reader whose request is being answered.
    static READER: IpAddr;
}

/// Runs `request` as `reader`'s: the UI's store calls in it wait their
/// reader's turn.
pub async fn as_reader<F: Future>(reader: IpAddr, request: F) -> F::Output {
    READER.scope(reader, request).await
}

/// Forgotten readers are swept once the map holds this many: readers with
/// nothing in flight hold no turn, and the UI's connections (256) bound
/// those that do.
const SWEEP_ABOVE: usize = 1024;

#[derive(Default)]
pub struct Turns {
    readers: Mutex<HashMap<IpAddr, Arc<Semaphore>>>,
}

impl Turns {
    /// The current reader's turn, once its previous call ended; None
    /// outside a reader's request (pages rendered in process by tests).
    pub async fn take(&self) -> Option<OwnedSemaphorePermit> {
        let reader = READER.try_with(|r| *r).ok()?;
        let gate = {
            let mut readers = self.readers.lock().unwrap_or_else(|e| e.into_inner());
            if readers.len() >= SWEEP_ABOVE {
                // Only the map holds an idle reader's gate.
                readers.retain(|_, gate| Arc::strong_count(gate) > 1);
            }
            readers.entry(reader).or_insert_with(|| Arc::new(Semaphore::new(1))).clone()
        };
        gate.acquire_owned().await.ok()
    }

    #[cfg(test)]
    fn known(&self) -> usize {
        self.readers.lock().unwrap().len()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn a_reader_waits_for_its_own_turn_and_not_for_another() {
        let turns = Arc::new(Turns::default());
        let (a, b): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        let first = as_reader(a, turns.take()).await.expect("a turn");
        let waiting = tokio::spawn({
            let turns = turns.clone();
            as_reader(a, async move { turns.take().await.map(|_| ()) })
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiting.is_finished(), "the same reader waits");
        assert!(as_reader(b, turns.take()).await.is_some(), "another reader does not");
        drop(first);
        tokio::time::timeout(Duration::from_secs(5), waiting).await.unwrap().unwrap().expect("its turn came");
        assert!(turns.take().await.is_none(), "no reader, no turn");
    }

    #[tokio::test]
    async fn idle_readers_are_swept() {
        let turns = Turns::default();
        for n in 0..(SWEEP_ABOVE as u32 + 10) {
            let reader = IpAddr::from(n.to_be_bytes());
            let _ = as_reader(reader, turns.take()).await;
        }
        assert!(turns.known() <= SWEEP_ABOVE, "{}", turns.known());
    }
}
