//! The simulated hosts' side of the real transport's connection pool (src/ssh/pool.rs): which
//! calls reuse a pooled SSH connection and which dial a new one, so that the controller's dial
//! pacing (`--ssh-dials-per-second` paces dials only) meets the same pool in the simulation as
//! in production. Modelled: one connection per host key (`"ns/name"`) and target identity,
//! closed after `idle_timeout` unused, at most `max_connections` kept (least recently used
//! idle ones evicted after a dial, busy ones never), dead once the host lost power or became
//! unreachable, dropped by `forget`. Least recently used is told by a use counter, not by the
//! time: under a paused clock many uses share one instant, and the simulation must stay
//! deterministic.
//!
//! Host keys are numbered the first time they are seen, and connections kept by that number:
//! a fleet above the cap dials on every probe (millions a day), and each dial used to hash
//! and compare its key string five times (find, replace, insert, sweep, release) in a map
//! whose entries are cold by the time the host comes round again.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use tokio::time::Instant;

use crate::ssh::pool::PoolConfig;

struct Entry {
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

/// A call's connection: which host key (by number) and which dial of it, handed back to
/// [`SimPool::release`] when the call ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Conn {
    id: u32,
    conn: u64,
}

/// See the module documentation.
pub struct SimPool {
    config: PoolConfig,
    /// Host key → its number (fixed-seed foldhash). Numbers are never reused: a fleet has
    /// as many keys as hosts it ever saw.
    ids: HashMap<Arc<str>, u32, foldhash::fast::FixedState>,
    /// The pooled connection of each host key, by number.
    entries: Vec<Option<Entry>>,
    /// Connections in `entries`.
    live: usize,
    /// Use counter → host key number of the idle connections (none in use), least recently
    /// used first: what the sweep may close. Busy ones are kept out, so that a sweep does not
    /// step over the hundreds a fleet's long joins hold at every dial.
    lru: BTreeMap<u64, u32>,
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
            ids: HashMap::default(),
            entries: Vec::new(),
            live: 0,
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
        self.entries.iter_mut().for_each(|e| *e = None);
        self.live = 0;
        self.lru.clear();
    }

    /// Pooled connections (not yet swept).
    pub fn len(&self) -> usize {
        self.live
    }

    pub fn is_empty(&self) -> bool {
        self.live == 0
    }

    /// The number of `key`, given it now if it has none.
    fn id(&mut self, key: &str) -> u32 {
        if let Some(id) = self.ids.get(key) {
            return *id;
        }
        let id = u32::try_from(self.entries.len()).unwrap_or(u32::MAX);
        self.ids.insert(Arc::from(key), id);
        self.entries.push(None);
        id
    }

    fn entry(&self, id: u32) -> Option<&Entry> {
        self.entries.get(id as usize).and_then(Option::as_ref)
    }

    /// Whether a call for `key` would reuse its pooled connection: same identity, no power
    /// cut since the dial, the host up, and busy or used within the idle timeout.
    pub fn holds(&self, key: &str, identity: u64, host_up: bool, power_cuts: u64) -> bool {
        let now = Instant::now();
        self.ids
            .get(key)
            .and_then(|id| self.entry(*id))
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
    ) -> (bool, Conn) {
        let now = Instant::now();
        let id = self.id(key);
        let reuse = self
            .entry(id)
            .is_some_and(|e| self.usable(e, identity, host_up, power_cuts, now));
        if !connects {
            // The real pool forgets a connection found broken or pinned differently; a failed
            // dial is still a dial.
            self.drop_entry(id);
            if !reuse {
                self.dials += 1;
            }
            return (!reuse, Conn { id, conn: 0 });
        }
        self.seq += 1;
        let seq = self.seq;
        if reuse && let Some(Some(e)) = self.entries.get_mut(id as usize) {
            self.lru.remove(&e.seq);
            e.seq = seq;
            e.last_used = now;
            e.in_use += 1;
            return (false, Conn { id, conn: e.conn });
        }
        self.drop_entry(id);
        self.dials += 1;
        let conn = self.dials;
        if let Some(slot) = self.entries.get_mut(id as usize) {
            *slot = Some(Entry {
                identity,
                power_cuts,
                last_used: now,
                seq,
                in_use: 1,
                conn,
            });
            self.live += 1;
        }
        self.sweep(now);
        (true, Conn { id, conn })
    }

    /// A call on connection `c` finished: the connection was used now.
    pub fn release(&mut self, c: Conn) {
        self.seq += 1;
        let seq = self.seq;
        let Some(Some(e)) = self.entries.get_mut(c.id as usize) else {
            return;
        };
        if e.conn != c.conn {
            return;
        }
        self.lru.remove(&e.seq);
        e.seq = seq;
        e.last_used = Instant::now();
        e.in_use = e.in_use.saturating_sub(1);
        if e.in_use == 0 {
            self.lru.insert(seq, c.id);
        }
    }

    /// Drop `key`'s connection.
    pub fn remove(&mut self, key: &str) {
        if let Some(id) = self.ids.get(key).copied() {
            self.drop_entry(id);
        }
    }

    fn drop_entry(&mut self, id: u32) {
        if let Some(e) = self.entries.get_mut(id as usize).and_then(Option::take) {
            self.lru.remove(&e.seq);
            self.live -= 1;
        }
    }

    /// Close idle connections past the timeout and, beyond the cap, the least recently used
    /// idle ones (the real pool does both on a dial). Both sit at the front of `lru`, which
    /// holds idle connections only: the scan stops at the first connection that is neither.
    fn sweep(&mut self, now: Instant) {
        let mut over = self.live.saturating_sub(self.config.max_connections);
        while let Some((_, &id)) = self.lru.first_key_value() {
            let Some(e) = self.entry(id) else {
                // Not pooled (cannot happen: dropping a connection drops its place here).
                self.lru.pop_first();
                continue;
            };
            let expired = now.duration_since(e.last_used) >= self.config.idle_timeout;
            if !expired && over == 0 {
                break;
            }
            over = over.saturating_sub(1);
            self.lru.pop_first();
            self.entries[id as usize] = None;
            self.live -= 1;
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
        p.release(conn);
        assert!(p.holds("h", 1, true, 0));
        assert_eq!(
            p.checkout("h", 1, true, 0, true),
            (false, conn),
            "second reuses"
        );
        p.release(conn);
        assert!(!p.holds("h", 1, true, 1), "a power cut closed it");
        assert!(!p.holds("h", 1, false, 0), "the host is down");
        assert!(!p.holds("h", 2, true, 0), "another key or address dials");
        tokio::time::sleep(Duration::from_secs(299)).await;
        assert!(p.holds("h", 1, true, 0));
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!p.holds("h", 1, true, 0), "idle for the timeout");
        let (dialled, conn) = p.checkout("h", 1, true, 0, true);
        assert!(dialled, "so the call dials");
        p.release(conn);
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
        p.release(old);
        p.release(old);
        tokio::time::sleep(Duration::from_secs(400)).await;
        assert!(p.holds("h", 1, true, 0), "in use by the new process's call");
        p.release(new);
        assert!(p.holds("h", 1, true, 0));
    }

    /// Beyond the cap the least recently used idle connection goes, never a busy one; a fleet
    /// probed round-robin above the cap therefore dials on every probe (as the real pool).
    #[tokio::test(start_paused = true)]
    async fn the_cap_evicts_the_least_recently_used_idle_connection() {
        let mut p = pool(2);
        let (_, busy) = p.checkout("busy", 1, true, 0, true);
        let (_, a) = p.checkout("a", 1, true, 0, true);
        p.release(a);
        let (_, b) = p.checkout("b", 1, true, 0, true);
        p.release(b);
        assert_eq!(p.len(), 2);
        assert!(p.holds("busy", 1, true, 0), "in use: never evicted");
        assert!(
            !p.holds("a", 1, true, 0),
            "least recently used idle one went"
        );
        assert!(p.holds("b", 1, true, 0));
        p.release(busy);
        let before = p.dials();
        for round in 0..3 {
            for key in ["k1", "k2", "k3"] {
                let (dialled, conn) = p.checkout(key, 1, true, 0, true);
                assert!(dialled, "{key} round {round}");
                p.release(conn);
            }
        }
        assert_eq!(
            p.dials() - before,
            9,
            "three hosts round-robin over two slots"
        );
    }
}
