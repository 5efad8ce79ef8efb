//! NodePool status conditions, as core's `nodepool.readiness` and `nodepool.validation`
//! controllers write them (sigs.k8s.io/karpenter v1.14.1): `ValidationSucceeded` (runtime
//! validation, [`super::nodepool_validation`]), `NodeClassReady` (the referenced SSHNodeClass
//! exists, is not being deleted and is Ready — its reason and message when it is not) and
//! `Ready`, true when both are (else `UnhealthyDependents`, naming them). A condition that
//! turns False for a new reason also gets a Warning event on the NodePool and a log line.
//! Beside them, `status.resources` and `status.nodes` as core's `nodepool.counter` computes
//! them ([`super::nodepool_counter`]). All are written with one merge patch of the status
//! subresource, and only when one of them changed (`kubectl get nodepools` shows the nodes).
//!
//! Provisioning does not read these conditions back: it checks the same things itself each
//! round (so a pod's event says which NodePool was skipped and why); this is what `kubectl get
//! nodepools` and `kubectl describe` show.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use serde_json::{Map, json};
use tokio::task::JoinHandle;

use super::KarpenterConfig;
use super::nodepool_counter;
use super::nodepool_validation::validate;
use super::state::ClusterState;
use crate::actors::Context;
use crate::actors::host::launch::upsert_condition;
use crate::api::{NodePool, SSHNodeClass};
use crate::k8s::{Cluster, ClusterError, EventType, WatchEvent};
use crate::ssh::Transport;

pub const VALIDATION_SUCCEEDED: &str = "ValidationSucceeded";
pub const NODE_CLASS_READY: &str = "NodeClassReady";
pub const READY: &str = "Ready";
/// Longest condition message written (upstream's schema allows 32768).
const MAX_MESSAGE: usize = 4096;

/// One condition as computed: type, status, reason, message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    pub type_: &'static str,
    pub ok: bool,
    pub reason: String,
    pub message: String,
}

/// `ValidationSucceeded`, `NodeClassReady` and `Ready` of `pool`, given its class (`None`: not
/// found).
pub fn verdicts(pool: &NodePool, class: Option<&SSHNodeClass>) -> [Verdict; 3] {
    let errs = validate(pool);
    let validation = if errs.is_empty() {
        Verdict::ok(VALIDATION_SUCCEEDED)
    } else {
        Verdict::failed(
            VALIDATION_SUCCEEDED,
            "NodePoolValidationFailed",
            errs.join("; "),
        )
    };
    let class_name = &pool.spec.template.spec.node_class_ref.name;
    let class_ready = match class {
        None => Verdict::failed(
            NODE_CLASS_READY,
            "NodeClassNotFound",
            format!(
                "SSHNodeClass {class_name} (spec.template.spec.nodeClassRef) not found: create it or correct the reference"
            ),
        ),
        Some(c) if c.metadata.deletion_timestamp.is_some() => Verdict::failed(
            NODE_CLASS_READY,
            "NodeClassTerminating",
            format!("SSHNodeClass {class_name} is being deleted"),
        ),
        Some(c) => {
            let ready = (c.status.as_ref())
                .and_then(|s| s.conditions.iter().find(|x| x.type_ == READY))
                .filter(|x| x.status != "Unknown");
            match ready {
                None => Verdict::failed(
                    NODE_CLASS_READY,
                    "NodeClassReadinessUnknown",
                    format!("SSHNodeClass {class_name}: readiness unknown (not reconciled yet)"),
                ),
                Some(x) if x.status == "True" => Verdict::ok(NODE_CLASS_READY),
                Some(x) => Verdict::failed(
                    NODE_CLASS_READY,
                    if x.reason.is_empty() {
                        "NodeClassNotReady"
                    } else {
                        &x.reason
                    },
                    format!("SSHNodeClass {class_name}: {}", x.message),
                ),
            }
        }
    };
    let unhealthy: Vec<String> = [&validation, &class_ready]
        .iter()
        .filter(|v| !v.ok)
        .map(|v| format!("{}=False", v.type_))
        .collect();
    let ready = if unhealthy.is_empty() {
        Verdict::ok(READY)
    } else {
        Verdict::failed(READY, "UnhealthyDependents", unhealthy.join(", "))
    };
    [validation, class_ready, ready]
}

