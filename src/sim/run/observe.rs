//! Taking the watches' news after each step: the mirror, the trace, per-host state changes,
//! the secret scan and the violations the host side saw.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use super::{Runner, TOKEN_NS, Violation, drain, launched, name_of, rv_of};
use crate::api::{NodeClaim, SSHHost, SSHHostStatus};
use crate::k8s::WatchEvent;
use crate::sim::workload;

/// An API event's trace line, formatted only when written (see `Runner::line_with`).
enum ApiLine {
    Host(Arc<SSHHost>),
    Claim(Arc<NodeClaim>),
    /// A deletion: kind and name.
    Gone(&'static str, String),
    Text(String),
}

impl ApiLine {
    fn write(&self, out: &mut String) {
        let _ = match self {
            ApiLine::Host(h) => {
                let empty = SSHHostStatus::default();
                let s = h.status.as_ref().unwrap_or(&empty);
                write!(
                    out,
                    "A SSHHost {} {} claim={} marker={} token={}",
                    h.metadata.name.as_deref().unwrap_or_default(),
                    s.state,
                    s.claim_ref.as_ref().map_or("-", |c| c.name.as_str()),
                    s.installed_profile.as_deref().unwrap_or("-"),
                    if s.bootstrap_token_id.is_some() {
                        "set"
                    } else {
                        "-"
                    }
                )
            }
            ApiLine::Claim(nc) => write!(
                out,
                "A NodeClaim {} launched={} deleting={} finalizers={}",
                nc.metadata.name.as_deref().unwrap_or_default(),
                launched(nc).unwrap_or("-"),
                nc.metadata.deletion_timestamp.is_some(),
                nc.metadata.finalizers.as_ref().map_or(0, Vec::len)
            ),
            ApiLine::Gone(kind, name) => write!(out, "D {kind} {name}"),
            ApiLine::Text(t) => {
                out.push_str(t);
                Ok(())
            }
        };
    }

