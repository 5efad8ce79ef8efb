//! Controller settings. Defaults follow DESIGN §1 and the scenarios.

use std::time::Duration;

#[derive(Debug, Clone)]
pub struct Config {
    /// Namespace holding every SSHHost and its key Secret.
    pub pool_namespace: String,
    /// Probe period of an unchanged host (S4).
    pub probe_interval: Duration,
    /// `lastProbeTime` is refreshed at most this often when nothing else changed (an hour:
    /// S4 asks an unchanged probe to write nothing, and at 10,000 hosts every 15 minutes
    /// would be about 10 writes a second to etcd that tell nothing but the time).
    pub probe_refresh: Duration,
    /// A host's SSH target (key Secret, pinned host key) is rebuilt at least this often, so a
    /// rotated key is picked up without an edit to the host.
    pub target_refresh: Duration,
    /// Timeout of one probe (dial, handshake and command).
    pub probe_timeout: Duration,
    /// A NodeClaim whose Node has not registered after this long is given up (S37).
    pub registration_timeout: Duration,
    /// Adopt mode: how long to wait for the Node to appear (S21).
    pub adopt_timeout: Duration,
    /// Fleet-wide bounds so that thousands of hosts never stampede.
    pub max_concurrent_probes: usize,
    pub max_concurrent_phases: usize,
    /// NodeClaims the router claims hosts for at once (finalizer, CAS and event in flight); a
    /// burst of claims is spread over this many tasks, each on a host reserved for it.
    pub max_concurrent_claims: usize,
    /// Offer a node class whose hosts differ in architecture as one instance type per arch
    /// (`<class>-<arch>`); off, such a class is not offered at all (S29).
    pub split_mixed_arch: bool,
    pub ssh_dials_per_second: u32,
    /// First retry delay after a failed probe or API write; doubles up to `retry_max`.
    pub retry_base: Duration,
    pub retry_max: Duration,
    /// Bootstrap token lifetime.
    pub token_ttl: Duration,
    /// Verified mode: whether v1 signatures are accepted (`--allow-v1-signatures`; off).
    pub verified: crate::profile::verified::VerifiedPolicy,
    /// S63: a host whose launch failed is not claimed for this long, doubled for each further
    /// consecutive failure up to `launch_backoff_max`.
    pub launch_backoff_base: Duration,
    pub launch_backoff_max: Duration,
    /// Sharding (`--node-classes`): the SSHNodeClasses this controller owns; empty: all.
    pub node_classes: Vec<String>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            pool_namespace: crate::api::DEFAULT_POOL_NAMESPACE.to_string(),
            probe_interval: Duration::from_secs(120),
            probe_refresh: Duration::from_secs(3600),
            target_refresh: Duration::from_secs(15 * 60),
            probe_timeout: Duration::from_secs(30),
            registration_timeout: Duration::from_secs(15 * 60),
            adopt_timeout: Duration::from_secs(4 * 60),
            max_concurrent_probes: 64,
            max_concurrent_phases: 32,
            max_concurrent_claims: 128,
            split_mixed_arch: false,
            ssh_dials_per_second: 50,
            retry_base: Duration::from_secs(5),
            retry_max: Duration::from_secs(300),
            token_ttl: Duration::from_secs(3600),
            verified: crate::profile::verified::VerifiedPolicy::default(),
            launch_backoff_base: Duration::from_secs(60),
            launch_backoff_max: Duration::from_secs(3600),
            node_classes: Vec::new(),
        }
    }
}