impl Verdict {
    fn ok(type_: &'static str) -> Self {
        Verdict {
            type_,
            ok: true,
            reason: type_.into(),
            message: String::new(),
        }
    }

    fn failed(type_: &'static str, reason: &str, message: String) -> Self {
        let mut message = message;
        if message.len() > MAX_MESSAGE {
            let mut end = MAX_MESSAGE;
            while !message.is_char_boundary(end) {
                end -= 1;
            }
            message.truncate(end);
            message.push('…');
        }
        Verdict {
            type_,
            ok: false,
            reason: reason.into(),
            message,
        }
    }
}

pub fn spawn<C: Cluster, T: Transport>(
    ctx: Context<C, T>,
    state: ClusterState,
    cfg: KarpenterConfig,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut ctl = Controller {
            ctx,
            state,
            classes: BTreeMap::new(),
            synced: false,
            seen: BTreeMap::new(),
            written: BTreeMap::new(),
            done: None,
        };
        let mut watch = ctl.ctx.cluster.watch::<SSHNodeClass>(None);
        let mut tick = tokio::time::interval(cfg.reconcile_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            // Biased: the same inputs in the same order give the same writes (the simulation's
            // traces are reproducible).
            tokio::select! {
                biased;
                ev = watch.next() => match ev {
                    Some(Ok(ev)) => ctl.class_event(ev),
                    Some(Err(e)) => tracing::debug!(error = %e, "SSHNodeClass watch error"),
                    None => {
                        tokio::time::sleep(Duration::from_secs(1)).await;
                        watch = ctl.ctx.cluster.watch::<SSHNodeClass>(None);
                    }
                },
                _ = tick.tick() => {}
            }
            // Before the first list of node classes every class would look missing.
            if !ctl.synced {
                continue;
            }
            // The status follows from the cluster state and the node classes alone: a round
            // after which neither moved writes nothing (the simulation ran it 3,600 times an
            // hour for nothing).
            let at = ctl.state.read().changes;
            if ctl.done == Some(at) {
                continue;
            }
            match ctl.reconcile().await {
                Ok(()) => ctl.done = Some(at),
                Err(e) => tracing::debug!(error = %e, "NodePool status not written; will retry"),
            }
        }
    })
}

struct Controller<C: Cluster, T: Transport> {
    ctx: Context<C, T>,
    state: ClusterState,
    classes: BTreeMap<String, SSHNodeClass>,
    /// The class watch delivered its first full list.
    synced: bool,
    /// Per NodePool, the resourceVersions (pool, class) its status was last computed from.
    seen: BTreeMap<String, (Option<String>, Option<String>)>,
    /// Per NodePool, the resources and node count last patched, with the pool's
    /// resourceVersion then: not sent again before the watch brings the pool back.
    written: BTreeMap<String, Written>,
    /// The state's change count a round last succeeded at (`None`: a class changed since).
    done: Option<u64>,
}

type Written = (Option<String>, BTreeMap<String, Quantity>, Option<i64>);

impl<C: Cluster, T: Transport> Controller<C, T> {
    fn class_event(&mut self, ev: WatchEvent<SSHNodeClass>) {
        self.done = None;
        let name = |c: &SSHNodeClass| c.metadata.name.clone().unwrap_or_default();
        match ev {
            WatchEvent::Restarted(all) => {
                self.classes = all.into_iter().map(|c| (name(&c), c)).collect();
                self.synced = true;
            }
            WatchEvent::Applied(c) => {
                self.classes.insert(name(&c), c);
            }
            WatchEvent::Deleted(c) => {
                self.classes.remove(&name(&c));
            }
        }
    }