    fn text(&self) -> String {
        let mut s = String::new();
        self.write(&mut s);
        s
    }
}

impl Runner<'_> {
    /// Take the watches' news: mirror, trace, per-host state changes, secret scan.
    pub(super) fn observe(&mut self, now: Duration) {
        let mut items: Vec<(u64, ApiLine)> = vec![];
        let mut texts: Vec<(String, String)> = vec![];
        // Hosts whose claim liveness an event may have changed (`None`: all of them).
        let mut moved: Option<Vec<String>> = Some(vec![]);
        for ev in drain(&mut self.watches.hosts) {
            match ev {
                WatchEvent::Restarted(all) => {
                    self.mirror.reset_hosts(all);
                    moved = None;
                }
                WatchEvent::Applied(h) => {
                    let n = name_of(&h.metadata);
                    items.push((rv_of(&h.metadata), ApiLine::Host(h.clone())));
                    if let Some(e) = h.status.as_ref().and_then(|s| s.last_probe_error.clone()) {
                        texts.push((format!("SSHHost {n} status"), e));
                    }
                    if let Some(moved) = &mut moved {
                        moved.push(n.clone());
                    }
                    self.mirror.put_host(n, h);
                }
                WatchEvent::Deleted(h) => {
                    let n = name_of(&h.metadata);
                    items.push((rv_of(&h.metadata), ApiLine::Gone("SSHHost", n.clone())));
                    self.mirror.remove_host(&n);
                    if let Some(moved) = &mut moved {
                        moved.push(n);
                    }
                }
            }
        }
        for ev in drain(&mut self.watches.claims) {
            match ev {
                WatchEvent::Restarted(all) => {
                    self.mirror.reset_claims(all);
                    moved = None;
                }
                WatchEvent::Applied(c) => {
                    let n = name_of(&c.metadata);
                    if workload::from_pool(&c) && !self.created.contains_key(&n) {
                        // Karpenter's provisioning made it, for pod demand.
                        self.created.insert(n.clone(), now);
                        self.nodeclaims_created += 1;
                    }
                    items.push((rv_of(&c.metadata), ApiLine::Claim(c.clone())));
                    for cond in c.status.iter().flat_map(|s| s.conditions.iter()) {
                        texts.push((format!("NodeClaim {n} condition"), cond.message.clone()));
                    }
                    self.mirror.put_claim(n, c.clone());
                    self.claim_moved(&c, &mut moved);
                }
                WatchEvent::Deleted(c) => {
                    let n = name_of(&c.metadata);
                    items.push((rv_of(&c.metadata), ApiLine::Gone("NodeClaim", n.clone())));
                    // A later claim may take the name again (provisioning's names repeat
                    // after a controller restart): its clock starts at its own creation
                    // (seed 1057: claim-launched-in-time timed a new claim from the first's).
                    self.created.remove(&n);
                    self.mirror.remove_claim(&n);
                    self.claim_moved(&c, &mut moved);
                }
            }
        }
        self.refresh_claim_live(moved);
        for ev in drain(&mut self.watches.nodes) {
            match ev {
                WatchEvent::Restarted(all) => {
                    self.mirror.nodes =
                        all.into_iter().map(|c| (name_of(&c.metadata), c)).collect();
                    self.attached.clear();
                    self.p2r_pending.clear();
                    let names: Vec<String> = self.mirror.nodes.keys().cloned().collect();
                    for n in names {
                        self.track_node(&n);
                    }
                }
                WatchEvent::Applied(c) => {
                    let n = name_of(&c.metadata);
                    let deleting = c.metadata.deletion_timestamp.is_some();
                    items.push((
                        rv_of(&c.metadata),
                        ApiLine::Text(format!("A Node {n} deleting={deleting}")),
                    ));
                    self.mirror.nodes.insert(n.clone(), c);
                    self.track_node(&n);
                }
                WatchEvent::Deleted(c) => {
                    let n = name_of(&c.metadata);
                    items.push((rv_of(&c.metadata), ApiLine::Text(format!("D Node {n}"))));
                    self.mirror.nodes.remove(&n);
                    self.track_node(&n);
                }
            }
        }
        for ev in drain(&mut self.watches.tokens) {
            match ev {
                WatchEvent::Restarted(all) => {
                    self.mirror.tokens =
                        all.into_iter().map(|c| (name_of(&c.metadata), c)).collect();
                }
                WatchEvent::Applied(c) => {
                    let n = name_of(&c.metadata);
                    items.push((
                        rv_of(&c.metadata),
                        ApiLine::Text(format!("A Secret {TOKEN_NS}/{n}")),
                    ));
                    if let Some(half) = c.data.as_ref().and_then(|d| d.get("token-secret")) {
                        self.checks
                            .secrets
                            .insert(String::from_utf8_lossy(&half.0).into_owned());
                    }
                    self.mirror.tokens.insert(n, c);
                }
                WatchEvent::Deleted(c) => {
                    let n = name_of(&c.metadata);
                    items.push((
                        rv_of(&c.metadata),
                        ApiLine::Text(format!("D Secret {TOKEN_NS}/{n}")),
                    ));
                    self.mirror.tokens.remove(&n);
                }
            }
        }
        // In resourceVersion order, ties by text (as sorting the formatted lines did).
        items.sort_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.text().cmp(&b.1.text())));
        for (rv, item) in items {
            self.line_with(now, |out| {
                let _ = write!(out, "api rv={rv} ");
                item.write(out);
            });
        }
        let journal = self.world.transport.drain_journal();
        for t in &journal.tokens_seen {
            if let Some((_, half)) = t.split_once('.') {
                self.checks.secrets.insert(half.to_string());
            }
        }
        for a in &journal.actions {
            let failed = a.what.contains("hung")
                || a.what.contains("cut off")
                || !a.what.ends_with("exit=0");
            if failed && let Some(i) = self.by_addr.get(&a.host) {
                self.checks
                    .disturbed
                    .insert(self.infos[*i].name.clone(), a.at);
            }
        }
        for a in journal.actions {
            let host = self
                .by_addr
                .get(&a.host)
                .map_or(a.host.clone(), |i| self.infos[*i].name.clone());
            self.line(a.at, format!("sim {host} {}", a.what));
        }
        for v in journal.violations {
            self.checks
                .violate(v.invariant, &v.message, v.at, v.message.clone());
        }
        let events = self.world.cluster.events_since(self.events_seen);
        for e in &events {
            match e.reason.as_str() {
                crate::actors::events::ZOMBIE_LEFT => self.zombies_cleaned += 1,
                crate::actors::events::LAUNCH_FAILED => self.launch_failures += 1,
                "FailedProvisioning" if e.message.contains("NodePool limits") => {
                    self.provisioning_blocked_by_limits += 1;
                }
                _ => {}
            }
            texts.push((
                format!("event {} on {}", e.reason, e.regarding),
                e.message.clone(),
            ));
            let line = format!(
                "event {} {} {}: {}",
                e.reason, e.regarding.kind, e.regarding.name, e.message
            );
            self.line(now, line);
        }
        self.events_seen += events.len();
        // Only what the safety checker has read too (it looks for repairs as they happen).
        let read = self
            .safety
            .events_read
            .load(std::sync::atomic::Ordering::SeqCst);
        (self.world.cluster).forget_events_before(self.events_seen.min(read));
        for (what, text) in texts {
            self.checks.scan(now, &what, &text);
        }
        let mut deletions: Vec<Violation> = std::mem::take(
            &mut *self
                .node_deletions
                .lock()
                .unwrap_or_else(|p| p.into_inner()),
        );
        deletions.append(
            &mut self
                .safety
                .violations
                .lock()
                .unwrap_or_else(|p| p.into_inner()),
        );
        for v in deletions {
            let at = Duration::from_secs(v.at_seconds);
            self.checks
                .violate(&v.invariant, &v.message, at, v.message.clone());
        }
        if self.opts.timeline {
            for (name, h) in &self.mirror.hosts {
                let st = h.state();
                if self.host_states.get(name) != Some(&st) {
                    self.host_states.insert(name.clone(), st);
                    if let Some(i) = self.by_name.get(name) {
                        self.timeline.hosts[*i]
                            .2
                            .push((now.as_secs(), st.to_string()));
                    }
                }
            }
        }
    }

    /// A NodeClaim came or went: the hosts whose claim carries its UID may have changed
    /// liveness (hosts are mirrored before claims, so the holders are current).
    fn claim_moved(&self, c: &NodeClaim, moved: &mut Option<Vec<String>>) {
        let (Some(moved), Some(uid)) = (moved.as_mut(), c.metadata.uid.as_deref()) else {
            return;
        };
        if let Some(holders) = self.mirror.host_index.holders.get(uid) {
            moved.extend(holders.iter().cloned());
        }
    }

    /// Recompute [`Runner::claim_live`] for the hosts that moved (all when `None`).
    fn refresh_claim_live(&mut self, moved: Option<Vec<String>>) {
        let names: Vec<String> =
            moved.unwrap_or_else(|| self.infos.iter().map(|i| i.name.clone()).collect());
        for name in names {
            let Some(&i) = self.by_name.get(&name) else {
                continue;
            };
            self.claim_live[i] = self.mirror.host_claim_live(&name);
        }
    }
}
