//! The invariants, checked after every step over the mirror and the simulated hosts
//! (`docs/simulation.md`, "Invariants").

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::time::Duration;

use super::{Runner, TOKEN_NS, Violation, launched};
use crate::actors::Config;
use crate::sim::workload;

/// Everything the invariants need between steps.
#[derive(Default)]
pub(super) struct Checks {
    pub(super) violations: Vec<Violation>,
    pub(super) reported: BTreeSet<(String, String)>,
    pub(super) zombie_since: BTreeMap<String, Duration>,
    pub(super) disturbed: BTreeMap<String, Duration>,
    /// The last check at which every leave slot was taken (hosts' leaves running, as many as
    /// `maxConcurrentPhases`): a zombie's leave queued then could not start.
    pub(super) leave_slots_full: Option<Duration>,
    pub(super) token_owed: BTreeMap<String, Duration>,
    pub(super) secrets: HashSet<String>,
}

impl Checks {
    pub(super) fn violate(&mut self, invariant: &str, key: &str, at: Duration, message: String) {
        if self
            .reported
            .insert((invariant.to_string(), key.to_string()))
        {
            self.violations.push(Violation {
                invariant: invariant.to_string(),
                at_seconds: at.as_secs(),
                message,
            });
        }
    }

    /// A minted token's secret half (and the whole token) must never appear in API text.
    pub(super) fn scan(&mut self, at: Duration, what: &str, text: &str) {
        if self.secrets.is_empty() {
            return;
        }
        let b = text.as_bytes();
        let ok = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
        for w in b.windows(16) {
            if w.iter().all(ok)
                && let Ok(s) = std::str::from_utf8(w)
                && self.secrets.contains(s)
            {
                self.violate(
                    "no-secret-in-text",
                    what,
                    at,
                    format!("a bootstrap token secret appears in {what}"),
                );
                return;
            }
        }
    }
}