    async fn reconcile(&mut self) -> Result<(), ClusterError> {
        // The counter waits for the first list of every kind, as core's waits for its cluster
        // state: before, a pool would be written with fewer nodes than it has.
        let (pools, usage): (Vec<NodePool>, _) = {
            let st = self.state.read();
            // No NodePool (node demand alone): nothing to count for.
            let counting = st.synced() && !st.nodepools.is_empty();
            let usage = counting.then(|| nodepool_counter::pool_resources(&st));
            (st.nodepools.values().cloned().collect(), usage)
        };
        self.seen.retain(|n, _| {
            pools
                .iter()
                .any(|p| p.metadata.name.as_deref() == Some(n.as_str()))
        });
        self.written.retain(|n, _| {
            pools
                .iter()
                .any(|p| p.metadata.name.as_deref() == Some(n.as_str()))
        });
        for pool in pools {
            let name = pool.metadata.name.clone().unwrap_or_default();
            let class = self
                .classes
                .get(&pool.spec.template.spec.node_class_ref.name);
            let inputs = (
                pool.metadata.resource_version.clone(),
                class.and_then(|c| c.metadata.resource_version.clone()),
            );
            let mut patch = Map::new();
            let before: Vec<Condition> = (pool.status.as_ref())
                .map(|s| s.conditions.clone())
                .unwrap_or_default();
            let mut changed = None;
            if self.seen.get(&name) != Some(&inputs) {
                let v = verdicts(&pool, class);
                let mut conditions = before.clone();
                for v in &v {
                    upsert_condition(
                        &mut conditions,
                        v.type_,
                        v.ok,
                        &v.reason,
                        &v.message,
                        &self.ctx.clock,
                    );
                    if let Some(c) = conditions.iter_mut().find(|c| c.type_ == v.type_) {
                        c.observed_generation = pool.metadata.generation;
                    }
                }
                if conditions != before {
                    patch.insert("conditions".into(), json!(conditions));
                    changed = Some(v);
                }
            }
            if let Some(usage) = &usage {
                let (resources, nodes) = nodepool_counter::counted(usage.get(&name));
                let last = (pool.metadata.resource_version.clone(), resources, nodes);
                // Written already, and the pool's watch has not brought the write back yet.
                if self.written.get(&name) != Some(&last)
                    && let Some(p) = nodepool_counter::patch(&pool, &last.1, last.2)
                {
                    patch.extend(p);
                    self.written.insert(name.clone(), last);
                }
            }
            if !patch.is_empty() {
                let body = json!({ "status": patch });
                match (self.ctx.cluster)
                    .patch_status::<NodePool>(None, &name, &body)
                    .await
                {
                    Ok(_) => {}
                    // Deleted: nothing to write any more.
                    Err(ClusterError::NotFound { .. }) => {
                        self.written.remove(&name);
                        continue;
                    }
                    Err(e) => {
                        self.written.remove(&name);
                        return Err(e);
                    }
                }
                if let Some(v) = &changed {
                    self.announce(&pool, &before, v).await;
                }
            }
            self.seen.insert(name, inputs);
        }
        Ok(())
    }

