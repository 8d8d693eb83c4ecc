//! Store work that ends with the request it serves. A store call runs on a
//! blocking thread, which goes on when the request that started it is
//! dropped (a client gone, a deadline passed). The caller runs the call
//! inside a [`Cancel`] scope and cancels it when dropped; a backend, while
//! it holds a resource another call waits for (SQLite's read connection),
//! registers how to stop its work ([`on_cancel`]), and checks
//! [`cancelled`] before it starts. Backend-neutral: it names no backend.
use std::{
    cell::RefCell,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
};

type Hook = Box<dyn Fn() + Send>;

/// One request's store work: cancelled once, from any thread.
#[derive(Default)]
pub struct Cancel {
    cancelled: AtomicBool,
    next_id: AtomicU64,
    hooks: Mutex<Vec<(u64, Hook)>>,
}

thread_local! {
    static CURRENT: RefCell<Option<Arc<Cancel>>> = const { RefCell::new(None) };
}

impl Cancel {
    /// Stops the work: every registered hook runs, and later checks see it.
    pub fn cancel(&self) {
        self.cancelled.store(true, Ordering::SeqCst);
        for (_, hook) in self.hooks.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            hook();
        }
    }

    /// Runs `work` on this thread inside the scope of `cancel`.
    pub fn run<T>(cancel: Arc<Cancel>, work: impl FnOnce() -> T) -> T {
        let before = CURRENT.with(|c| c.replace(Some(cancel)));
        let out = work();
        CURRENT.with(|c| *c.borrow_mut() = before);
        out
    }
}

/// Whether the work this thread runs for was cancelled (false outside a
/// scope: pruning and rollups run to their end).
pub fn cancelled() -> bool {
    CURRENT.with(|c| c.borrow().as_ref().is_some_and(|c| c.cancelled.load(Ordering::SeqCst)))
}

/// Whether this thread runs work for a request (inside a scope).
pub fn in_scope() -> bool {
    CURRENT.with(|c| c.borrow().is_some())
}

/// While held, a cancel of this thread's scope runs `hook`; dropping it
/// unregisters the hook, so a cancel after the work ended stops nothing
/// that belongs to another call.
pub struct Registration {
    scope: Option<(Arc<Cancel>, u64)>,
}

impl Drop for Registration {
    fn drop(&mut self) {
        if let Some((scope, id)) = self.scope.take() {
            scope.hooks.lock().unwrap_or_else(|e| e.into_inner()).retain(|(i, _)| *i != id);
        }
    }
}

/// Registers `hook` with this thread's scope (a no-op outside one). If the
/// scope is cancelled already, the hook runs at once.
pub fn on_cancel(hook: impl Fn() + Send + 'static) -> Registration {
    let Some(scope) = CURRENT.with(|c| c.borrow().clone()) else { return Registration { scope: None } };
    let id = scope.next_id.fetch_add(1, Ordering::Relaxed);
    scope.hooks.lock().unwrap_or_else(|e| e.into_inner()).push((id, Box::new(hook)));
    if scope.cancelled.load(Ordering::SeqCst) {
        for (_, hook) in scope.hooks.lock().unwrap_or_else(|e| e.into_inner()).iter().filter(|(i, _)| *i == id) {
            hook();
        }
    }
    Registration { scope: Some((scope, id)) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cancel_reaches_the_hooks_registered_in_its_scope_only_while_held() {
        let cancel = Arc::new(Cancel::default());
        let hits = Arc::new(AtomicU64::new(0));
        let (during, after) = (hits.clone(), hits.clone());
        Cancel::run(cancel.clone(), || {
            let held = on_cancel(move || {
                during.fetch_add(1, Ordering::SeqCst);
            });
            assert!(!cancelled());
            cancel.cancel();
            assert!(cancelled());
            drop(held);
            let _late = on_cancel(move || {
                after.fetch_add(10, Ordering::SeqCst);
            });
        });
        assert_eq!(hits.load(Ordering::SeqCst), 11, "the held hook ran once; one registered after the cancel at once");
        assert!(!cancelled(), "outside the scope");
        cancel.cancel();
        assert_eq!(hits.load(Ordering::SeqCst), 11, "dropped registrations are gone");
    }
}
