//! `kpssh status` (also `kubectl kpssh status` when installed as `kubectl-kpssh`): the pool at
//! a glance, read from the cluster: per host class the hosts by state, how many are backing off
//! after failed launches, how many are claimable and how many of those are warm, the hosts with
//! errors (their last probe error or last failed launch, and their backoff), and the claims
//! with their NodeClaim and its age. `-o json` prints the same report as JSON.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use clap::{Args, ValueEnum};
use serde::Serialize;

use crate::api::{HostState, NodeClaim, SSHHost, SSHJoinProfile, SSHNodeClass};
use crate::k8s::{Cluster, ClusterError, KubeCluster};

#[derive(Args, Debug)]
pub struct StatusArgs {
    /// Namespace holding the SSHHosts.
    #[arg(long, short = 'n', env = "KPSSH_POOL_NAMESPACE", default_value = crate::api::DEFAULT_POOL_NAMESPACE)]
    pub namespace: String,
    /// Output format.
    #[arg(long, short = 'o', value_enum, default_value_t = Output::Text)]
    pub output: Output,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Output {
    Text,
    Json,
}

#[derive(Debug, thiserror::Error)]
pub enum StatusError {
    #[error("no cluster: {0} (set KUBECONFIG or run in-cluster)")]
    Config(String),
    #[error("reading {what}: {source}")]
    Read {
        what: &'static str,
        source: ClusterError,
    },
}

#[derive(Debug, Serialize, PartialEq)]
pub struct Report {
    pub namespace: String,
    pub classes: Vec<ClassReport>,
}

#[derive(Debug, Serialize, PartialEq)]
pub struct ClassReport {
    pub class: String,
    pub hosts: usize,
    /// Every state, zero included.
    pub states: BTreeMap<String, usize>,
    /// Hosts whose launch backoff runs (S63): not claimed until it ends.
    pub backing_off: usize,
    /// Available, not in maintenance and not backing off.
    pub claimable: usize,
    /// Claimable with an install marker current for some node class: joins in seconds.
    pub warm: usize,
    /// warm / claimable (0 when nothing is claimable).
    pub warm_ratio: f64,
    pub errors: Vec<HostError>,
    pub claims: Vec<ClaimRow>,
}

#[derive(Debug, Serialize, PartialEq)]
pub struct HostError {
    pub host: String,
    pub state: String,
    pub error: String,
    /// `probe` (status.lastProbeError) or `launch` (status.lastLaunchFailure, with its phase).
    pub kind: String,
    /// Consecutive failed launches, when a backoff is recorded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failed_launches: Option<i32>,
    /// When the host may be claimed again, while its backoff runs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backoff_until: Option<String>,
}

#[derive(Debug, Serialize, PartialEq)]
pub struct ClaimRow {
    pub host: String,
    pub state: String,
    pub nodeclaim: String,
    /// False when the NodeClaim named by the claim no longer exists (a stale claim).
    pub nodeclaim_found: bool,
    pub age_seconds: Option<i64>,
}

pub async fn run(args: StatusArgs) -> anyhow::Result<i32> {
    let config = kube::Config::infer()
        .await
        .map_err(|e| StatusError::Config(e.to_string()))?;
    let client = kube::Client::try_from(config).map_err(|e| StatusError::Config(e.to_string()))?;
    let cluster = KubeCluster::new(client);
    let report = read(&cluster, &args.namespace, jiff::Timestamp::now()).await?;
    match args.output {
        Output::Json => println!("{}", serde_json::to_string_pretty(&report)?),
        Output::Text => print!("{}", render(&report)),
    }
    Ok(0)
}

/// Read the objects and build the report.
pub async fn read<C: Cluster>(
    cluster: &C,
    namespace: &str,
    now: jiff::Timestamp,
) -> Result<Report, StatusError> {
    let err = |what| move |source| StatusError::Read { what, source };
    let hosts: Vec<SSHHost> = cluster
        .list(Some(namespace), None)
        .await
        .map_err(err("SSHHosts"))?;
    let classes: Vec<SSHNodeClass> = cluster
        .list(None, None)
        .await
        .map_err(err("SSHNodeClasses"))?;
    let profiles: Vec<SSHJoinProfile> = cluster
        .list(None, None)
        .await
        .map_err(err("SSHJoinProfiles"))?;
    let claims: Vec<NodeClaim> = cluster.list(None, None).await.map_err(err("NodeClaims"))?;
    Ok(build(namespace, &hosts, &classes, &profiles, &claims, now))
}

/// The report from the objects (pure, so it is tested without a cluster).
pub fn build(
    namespace: &str,
    hosts: &[SSHHost],
    classes: &[SSHNodeClass],
    profiles: &[SSHJoinProfile],
    claims: &[NodeClaim],
    now: jiff::Timestamp,
) -> Report {
    // Markers that are current for some node class: a host carrying one joins warm.
    let current: BTreeSet<String> = classes
        .iter()
        .filter_map(|c| {
            profiles
                .iter()
                .find(|p| p.metadata.name.as_deref() == Some(c.spec.join_profile_ref.name.as_str()))
        })
        .map(SSHJoinProfile::marker)
        .collect();
    let mut by_class: BTreeMap<String, Vec<&SSHHost>> = BTreeMap::new();
    for h in hosts {
        by_class.entry(h.class().to_string()).or_default().push(h);
    }
    let classes = by_class
        .into_iter()
        .map(|(class, hosts)| class_report(class, &hosts, &current, claims, now))
        .collect();
    Report {
        namespace: namespace.to_string(),
        classes,
    }
}

fn class_report(
    class: String,
    hosts: &[&SSHHost],
    current: &BTreeSet<String>,
    claims: &[NodeClaim],
    now: jiff::Timestamp,
) -> ClassReport {
    let mut states: BTreeMap<String, usize> = HostState::ALL
        .iter()
        .map(|s| (s.as_str().to_string(), 0))
        .collect();
    let mut claimable = 0;
    let mut backing_off = 0;
    let mut warm = 0;
    let mut errors = vec![];
    let mut rows = vec![];
    for h in hosts {
        let name = h.metadata.name.clone().unwrap_or_default();
        let state = h.state();
        *states.entry(state.as_str().to_string()).or_default() += 1;
        let status = h.status.as_ref();
        if h.backing_off() {
            backing_off += 1;
        }
        if state == HostState::Available && !h.in_maintenance() && !h.backing_off() {
            claimable += 1;
            if status
                .and_then(|s| s.installed_profile.as_ref())
                .is_some_and(|m| current.contains(m))
            {
                warm += 1;
            }
        }
        let backoff = status.and_then(|s| s.launch_backoff.as_ref());
        let failed_launches = backoff.map(|b| b.failures);
        let backoff_until = backoff
            .and_then(|b| b.until.as_ref())
            .map(|t| t.0.strftime("%Y-%m-%dT%H:%M:%SZ").to_string());
        let probe_error = status.and_then(|s| s.last_probe_error.as_ref());
        let launch_failure = status.and_then(|s| s.last_launch_failure.as_ref());
        let error = match (probe_error, launch_failure) {
            (Some(e), _) => Some(("probe", e.clone())),
            (None, Some(f)) => Some(("launch", format!("{} failed: {}", f.phase, f.message))),
            (None, None) => None,
        };
        if let Some((kind, error)) = error {
            errors.push(HostError {
                host: name.clone(),
                state: state.as_str().to_string(),
                error,
                kind: kind.to_string(),
                failed_launches,
                backoff_until,
            });
        }
        if let Some(c) = h.claim() {
            let nc = claims.iter().find(|n| {
                n.metadata.name.as_deref() == Some(c.name.as_str())
                    && n.metadata.uid.as_deref() == Some(c.uid.as_str())
            });
            rows.push(ClaimRow {
                host: name.clone(),
                state: state.as_str().to_string(),
                nodeclaim: c.name.clone(),
                nodeclaim_found: nc.is_some(),
                age_seconds: nc
                    .and_then(|n| n.metadata.creation_timestamp.as_ref())
                    .map(|t| now.duration_since(t.0).as_secs()),
            });
        }
    }
    let warm_ratio = if claimable == 0 {
        0.0
    } else {
        warm as f64 / claimable as f64
    };
    ClassReport {
        class,
        hosts: hosts.len(),
        states,
        backing_off,
        claimable,
        warm,
        warm_ratio,
        errors,
        claims: rows,
    }
}

/// `90s`, `12m`, `3h5m`, `2d4h`.
fn age(secs: i64) -> String {
    let s = secs.max(0);
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m", s / 60),
        3600..86400 => format!("{}h{}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d{}h", s / 86400, s % 86400 / 3600),
    }
}