impl Runner<'_> {
    /// Whether NodeClaim `name` has its Node: one named after it, or (Adopt mode, a Node
    /// that names itself) the one its `status.nodeName` names.
    fn claim_registered(&self, name: &str) -> bool {
        self.mirror.nodes.contains_key(name)
            || (self.mirror.claims.get(name))
                .and_then(|nc| nc.status.as_ref())
                .and_then(|s| s.node_name.as_deref())
                .is_some_and(|n| self.mirror.nodes.contains_key(n))
    }

    /// NodeClaim UIDs held by more than one host, with the hosts.
    fn shared_claims(&self) -> Vec<(String, Vec<String>)> {
        let index = &self.mirror.host_index;
        index
            .shared
            .iter()
            .filter_map(|uid| {
                let hosts = index.holders.get(uid)?;
                Some((uid.clone(), hosts.iter().cloned().collect()))
            })
            .collect()
    }

    /// The invariants over the mirror and the sim hosts, after a step.
    pub(super) fn check(&mut self, now: Duration) {
        let probe = self.sc.probe_interval;
        let slack = self.sc.step;
        // one-claim-per-host: a NodeClaim holds at most one host.
        for (uid, hosts) in self.shared_claims() {
            self.checks.violate(
                "one-claim-per-host",
                &uid,
                now,
                format!("NodeClaim uid {uid} holds hosts {}", hosts.join(", ")),
            );
        }
        // zombie-lifetime: a kubelet on a host nobody holds is gone within 2 probe intervals.
        // Only hosts with a kubelet running on a clean link can be zombies; the others just
        // end any zombie episode they had.
        // Leave slots are the controller's bound on concurrent leaves: while all are held
        // (hung leaves hold theirs until the phase timeout: seed 1330), a zombie's leave
        // waits for one, and its clock restarts once one is free.
        if self.world.transport.leaves_running() >= self.sc.controller.max_concurrent_phases {
            self.checks.leave_slots_full = Some(now);
        }
        let slots_full = self.checks.leave_slots_full.unwrap_or_default();
        let infos = &self.infos;
        // The transport numbers hosts in the order they were added, which is `infos` order
        // (the address comparison keeps that honest without a lookup per host).
        let running: Vec<usize> = self.world.transport.filter_map_kubelet_running(|i, h| {
            let clean = h.reachable && h.handshake_delay.is_zero() && !h.leave_in_flight;
            let info = infos.get(i).filter(|info| info.address == h.address)?;
            (clean && h.fingerprint == info.fingerprint).then_some(i)
        });
        if !self.checks.zombie_since.is_empty() {
            let running_names: HashSet<&str> = running
                .iter()
                .map(|i| self.infos[*i].name.as_str())
                .collect();
            self.checks
                .zombie_since
                .retain(|name, _| running_names.contains(name.as_str()));
        }
        for i in running {
            let name = &self.infos[i].name;
            debug_assert_eq!(
                self.claim_live[i],
                self.mirror.host_claim_live(name),
                "claim liveness of {name} is stale"
            );
            if self.claim_live[i] {
                self.checks.zombie_since.remove(name);
                continue;
            }
            let since = *self.checks.zombie_since.entry(name.clone()).or_insert(now);
            let from = self
                .checks
                .disturbed
                .get(name)
                .map_or(since, |d| (*d).max(since))
                .max(slots_full);
            if now.saturating_sub(from) > 2 * probe + slack {
                let h = self.mirror.hosts.get(name);
                self.checks.violate(
                    "zombie-lifetime",
                    &format!("{name}@{}", since.as_secs()),
                    now,
                    format!(
                        "{name}: kubelet running unclaimed since {}s (state {}), more than 2 probe intervals",
                        from.as_secs(),
                        h.map_or("gone".to_string(), |h| h.state().to_string())
                    ),
                );
            }
        }
        // token-lifetime: deleted within a probe interval of registration, failure, release
        // or stale claim.
        let tokens: Vec<String> = self.mirror.tokens.keys().cloned().collect();
        let mut owed_now = BTreeSet::new();
        for t in tokens {
            let Some(id) = t.strip_prefix("bootstrap-token-") else {
                continue;
            };
            // Of several hosts recording one ID, the last by name (as a map built in name
            // order would keep).
            let holder = (self.mirror.host_index.token_holders.get(id))
                .and_then(|names| names.last())
                .and_then(|n| self.mirror.hosts.get(n));
            let owed = match holder {
                None => Some("no host records it"),
                Some(h) => match h.claim() {
                    None => Some("its host holds no claim"),
                    Some(c) if self.claim_registered(&c.name) => Some("its node registered"),
                    Some(c) if !self.mirror.claims.contains_key(&c.name) => {
                        Some("its NodeClaim is gone")
                    }
                    Some(_) => None,
                },
            };
            let Some(why) = owed else {
                continue;
            };
            owed_now.insert(t.clone());
            let since = *self.checks.token_owed.entry(t.clone()).or_insert(now);
            if now.saturating_sub(since) > probe + slack {
                self.checks.violate(
                    "token-lifetime",
                    &t,
                    now,
                    format!(
                        "{TOKEN_NS}/{t} still exists {}s after it was due ({why})",
                        now.saturating_sub(since).as_secs()
                    ),
                );
            }
        }
        self.checks.token_owed.retain(|t, _| owed_now.contains(t));
        // claim-launched-in-time.
        let limit = Config::default().registration_timeout + slack;
        for (name, nc) in &self.mirror.claims {
            // Launched=False is a decision (the launch failed); the NodeClaim's deletion is
            // the karpenter layer's registration timeout if the controller's own fails.
            if nc.metadata.deletion_timestamp.is_some() || launched(nc).is_some() {
                continue;
            }
            let Some(at) = self.created.get(name) else {
                continue;
            };
            if now.saturating_sub(*at) > limit {
                let msg = format!(
                    "NodeClaim {name} created at {}s is not launched after {}s",
                    at.as_secs(),
                    now.saturating_sub(*at).as_secs()
                );
                self.checks
                    .violate("claim-launched-in-time", name, now, msg);
            }
        }
        for (pool, msg) in workload::limit_breaches(self.sc, &self.largest, &self.mirror.claims) {
            self.checks.violate("nodepool-limits", &pool, now, msg);
        }
    }
}
