//! Connection pool: one live connection per host, reused for probes and phases.
//!
//! - `get_or_dial` returns the pooled connection for a key if it is still open and was dialled
//!   for the same target identity (address, port, user, key, jump); otherwise it dials a new one.
//!   Dials for one key are serialised, so concurrent callers share one connection.
//! - A connection unused for `idle_timeout` is closed (swept on every access and by a background
//!   reaper task when the pool is created inside a tokio runtime).
//! - At most `max_connections` are kept: after a dial the least recently used *idle* connections
//!   are closed. Connections with a call in flight are never evicted, so the cap can be exceeded
//!   while that many calls run at once (fleet-wide concurrency is bounded upstream).

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::time::Instant;

/// What the pool needs to know about a connection.
pub trait Pooled: Send + Sync + 'static {
    /// Still usable (not closed by either side).
    fn is_open(&self) -> bool;
    /// Close it (best effort, must not block).
    fn close(&self);
}

#[derive(Clone, Copy, Debug)]
pub struct PoolConfig {
    pub idle_timeout: Duration,
    pub max_connections: usize,
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            idle_timeout: Duration::from_secs(300),
            max_connections: 4096,
        }
    }
}

struct Entry<C> {
    conn: Arc<C>,
    identity: u64,
    last_used: Instant,
}

struct Inner<C> {
    entries: HashMap<String, Entry<C>>,
    dial_locks: HashMap<String, Arc<tokio::sync::Mutex<()>>>,
}

struct Shared<C> {
    config: PoolConfig,
    inner: Mutex<Inner<C>>,
}

/// See the module documentation.
pub struct Pool<C: Pooled> {
    shared: Arc<Shared<C>>,
}

/// Whether the connection returned by [`Pool::get_or_dial`] was reused or freshly dialled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    Reused,
    Dialled,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl<C: Pooled> Shared<C> {
    /// Close idle connections past the idle timeout and dead ones.
    fn sweep(&self, now: Instant) {
        let mut closing = Vec::new();
        {
            let mut inner = lock(&self.inner);
            let idle = self.config.idle_timeout;
            inner.entries.retain(|_, e| {
                let in_use = Arc::strong_count(&e.conn) > 1;
                let keep = e.conn.is_open() && (in_use || now.duration_since(e.last_used) < idle);
                if !keep {
                    closing.push(e.conn.clone());
                }
                keep
            });
            // Every SSH call sweeps: a lookup per lock, not a copy of every key searched
            // once per lock (quadratic in the pooled connections).
            let Inner {
                entries,
                dial_locks,
            } = &mut *inner;
            dial_locks.retain(|k, l| Arc::strong_count(l) > 1 || entries.contains_key(k));
        }
        for c in closing {
            c.close();
        }
    }

    /// Evict least recently used idle connections beyond the cap, sparing `keep`.
    fn enforce_cap(&self, keep: &str) {
        let mut closing = Vec::new();
        {
            let mut inner = lock(&self.inner);
            while inner.entries.len() > self.config.max_connections {
                let victim = inner
                    .entries
                    .iter()
                    .filter(|(k, e)| k.as_str() != keep && Arc::strong_count(&e.conn) == 1)
                    .min_by_key(|(_, e)| e.last_used)
                    .map(|(k, _)| k.clone());
                let Some(victim) = victim else { break };
                if let Some(e) = inner.entries.remove(&victim) {
                    closing.push(e.conn);
                }
            }
        }
        for c in closing {
            c.close();
        }
    }
}

