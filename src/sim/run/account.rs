//! Billing, latency samples and the report's pool sample.

use std::time::Duration;

use super::{Runner, STATES, Sample};

impl Runner<'_> {
    /// Keep the Node's entries in `attached` (the host it runs on) and `p2r_pending` as the
    /// mirror now has it (or no longer has it).
    pub(super) fn track_node(&mut self, name: &str) {
        let Some(node) = self.mirror.nodes.get(name) else {
            self.attached.remove(name);
            self.p2r_pending.remove(name);
            return;
        };
        let by_provider = node
            .spec
            .as_ref()
            .and_then(|s| s.provider_id.as_deref())
            .and_then(|p| p.rsplit_once('/'))
            .and_then(|(_, h)| self.by_name.get(h));
        let by_ip = || {
            node.status
                .as_ref()
                .and_then(|s| s.addresses.as_ref())
                .and_then(|a| a.first())
                .and_then(|a| self.by_addr.get(&a.address))
        };
        match by_provider.or_else(by_ip).copied() {
            Some(i) => self.attached.insert(name.to_string(), i),
            None => self.attached.remove(name),
        };
        if !self.p2r_done.contains(name) {
            self.p2r_pending.insert(name.to_string());
        }
    }

    pub(super) fn account(&mut self, now: Duration, dt: Duration) {
        let mut vcpu = 0.0;
        let mut cost = 0.0;
        // In Node name order, as the sums always were.
        for i in self.attached.values() {
            let info = &self.infos[*i];
            vcpu += f64::from(info.cpu);
            cost += f64::from(info.cpu) * info.price;
        }
        let mut done = vec![];
        for name in &self.p2r_pending {
            let Some(node) = self.mirror.nodes.get(name) else {
                continue;
            };
            // The claim named like the Node, or (a Node that names itself) its owner.
            let claim = self.mirror.claims.get(name).or_else(|| {
                (node.metadata.owner_references.iter().flatten())
                    .find(|o| o.kind == "NodeClaim")
                    .and_then(|o| self.mirror.claims.get(&o.name))
            });
            let Some(nc) = claim else { continue };
            let claim_name = super::name_of(&nc.metadata);
            if self.p2r_done.contains(&claim_name) {
                done.push((name.clone(), claim_name));
                continue;
            }
            if let (Some(a), Some(b)) = (
                nc.metadata.creation_timestamp.as_ref(),
                node.metadata.creation_timestamp.as_ref(),
            ) {
                done.push((name.clone(), claim_name));
                let secs = b.0.duration_since(a.0).as_secs_f64();
                self.p2r.push(secs.max(0.0));
            }
        }
        for (node, claim) in done {
            self.p2r_pending.remove(&node);
            self.p2r_done.insert(claim);
        }
        self.attached_vcpu_s += vcpu * dt.as_secs_f64();
        self.cost_s += cost * dt.as_secs_f64();
        if self.opts.timeline {
            let mut counts = vec![0u32; STATES.len()];
            for h in self.mirror.hosts.values() {
                if let Some(i) = STATES.iter().position(|s| *s == h.state()) {
                    counts[i] += 1;
                }
            }
            let always: f64 = self.infos.iter().map(|i| f64::from(i.cpu) * i.price).sum();
            self.timeline.samples.push(Sample {
                t: now.as_secs(),
                counts,
                cost: self.cost_s / 3600.0,
                always_attached_cost: always * now.as_secs_f64() / 3600.0,
            });
        }
    }
}

pub(super) fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}