    /// A Warning event and a log line for each dependent condition that turned False for a
    /// reason it did not have before.
    async fn announce(&self, pool: &NodePool, before: &[Condition], verdicts: &[Verdict]) {
        let name = pool.metadata.name.as_deref().unwrap_or_default();
        for v in verdicts.iter().filter(|v| !v.ok && v.type_ != READY) {
            let was = before.iter().find(|c| c.type_ == v.type_);
            if was.is_some_and(|c| c.status == "False" && c.reason == v.reason) {
                continue;
            }
            tracing::warn!(nodepool = %name, condition = v.type_, reason = %v.reason, message = %v.message, "NodePool not Ready");
            crate::actors::events::record(
                &self.ctx.cluster,
                pool,
                EventType::Warning,
                &v.reason,
                format!("{}=False: {}", v.type_, v.message),
            )
            .await;
        }
        if verdicts.iter().all(|v| v.ok)
            && before
                .iter()
                .any(|c| c.type_ == READY && c.status != "True")
        {
            tracing::info!(nodepool = %name, "NodePool Ready");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::nodeclass::SSHNodeClassStatus;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn pool(op: &str) -> NodePool {
        serde_yaml::from_str(&format!(
            "apiVersion: karpenter.sh/v1\nkind: NodePool\nmetadata: {{name: p}}\nspec:\n  template:\n    spec:\n      nodeClassRef: {{group: karpenter.dklesev.github.io, kind: SSHNodeClass, name: c}}\n      requirements: [{{key: kubernetes.io/arch, operator: {op}, values: [amd64]}}]\n"
        ))
        .expect("pool")
    }

    fn class(ready: Option<(&str, &str, &str)>) -> SSHNodeClass {
        let mut c: SSHNodeClass = serde_yaml::from_str(
            "apiVersion: karpenter.dklesev.github.io/v1beta1\nkind: SSHNodeClass\nmetadata: {name: c}\nspec:\n  joinProfileRef: {name: p}\n",
        )
        .expect("class");
        if let Some((s, r, m)) = ready {
            c.status = Some(SSHNodeClassStatus {
                conditions: vec![Condition {
                    type_: "Ready".into(),
                    status: s.into(),
                    reason: r.into(),
                    message: m.into(),
                    observed_generation: None,
                    last_transition_time: Time(jiff::Timestamp::UNIX_EPOCH),
                }],
                ..Default::default()
            });
        }
        c
    }

    fn by_type(v: &[Verdict; 3]) -> BTreeMap<&'static str, (bool, String, String)> {
        v.iter()
            .map(|v| (v.type_, (v.ok, v.reason.clone(), v.message.clone())))
            .collect()
    }

    #[test]
    fn a_valid_pool_on_a_ready_class_is_ready() {
        let v = verdicts(&pool("In"), Some(&class(Some(("True", "Ready", "")))));
        assert!(v.iter().all(|v| v.ok), "{v:?}");
        assert_eq!(v[2].reason, "Ready");
    }

    #[test]
    fn an_unknown_operator_fails_validation_and_readiness() {
        let v = by_type(&verdicts(
            &pool("Equals"),
            Some(&class(Some(("True", "Ready", "")))),
        ));
        let (ok, reason, msg) = &v[VALIDATION_SUCCEEDED];
        assert!(!ok);
        assert_eq!(reason, "NodePoolValidationFailed");
        assert!(msg.contains("unsupported operator Equals"), "{msg}");
        assert!(v[NODE_CLASS_READY].0);
        assert_eq!(
            v[READY],
            (
                false,
                "UnhealthyDependents".into(),
                "ValidationSucceeded=False".into()
            )
        );
    }

    #[test]
    fn a_missing_or_unready_class_fails_node_class_ready_with_its_reason() {
        let v = by_type(&verdicts(&pool("In"), None));
        assert_eq!(v[NODE_CLASS_READY].1, "NodeClassNotFound");
        assert!(v[NODE_CLASS_READY].2.contains("SSHNodeClass c"));
        assert_eq!(v[READY].2, "NodeClassReady=False");

        let v = by_type(&verdicts(
            &pool("In"),
            Some(&class(Some((
                "False",
                "NoClusterEndpoint",
                "no spec.cluster and no kube-public/cluster-info",
            )))),
        ));
        assert_eq!(v[NODE_CLASS_READY].1, "NoClusterEndpoint");
        assert!(v[NODE_CLASS_READY].2.contains("kube-public/cluster-info"));
        assert!(!v[READY].0);

        let v = by_type(&verdicts(&pool("In"), Some(&class(None))));
        assert_eq!(v[NODE_CLASS_READY].1, "NodeClassReadinessUnknown");
    }

    #[test]
    fn long_messages_are_capped() {
        let v = Verdict::failed("X", "R", "é".repeat(5000));
        assert!(v.message.len() <= MAX_MESSAGE + '…'.len_utf8());
    }
}
