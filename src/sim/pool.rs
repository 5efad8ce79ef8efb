//! The simulated hosts' side of the real transport's connection pool (src/ssh/pool.rs): which
//! calls reuse a pooled SSH connection and which dial a new one, so that the controller's dial
//! pacing (`--ssh-dials-per-second` paces dials only) meets the same pool in the simulation as
//! in production. Modelled: one connection per host key (`"ns/name"`) and target identity,
//! closed after `idle_timeout` unused, at most `max_connections` kept (least recently used
//! idle ones evicted after a dial, busy ones never), dead once the host lost power or became
//! unreachable, dropped by `forget`. Least recently used is told by a use counter, not by the
//! time: under a paused clock many uses share one instant, and the simulation must stay
//! deterministic.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use tokio::time::Instant;

use crate::ssh::pool::PoolConfig;

struct Entry {
    /// Its host key, shared with `lru` (a call's release re-queues it without a copy).
    key: Arc<str>,
    identity: u64,
    /// The host's power cuts when it was dialled: a cut since closed the connection.
    power_cuts: u64,
    last_used: Instant,
    /// Its key in `lru`.
    seq: u64,
    /// Calls running on it (never evicted while > 0).
    in_use: u32,
    /// Which connection this is (the dial's number): a call releases only the connection it
    /// used, not one dialled since for the same host.
    conn: u64,
}

/// See the module documentation.
pub struct SimPool {
    config: PoolConfig,
    /// Fixed-seed foldhash: looked up on every SSH call of the fleet.
    entries: HashMap<Arc<str>, Entry, foldhash::fast::FixedState>,
    /// Use counter → host key of the idle connections (none in use), least recently used
    /// first: what the sweep may close. Busy ones are kept out, so that a sweep does not step
    /// over the hundreds a fleet's long joins hold at every dial.
    lru: BTreeMap<u64, Arc<str>>,
    seq: u64,
    dials: u64,
}

impl Default for SimPool {
    fn default() -> Self {
        SimPool::new(PoolConfig::default())
    }
}

impl SimPool {
    pub fn new(config: PoolConfig) -> Self {
        SimPool {
            config,
            entries: HashMap::default(),
            lru: BTreeMap::new(),
            seq: 0,
            dials: 0,
        }
    }

    /// Change the limits (drops nothing now; the cap applies from the next dial).
    pub fn set_config(&mut self, config: PoolConfig) {
        self.config = config;
    }

    /// Dials so far (each call that found no usable pooled connection, successful or not).
    pub fn dials(&self) -> u64 {
        self.dials
    }

    /// Drop every connection (the controller process died). Calls still running release
    /// nothing afterwards.
    pub fn clear(&mut self) {
        self.entries.clear();
        self.lru.clear();
    }

    /// Pooled connections (not yet swept).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Whether a call for `key` would reuse its pooled connection: same identity, no power
    /// cut since the dial, the host up, and busy or used within the idle timeout.
    pub fn holds(&self, key: &str, identity: u64, host_up: bool, power_cuts: u64) -> bool {
        let now = Instant::now();
        self.entries
            .get(key)
            .is_some_and(|e| self.usable(e, identity, host_up, power_cuts, now))
    }

    fn usable(&self, e: &Entry, identity: u64, up: bool, power_cuts: u64, now: Instant) -> bool {
        e.identity == identity
            && up
            && e.power_cuts == power_cuts
            && (e.in_use > 0 || now.duration_since(e.last_used) < self.config.idle_timeout)
    }

    /// A call for `key` starts: reuse its pooled connection or dial (counted). `connects`
    /// says whether the session opens at all (a refused dial or a key mismatch pools
    /// nothing). Returns whether it dialled and the connection used, which a call that
    /// connects passes to [`SimPool::release`] when it ends.
    pub fn checkout(
        &mut self,
        key: &str,
        identity: u64,
        host_up: bool,
        power_cuts: u64,
        connects: bool,
    ) -> (bool, u64) {
        let now = Instant::now();
        let reuse = self
            .entries
            .get(key)
            .is_some_and(|e| self.usable(e, identity, host_up, power_cuts, now));
        if !connects {
            // The real pool forgets a connection found broken or pinned differently; a failed
            // dial is still a dial.
            self.remove(key);
            if !reuse {
                self.dials += 1;
            }
            return (!reuse, 0);
        }
        self.seq += 1;
        let seq = self.seq;
        if reuse && let Some(e) = self.entries.get_mut(key) {
            self.lru.remove(&e.seq);
            e.seq = seq;
            e.last_used = now;
            e.in_use += 1;
            return (false, e.conn);
        }
        self.remove(key);
        self.dials += 1;
        let conn = self.dials;
        let key: Arc<str> = Arc::from(key);
        self.entries.insert(
            key.clone(),
            Entry {
                key,
                identity,
                power_cuts,
                last_used: now,
                seq,
                in_use: 1,
                conn,
            },
        );
        self.sweep(now);
        (true, conn)
    }

