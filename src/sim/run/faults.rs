//! The fault schedule (drawn from the seed up front) and what each fault does when it
//! strikes or ends.

use std::collections::BTreeMap;
use std::time::Duration;

use rand::Rng;
use rand_chacha::ChaCha8Rng;
use serde_json::json;

use super::{PROFILE, Runner};
use crate::api::{NodeClaim, SSHJoinProfile};
use crate::k8s::Cluster;
use crate::sim::scenario::Scenario;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum FaultKind {
    Reboot,
    PowerLoss,
    SshRefusal,
    HostKeyChange,
    SlowHandshake,
    ControllerCrash,
    ForceDelete,
    ProfileBump,
}

impl FaultKind {
    fn name(self) -> &'static str {
        match self {
            FaultKind::Reboot => "reboot",
            FaultKind::PowerLoss => "power_loss",
            FaultKind::SshRefusal => "ssh_refusal",
            FaultKind::HostKeyChange => "host_key_change",
            FaultKind::SlowHandshake => "slow_handshake",
            FaultKind::ControllerCrash => "controller_crash",
            FaultKind::ForceDelete => "force_delete",
            FaultKind::ProfileBump => "profile_bump",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Agenda {
    /// A fault strikes (host index for host faults).
    Fault(FaultKind, usize),
    /// A host fault ends.
    End(FaultKind, usize),
}

/// Poisson arrivals of `rate_per_hour` over `duration`.
pub(super) fn arrivals(
    rng: &mut ChaCha8Rng,
    rate_per_hour: f64,
    duration: Duration,
) -> Vec<Duration> {
    let mut out = vec![];
    if rate_per_hour <= 0.0 {
        return out;
    }
    let mut t = 0.0;
    let end = duration.as_secs_f64();
    loop {
        let u: f64 = rng.random::<f64>().max(f64::MIN_POSITIVE);
        t += -u.ln() * 3600.0 / rate_per_hour;
        if t >= end {
            return out;
        }
        out.push(Duration::from_secs_f64(t));
    }
}

/// Every fault of the scenario, at its time (ties in draw order); the sequence number to
/// continue from.
pub(super) fn schedule(
    sc: &Scenario,
    rng: &mut ChaCha8Rng,
    hosts: usize,
) -> (BTreeMap<(Duration, u64), Agenda>, u64) {
    let mut agenda: BTreeMap<(Duration, u64), Agenda> = BTreeMap::new();
    let mut seq = 0u64;
    let f = &sc.faults;
    let host_faults = [
        (
            FaultKind::Reboot,
            f.reboot.as_ref().map(|x| x.rate_per_host_hour),
        ),
        (
            FaultKind::PowerLoss,
            f.power_loss.as_ref().map(|x| x.rate_per_host_hour),
        ),
        (
            FaultKind::SshRefusal,
            f.ssh_refusal.as_ref().map(|x| x.rate_per_host_hour),
        ),
        (
            FaultKind::HostKeyChange,
            f.host_key_change.as_ref().map(|x| x.rate_per_host_hour),
        ),
        (
            FaultKind::SlowHandshake,
            f.slow_handshake.as_ref().map(|x| x.rate_per_host_hour),
        ),
    ];
    for (kind, rate) in host_faults {
        let Some(rate) = rate else { continue };
        for t in arrivals(rng, rate * hosts as f64, sc.duration) {
            let h = rng.random_range(0..hosts.max(1));
            seq += 1;
            agenda.insert((t, seq), Agenda::Fault(kind, h));
        }
    }
    let fleet_faults = [
        (FaultKind::ControllerCrash, f.controller_crash.as_ref()),
        (FaultKind::ForceDelete, f.force_delete.as_ref()),
        (FaultKind::ProfileBump, f.profile_bump.as_ref()),
    ];
    for (kind, rate) in fleet_faults {
        let Some(rate) = rate else { continue };
        for t in arrivals(rng, rate.rate_per_hour, sc.duration) {
            seq += 1;
            agenda.insert((t, seq), Agenda::Fault(kind, 0));
        }
    }
    (agenda, seq)
}

impl Runner<'_> {
    /// Strike or end a fault.
    pub(super) async fn apply(
        &mut self,
        now: Duration,
        item: &Agenda,
    ) -> Option<(Duration, Agenda)> {
        let tr = self.world.transport.clone();
        match item {
            Agenda::Fault(kind, i) if (*kind as u8) <= FaultKind::SlowHandshake as u8 => {
                let info = &self.infos[*i];
                if self.fault_active.get(i).is_some_and(|until| *until > now) {
                    return None;
                }
                let f = &self.sc.faults;
                let (duration, delay) = match kind {
                    FaultKind::Reboot => (f.reboot.as_ref().map(|x| x.duration), None),
                    FaultKind::PowerLoss => (f.power_loss.as_ref().map(|x| x.duration), None),
                    FaultKind::SshRefusal => (f.ssh_refusal.as_ref().map(|x| x.duration), None),
                    FaultKind::HostKeyChange => {
                        (f.host_key_change.as_ref().map(|x| x.duration), None)
                    }
                    _ => (
                        f.slow_handshake.as_ref().map(|x| x.duration),
                        f.slow_handshake.as_ref().map(|x| x.delay),
                    ),
                };
                let duration = duration.unwrap_or(Duration::from_secs(300));
                let address = info.address.clone();
                let name = info.name.clone();
                tr.with(&address, |h| match kind {
                    FaultKind::Reboot | FaultKind::PowerLoss => h.power_off(),
                    FaultKind::SshRefusal => h.reachable = false,
                    FaultKind::HostKeyChange => {
                        h.fingerprint = format!("SHA256:{:0<43}", "rekeyed")
                    }
                    _ => h.handshake_delay = delay.unwrap_or(Duration::from_secs(45)),
                });
                tr.note(&address, format!("fault {} for {duration:?}", kind.name()));
                *self.faults.entry(kind.name().to_string()).or_default() += 1;
                self.fault_active.insert(*i, now + duration);
                self.checks.disturbed.insert(name, now + duration);
                Some((now + duration, Agenda::End(*kind, *i)))
            }
            Agenda::End(kind, i) => {
                let info = &self.infos[*i];
                let (address, fp) = (info.address.clone(), info.fingerprint.clone());
                tr.with(&address, |h| match kind {
                    FaultKind::Reboot | FaultKind::PowerLoss => {
                        h.powered = true;
                        h.reboot();
                    }
                    FaultKind::SshRefusal => h.reachable = true,
                    FaultKind::HostKeyChange => h.fingerprint = fp,
                    _ => h.handshake_delay = Duration::ZERO,
                });
                if matches!(kind, FaultKind::Reboot | FaultKind::PowerLoss) {
                    tr.kubelet_restarted(&address);
                }
                tr.note(&address, format!("fault {} ends", kind.name()));
                None
            }
            Agenda::Fault(FaultKind::ControllerCrash, _) => {
                *self.faults.entry("controller_crash".into()).or_default() += 1;
                self.line(now, "fault controller_crash".into());
                let seed = self.seed.wrapping_add(self.faults["controller_crash"]);
                if let Err(e) = self.world.crash_and_restart(seed).await {
                    self.line(now, format!("controller restart failed: {e}"));
                }
                None
            }
            Agenda::Fault(FaultKind::ForceDelete, _) => {
                let live: Vec<String> = self
                    .mirror
                    .claims
                    .iter()
                    .filter(|(_, c)| c.is_ours())
                    .map(|(n, _)| n.clone())
                    .collect();
                if live.is_empty() {
                    return None;
                }
                let name = live[self.rng.random_range(0..live.len())].clone();
                let cluster = self.cluster();
                self.suspend(true);
                let patch = json!({"metadata": {"finalizers": null}});
                let _ = cluster.patch::<NodeClaim>(None, &name, &patch).await;
                let _ = cluster.delete::<NodeClaim>(None, &name, None).await;
                self.suspend(false);
                *self.faults.entry("force_delete".into()).or_default() += 1;
                self.line(now, format!("fault force_delete {name}"));
                None
            }
            Agenda::Fault(_, _) => {
                let cluster = self.cluster();
                self.suspend(true);
                if let Ok(Some(mut p)) = cluster.get::<SSHJoinProfile>(None, PROFILE).await {
                    self.profile_version += 1;
                    p.spec.version = self.profile_version.to_string();
                    if cluster.replace(&p).await.is_ok() {
                        *self.faults.entry("profile_bump".into()).or_default() += 1;
                        self.line(now, format!("fault profile_bump to {}", p.spec.version));
                    }
                }
                self.suspend(false);
                None
            }
        }
    }
}
