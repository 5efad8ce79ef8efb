//! Key Secrets as last read, shared by every host actor of a controller (in the `Context`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::secret::Secret;

/// A pool usually names one key Secret for all its hosts: read per host, every target refresh
/// of ten thousand hosts was ten thousand GETs of the same object (4 per host-hour at a
/// 15-minute refresh, and one more after each host's first probe pinned its key). The
/// supervisor's Secret watch forgets an entry when its Secret changes; `max_age` bounds what a
/// missed watch event can cost. The host actors read through it (`actors::host::target`).
#[derive(Clone, Default)]
pub struct KeyCache {
    inner: Arc<Mutex<KeyCacheState>>,
}

#[derive(Default)]
struct KeyCacheState {
    keys: HashMap<(String, String), CachedKey>,
    /// Bumped by every forget: a read that started before one does not store what it read
    /// (it may be the Secret's old version).
    epoch: u64,
}

struct CachedKey {
    key: Secret,
    known_host: Option<String>,
    read: tokio::time::Instant,
}

impl KeyCache {
    fn lock(&self) -> std::sync::MutexGuard<'_, KeyCacheState> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The Secrets `names` of `ns` changed: read them again at their next use.
    pub fn forget<'a>(&self, ns: &str, names: impl IntoIterator<Item = &'a str>) {
        let mut st = self.lock();
        st.epoch += 1;
        for n in names {
            st.keys.remove(&(ns.to_string(), n.to_string()));
        }
    }

    /// Forget every Secret (after a relist: what changed meanwhile is unknown).
    pub fn forget_all(&self) {
        let mut st = self.lock();
        st.epoch += 1;
        st.keys.clear();
    }

    /// The key and known host of Secret `name` in `ns`, read less than `max_age` ago; else
    /// the epoch to [`KeyCache::store`] a fresh read under.
    pub fn lookup(
        &self,
        ns: &str,
        name: &str,
        max_age: Duration,
    ) -> Result<(Secret, Option<String>), u64> {
        let st = self.lock();
        match (st.keys.get(&(ns.to_string(), name.to_string())))
            .filter(|k| k.read.elapsed() < max_age)
        {
            Some(k) => Ok((k.key.clone(), k.known_host.clone())),
            None => Err(st.epoch),
        }
    }

    /// Keep a read that started at `epoch`, unless a forget came since.
    pub fn store(&self, epoch: u64, ns: &str, name: &str, key: &Secret, known_host: Option<&str>) {
        let mut st = self.lock();
        if st.epoch == epoch {
            st.keys.insert(
                (ns.to_string(), name.to_string()),
                CachedKey {
                    key: key.clone(),
                    known_host: known_host.map(str::to_string),
                    read: tokio::time::Instant::now(),
                },
            );
        }
    }
}