/// The human-readable report.
pub fn render(r: &Report) -> String {
    let mut out = String::new();
    let short = [
        (HostState::Available, "AVAILABLE"),
        (HostState::Claimed, "CLAIMED"),
        (HostState::InUse, "INUSE"),
        (HostState::Leaving, "LEAVING"),
        (HostState::Unhealthy, "UNHEALTHY"),
        (HostState::Pending, "PENDING"),
        (HostState::Maintenance, "MAINTENANCE"),
    ];
    let _ = writeln!(out, "Pool namespace: {}", r.namespace);
    if r.classes.is_empty() {
        let _ = writeln!(out, "No SSHHosts.");
        return out;
    }
    let mut header = format!("{:<16} {:>5}", "CLASS", "HOSTS");
    for (_, h) in short {
        let _ = write!(header, " {h:>w$}", w = h.len());
    }
    let _ = writeln!(out, "{header} BACKOFF CLAIMABLE  WARM");
    for c in &r.classes {
        let mut line = format!("{:<16} {:>5}", c.class, c.hosts);
        for (s, h) in short {
            let n = c.states.get(s.as_str()).copied().unwrap_or(0);
            let _ = write!(line, " {n:>w$}", w = h.len());
        }
        let _ = writeln!(
            out,
            "{line} {:>7} {:>9} {:>4.0}%",
            c.backing_off,
            c.claimable,
            c.warm_ratio * 100.0
        );
    }
    let errors: Vec<(&str, &HostError)> = r
        .classes
        .iter()
        .flat_map(|c| c.errors.iter().map(move |e| (c.class.as_str(), e)))
        .collect();
    if !errors.is_empty() {
        let _ = writeln!(out, "\nHosts with errors:");
        for (class, e) in errors {
            let backoff = match (&e.backoff_until, e.failed_launches) {
                (Some(until), Some(n)) => {
                    format!(", backing off until {until} after {n} failed launch(es)")
                }
                _ => String::new(),
            };
            let _ = writeln!(
                out,
                "  {}  ({class}, {}{backoff})  {}",
                e.host, e.state, e.error
            );
        }
    }
    let claims: Vec<(&str, &ClaimRow)> = r
        .classes
        .iter()
        .flat_map(|c| c.claims.iter().map(move |row| (c.class.as_str(), row)))
        .collect();
    if !claims.is_empty() {
        let _ = writeln!(out, "\nClaims:");
        let _ = writeln!(
            out,
            "  {:<24} {:<16} {:<10} {:<32} AGE",
            "HOST", "CLASS", "STATE", "NODECLAIM"
        );
        for (class, c) in claims {
            let age = match (c.nodeclaim_found, c.age_seconds) {
                (false, _) => "gone (stale claim)".to_string(),
                (true, Some(s)) => age(s),
                (true, None) => "?".to_string(),
            };
            let _ = writeln!(
                out,
                "  {:<24} {:<16} {:<10} {:<32} {age}",
                c.host, class, c.state, c.nodeclaim
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::age;

    #[test]
    fn ages_read_like_kubectl() {
        assert_eq!(age(42), "42s");
        assert_eq!(age(125), "2m");
        assert_eq!(age(3 * 3600 + 300), "3h5m");
        assert_eq!(age(2 * 86400 + 4 * 3600), "2d4h");
        assert_eq!(age(-5), "0s");
    }
}