impl<C: Pooled> Pool<C> {
    pub fn new(config: PoolConfig) -> Self {
        let shared = Arc::new(Shared {
            config,
            inner: Mutex::new(Inner {
                entries: HashMap::new(),
                dial_locks: HashMap::new(),
            }),
        });
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let weak: Weak<Shared<C>> = Arc::downgrade(&shared);
            let period = (config.idle_timeout / 4)
                .clamp(Duration::from_millis(100), Duration::from_secs(30));
            rt.spawn(async move {
                let mut tick = tokio::time::interval(period);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tick.tick().await;
                    let Some(shared) = weak.upgrade() else { break };
                    shared.sweep(Instant::now());
                }
            });
        }
        Pool { shared }
    }

    pub fn config(&self) -> PoolConfig {
        self.shared.config
    }

    /// The pooled connection for `key` if it is open and has the same `identity`, else the
    /// result of `dial` (which is then pooled).
    pub async fn get_or_dial<E, F, Fut>(
        &self,
        key: &str,
        identity: u64,
        dial: F,
    ) -> Result<(Arc<C>, Origin), E>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<C, E>>,
    {
        self.shared.sweep(Instant::now());
        let dial_lock = {
            let mut inner = lock(&self.shared.inner);
            inner
                .dial_locks
                .entry(key.to_string())
                .or_insert_with(|| Arc::new(tokio::sync::Mutex::new(())))
                .clone()
        };
        let _guard = dial_lock.lock().await;
        let stale = {
            let mut inner = lock(&self.shared.inner);
            match inner.entries.get_mut(key) {
                Some(e) if e.identity == identity && e.conn.is_open() => {
                    e.last_used = Instant::now();
                    return Ok((e.conn.clone(), Origin::Reused));
                }
                Some(_) => inner.entries.remove(key).map(|e| e.conn),
                None => None,
            }
        };
        if let Some(old) = stale {
            old.close();
        }
        let conn = Arc::new(dial().await?);
        {
            let mut inner = lock(&self.shared.inner);
            if let Some(old) = inner.entries.insert(
                key.to_string(),
                Entry {
                    conn: conn.clone(),
                    identity,
                    last_used: Instant::now(),
                },
            ) {
                old.conn.close();
            }
        }
        self.shared.enforce_cap(key);
        Ok((conn, Origin::Dialled))
    }

    /// Whether a call for `key` with `identity` would reuse a pooled connection now, i.e.
    /// [`Pool::get_or_dial`] would not dial: an open connection for the same identity that is
    /// in use or was used within the idle timeout. A cheap read (no sweep, no lock held
    /// across an await); the answer can be stale by the time the call runs (the connection
    /// evicted or found dead meanwhile), so it is a hint for pacing, never a promise.
    pub fn holds(&self, key: &str, identity: u64) -> bool {
        let now = Instant::now();
        let idle = self.shared.config.idle_timeout;
        lock(&self.shared.inner).entries.get(key).is_some_and(|e| {
            e.identity == identity
                && e.conn.is_open()
                && (Arc::strong_count(&e.conn) > 1 || now.duration_since(e.last_used) < idle)
        })
    }

    /// Mark `key` as used now (call when a call on its connection finishes).
    pub fn touch(&self, key: &str) {
        if let Some(e) = lock(&self.shared.inner).entries.get_mut(key) {
            e.last_used = Instant::now();
        }
    }

    /// Close and drop the connection for `key`, if any.
    pub fn forget(&self, key: &str) {
        let old = lock(&self.shared.inner).entries.remove(key);
        if let Some(e) = old {
            e.conn.close();
        }
    }

    /// Drop `key` only if it still holds `conn` (a caller found that connection broken).
    pub fn forget_if(&self, key: &str, conn: &Arc<C>) {
        let old = {
            let mut inner = lock(&self.shared.inner);
            match inner.entries.get(key) {
                Some(e) if Arc::ptr_eq(&e.conn, conn) => inner.entries.remove(key),
                _ => None,
            }
        };
        if let Some(e) = old {
            e.conn.close();
        }
    }

    /// Number of pooled connections (open or not yet swept).
    pub fn len(&self) -> usize {
        lock(&self.shared.inner).entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Close idle and dead connections now.
    pub fn sweep(&self) {
        self.shared.sweep(Instant::now());
    }
}

