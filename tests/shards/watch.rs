//! The check over every SSHHost write of tests/shards.rs: a watch on the pool namespace sees
//! each write of a host, and a write is a violation when the host's claim names a NodeClaim of
//! another class than the host's (a shard claimed a host that is not its own), or when it
//! replaces one claim by another without the host being released in between (two claims of
//! one host). NodeClaims are named `<class>-...`, so the claim's class is read off its name.

use std::collections::BTreeMap;

use futures::StreamExt;
use kpssh::api::SSHHost;
use kpssh::k8s::{Cluster, KubeCluster, WatchEvent};
use tokio::sync::oneshot;

pub struct Report {
    /// Host versions checked (each write, and each host of a (re)list).
    pub writes: u64,
    pub violations: Vec<String>,
}

pub struct ClaimWatch {
    stop: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Report>,
}

/// Check one version of a host against the claim it held before (`last`, updated).
pub fn check(h: &SSHHost, last: &mut BTreeMap<String, String>, violations: &mut Vec<String>) {
    let name = h.metadata.name.clone().unwrap_or_default();
    let claim = h.claim().map(|c| (c.name.clone(), c.uid.clone()));
    if let Some((claim_name, uid)) = &claim {
        let class = claim_name.split('-').next().unwrap_or_default();
        if class != h.class() {
            violations.push(format!(
                "{name} (class {}) claimed by NodeClaim {claim_name} of class {class} (rv {:?})",
                h.class(),
                h.metadata.resource_version
            ));
        }
        if let Some(before) = last.get(&name)
            && before != uid
        {
            violations.push(format!(
                "{name}: claim {before} replaced by {claim_name}/{uid} without a release (rv {:?})",
                h.metadata.resource_version
            ));
        }
        last.insert(name, uid.clone());
    } else {
        last.remove(&name);
    }
}

impl ClaimWatch {
    pub fn start(cluster: KubeCluster, ns: &str) -> ClaimWatch {
        let mut stream = cluster.watch::<SSHHost>(Some(ns));
        let (stop, mut stopped) = oneshot::channel();
        let task = tokio::spawn(async move {
            let mut report = Report {
                writes: 0,
                violations: vec![],
            };
            let mut last = BTreeMap::new();
            loop {
                let ev = tokio::select! {
                    _ = &mut stopped => return report,
                    ev = stream.next() => ev,
                };
                match ev {
                    Some(Ok(WatchEvent::Applied(h))) => {
                        report.writes += 1;
                        check(&h, &mut last, &mut report.violations);
                    }
                    Some(Ok(WatchEvent::Restarted(all))) => {
                        for h in &all {
                            report.writes += 1;
                            check(h, &mut last, &mut report.violations);
                        }
                    }
                    Some(Ok(WatchEvent::Deleted(h))) => {
                        last.remove(h.metadata.name.as_deref().unwrap_or_default());
                    }
                    Some(Err(e)) => eprintln!("SSHHost watch: {e}"),
                    None => return report,
                }
            }
        });
        ClaimWatch { stop, task }
    }

    /// Stop after the writes so far have been seen (a moment for the last ones to arrive).
    pub async fn finish(self) -> Report {
        tokio::time::sleep(std::time::Duration::from_secs(2)).await;
        let _ = self.stop.send(());
        self.task.await.expect("watch task")
    }
}

#[test]
fn a_claim_of_another_class_or_a_second_claim_is_a_violation() {
    use kpssh::api::ClaimRef;
    let sim = kpssh::sim::SimHost::new("10.0.0.1", 2, 4_000_000);
    let mut h = kpssh::sim::world::host_object("ns", "h1", "c0", &sim);
    let claim = |h: &mut SSHHost, name: &str, uid: &str| {
        h.status.get_or_insert_with(Default::default).claim_ref = Some(ClaimRef {
            name: name.into(),
            uid: uid.into(),
        });
    };
    let (mut last, mut v) = (BTreeMap::new(), vec![]);
    claim(&mut h, "c0-r1-0", "u1");
    check(&h, &mut last, &mut v);
    assert!(v.is_empty(), "{v:?}");
    claim(&mut h, "c0-r1-1", "u2");
    check(&h, &mut last, &mut v);
    assert_eq!(v.len(), 1, "a second claim without a release: {v:?}");
    if let Some(s) = h.status.as_mut() {
        s.claim_ref = None;
    }
    check(&h, &mut last, &mut v);
    claim(&mut h, "c1-r1-0", "u3");
    check(&h, &mut last, &mut v);
    assert_eq!(v.len(), 2, "another class's claim: {v:?}");
}