    /// A call on connection `conn` of `key` finished: the connection was used now.
    pub fn release(&mut self, key: &str, conn: u64) {
        self.seq += 1;
        let seq = self.seq;
        if let Some(e) = self.entries.get_mut(key).filter(|e| e.conn == conn) {
            self.lru.remove(&e.seq);
            e.seq = seq;
            e.last_used = Instant::now();
            e.in_use = e.in_use.saturating_sub(1);
            if e.in_use == 0 {
                self.lru.insert(seq, e.key.clone());
            }
        }
    }

    /// Drop `key`'s connection.
    pub fn remove(&mut self, key: &str) {
        if let Some(e) = self.entries.remove(key) {
            self.lru.remove(&e.seq);
        }
    }

    /// Close idle connections past the timeout and, beyond the cap, the least recently used
    /// idle ones (the real pool does both on a dial). Both sit at the front of the order: the
    /// scan stops at the first connection that is neither.
    fn sweep(&mut self, now: Instant) {
        let mut over = self
            .entries
            .len()
            .saturating_sub(self.config.max_connections);
        let mut closing = Vec::new();
        for (seq, key) in &self.lru {
            let Some(e) = self.entries.get(key) else {
                continue;
            };
            if e.in_use > 0 {
                continue;
            }
            let expired = now.duration_since(e.last_used) >= self.config.idle_timeout;
            if !expired && over == 0 {
                break;
            }
            over = over.saturating_sub(1);
            closing.push((*seq, key.clone()));
        }
        for (seq, key) in closing {
            self.lru.remove(&seq);
            self.entries.remove(&key);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn pool(max: usize) -> SimPool {
        SimPool::new(PoolConfig {
            idle_timeout: Duration::from_secs(300),
            max_connections: max,
        })
    }

    /// Dial once, reuse until idle past the timeout, a power cut, another identity or a
    /// forget.
    #[tokio::test(start_paused = true)]
    async fn a_host_is_dialled_once_and_reused_while_its_connection_lives() {
        let mut p = pool(10);
        assert!(!p.holds("h", 1, true, 0));
        let (dialled, conn) = p.checkout("h", 1, true, 0, true);
        assert!(dialled, "first call dials");
        p.release("h", conn);
        assert!(p.holds("h", 1, true, 0));
        assert_eq!(
            p.checkout("h", 1, true, 0, true),
            (false, conn),
            "second reuses"
        );
        p.release("h", conn);
        assert!(!p.holds("h", 1, true, 1), "a power cut closed it");
        assert!(!p.holds("h", 1, false, 0), "the host is down");
        assert!(!p.holds("h", 2, true, 0), "another key or address dials");
        tokio::time::sleep(Duration::from_secs(299)).await;
        assert!(p.holds("h", 1, true, 0));
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!p.holds("h", 1, true, 0), "idle for the timeout");
        let (dialled, conn) = p.checkout("h", 1, true, 0, true);
        assert!(dialled, "so the call dials");
        p.release("h", conn);
        p.remove("h");
        assert!(!p.holds("h", 1, true, 0), "forgotten");
        assert!(
            p.checkout("x", 1, true, 0, false).0,
            "a refused dial is a dial"
        );
        assert!(p.is_empty(), "and pools nothing");
        assert_eq!(p.dials(), 3);
        // A crash: the connections go, and a call of the old process releases nothing of the
        // new process's connection.
        let (_, old) = p.checkout("h", 1, true, 0, true);
        p.clear();
        let (dialled, new) = p.checkout("h", 1, true, 0, true);
        assert!(dialled, "the new process dials");
        p.release("h", old);
        p.release("h", old);
        tokio::time::sleep(Duration::from_secs(400)).await;
        assert!(p.holds("h", 1, true, 0), "in use by the new process's call");
        p.release("h", new);
        assert!(p.holds("h", 1, true, 0));
    }

    /// Beyond the cap the least recently used idle connection goes, never a busy one; a fleet
    /// probed round-robin above the cap therefore dials on every probe (as the real pool).
    #[tokio::test(start_paused = true)]
    async fn the_cap_evicts_the_least_recently_used_idle_connection() {
        let mut p = pool(2);
        let (_, busy) = p.checkout("busy", 1, true, 0, true);
        let (_, a) = p.checkout("a", 1, true, 0, true);
        p.release("a", a);
        let (_, b) = p.checkout("b", 1, true, 0, true);
        p.release("b", b);
        assert_eq!(p.len(), 2);
        assert!(p.holds("busy", 1, true, 0), "in use: never evicted");
        assert!(
            !p.holds("a", 1, true, 0),
            "least recently used idle one went"
        );
        assert!(p.holds("b", 1, true, 0));
        p.release("busy", busy);
        let before = p.dials();
        for round in 0..3 {
            for key in ["k1", "k2", "k3"] {
                let (dialled, conn) = p.checkout(key, 1, true, 0, true);
                assert!(dialled, "{key} round {round}");
                p.release(key, conn);
            }
        }
        assert_eq!(
            p.dials() - before,
            9,
            "three hosts round-robin over two slots"
        );
    }
}