impl<C: Pooled> Drop for Pool<C> {
    fn drop(&mut self) {
        let entries: Vec<_> = lock(&self.shared.inner).entries.drain().collect();
        for (_, e) in entries {
            e.conn.close();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    #[derive(Debug)]
    struct Fake {
        open: Arc<AtomicBool>,
    }
    impl Pooled for Fake {
        fn is_open(&self) -> bool {
            self.open.load(Ordering::SeqCst)
        }
        fn close(&self) {
            self.open.store(false, Ordering::SeqCst);
        }
    }
    fn fake() -> Result<Fake, ()> {
        Ok(Fake {
            open: Arc::new(AtomicBool::new(true)),
        })
    }
    /// A fake plus a flag that tells whether it is still open, without holding the connection.
    fn observed() -> (
        Arc<AtomicBool>,
        impl FnOnce() -> std::future::Ready<Result<Fake, ()>>,
    ) {
        let flag = Arc::new(AtomicBool::new(true));
        let f = flag.clone();
        (flag, move || std::future::ready(Ok(Fake { open: f })))
    }

    fn pool(max: usize, idle: u64) -> Pool<Fake> {
        Pool::new(PoolConfig {
            idle_timeout: Duration::from_secs(idle),
            max_connections: max,
        })
    }

    #[tokio::test(start_paused = true)]
    async fn reuses_and_redials_when_broken_or_changed() {
        let p = pool(10, 60);
        let dials = AtomicUsize::new(0);
        let dial = || async {
            dials.fetch_add(1, Ordering::SeqCst);
            fake()
        };
        let (a, o) = p.get_or_dial("h", 1, dial).await.expect("dial");
        assert_eq!(o, Origin::Dialled);
        let (b, o) = p.get_or_dial("h", 1, dial).await.expect("dial");
        assert_eq!(o, Origin::Reused);
        assert!(Arc::ptr_eq(&a, &b));
        a.close();
        drop((a, b));
        let (c, o) = p.get_or_dial("h", 1, dial).await.expect("dial");
        assert_eq!(o, Origin::Dialled);
        let (_, o) = p.get_or_dial("h", 2, dial).await.expect("dial");
        assert_eq!(o, Origin::Dialled);
        assert!(!c.is_open(), "identity change closes the old connection");
        assert_eq!(dials.load(Ordering::SeqCst), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn idle_connections_are_closed() {
        let p = pool(10, 60);
        let (a, _) = p.get_or_dial("h", 1, || async { fake() }).await.expect("d");
        let (b, _) = p
            .get_or_dial("busy", 1, || async { fake() })
            .await
            .expect("d");
        drop(a);
        tokio::time::sleep(Duration::from_secs(61)).await;
        p.sweep();
        assert_eq!(p.len(), 1, "the idle one went, the busy one stayed");
        assert!(b.is_open());
    }

    #[tokio::test(start_paused = true)]
    async fn lru_eviction_spares_busy_connections() {
        let p = pool(2, 600);
        let (h1, d1) = observed();
        let (h2, d2) = observed();
        drop(p.get_or_dial("h1", 1, d1).await.expect("d"));
        tokio::time::sleep(Duration::from_secs(1)).await;
        let (busy, _) = p.get_or_dial("h2", 1, d2).await.expect("d");
        tokio::time::sleep(Duration::from_secs(1)).await;
        drop(
            p.get_or_dial("h3", 1, || async { fake() })
                .await
                .expect("d"),
        );
        assert_eq!(p.len(), 2);
        assert!(
            !h1.load(Ordering::SeqCst),
            "least recently used idle connection evicted"
        );
        assert!(h2.load(Ordering::SeqCst));
        tokio::time::sleep(Duration::from_secs(1)).await;
        drop(
            p.get_or_dial("h4", 1, || async { fake() })
                .await
                .expect("d"),
        );
        assert_eq!(p.len(), 2);
        assert!(busy.is_open(), "in-use connection is never evicted");
    }

    #[tokio::test(start_paused = true)]
    async fn holds_tells_whether_a_call_would_dial() {
        let p = pool(10, 60);
        assert!(!p.holds("h", 1), "nothing pooled yet");
        drop(p.get_or_dial("h", 1, || async { fake() }).await.expect("d"));
        assert!(p.holds("h", 1));
        assert!(!p.holds("h", 2), "another identity dials");
        assert!(!p.holds("other", 1));
        tokio::time::sleep(Duration::from_secs(61)).await;
        assert!(
            !p.holds("h", 1),
            "idle past the timeout: the next call dials"
        );
        let (c, _) = p.get_or_dial("h", 1, || async { fake() }).await.expect("d");
        c.close();
        assert!(!p.holds("h", 1), "a closed connection is not reused");
    }

    #[tokio::test(start_paused = true)]
    async fn forget_closes() {
        let p = pool(2, 600);
        let (a, _) = p.get_or_dial("h", 1, || async { fake() }).await.expect("d");
        p.forget("h");
        assert!(!a.is_open());
        assert!(p.is_empty());
    }

    /// Single flight, checked poll by poll: while the first dial of a key is pending, a
    /// second request for the same key waits (Pending, no dial of its own) and then reuses
    /// the first's connection; a request for another key is not held up.
    #[tokio::test]
    async fn one_dial_per_key_at_a_time() {
        use tokio_test::{assert_pending, assert_ready, task};
        let p = pool(10, 60);
        let dials = Arc::new(AtomicUsize::new(0));
        let (release, gate) = tokio::sync::oneshot::channel::<()>();
        let d = dials.clone();
        let mut first = task::spawn(p.get_or_dial("a", 1, move || async move {
            d.fetch_add(1, Ordering::SeqCst);
            let _ = gate.await;
            fake()
        }));
        assert_pending!(first.poll());
        let d = dials.clone();
        let mut second = task::spawn(p.get_or_dial("a", 1, move || {
            d.fetch_add(1, Ordering::SeqCst);
            std::future::ready(fake())
        }));
        assert_pending!(second.poll());
        let d = dials.clone();
        let mut other = task::spawn(p.get_or_dial("b", 1, move || {
            d.fetch_add(1, Ordering::SeqCst);
            std::future::ready(fake())
        }));
        let (_, origin) = assert_ready!(other.poll()).expect("dialled");
        assert_eq!(origin, Origin::Dialled);
        assert_eq!(dials.load(Ordering::SeqCst), 2, "a's first dial and b's");
        release.send(()).expect("gate open");
        assert!(first.is_woken());
        let (_, origin) = assert_ready!(first.poll()).expect("dialled");
        assert_eq!(origin, Origin::Dialled);
        assert!(
            second.is_woken(),
            "the waiter is woken when the dial lock is released"
        );
        let (_, origin) = assert_ready!(second.poll()).expect("reused");
        assert_eq!(origin, Origin::Reused);
        assert_eq!(dials.load(Ordering::SeqCst), 2, "no second dial of a");
    }
}
