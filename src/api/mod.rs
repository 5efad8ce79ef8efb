//! The API: kpssh's own `karpenter.dklesev.github.io/v1beta1` kinds and the parts of
//! `karpenter.sh/v1` that kpssh consumes. CRDs are generated from these types (`crds`).

pub mod crds;
pub mod duration;
pub mod host;
pub mod karpenter;
pub mod nodeclass;
pub mod profile;

pub use host::{
    ClaimRef, ExecMode, HostState, LaunchBackoff, LaunchFailure, ProxyJump, SSHHost, SSHHostSpec,
    SSHHostStatus,
};
pub use karpenter::{NodeClaim, NodeClaimSpec, NodeClaimStatus, NodePool, NodePoolSpec};
pub use nodeclass::{ProviderIdSource, SSHNodeClass, SSHNodeClassSpec, SSHNodeClassStatus};
pub use profile::{SSHJoinProfile, SSHJoinProfileSpec};

/// API group of kpssh's own kinds (kept from the Go provider: a drop-in replacement).
pub const GROUP: &str = "karpenter.dklesev.github.io";
pub const VERSION: &str = "v1beta1";
/// Host label naming the host class (= instance type); missing means [`DEFAULT_HOST_CLASS`].
pub const HOST_CLASS_LABEL: &str = "karpenter.dklesev.github.io/host-class";
pub const DEFAULT_HOST_CLASS: &str = "default";
/// Host annotation (presence only) that parks an unclaimed host.
pub const MAINTENANCE_ANNOTATION: &str = "karpenter.dklesev.github.io/maintenance";
/// Set (or changed) on an SSHHost to ask for a probe now; `kpssh probe --host` writes it with
/// the time of the request.
pub const PROBE_ANNOTATION: &str = "karpenter.dklesev.github.io/probe-requested";
/// Finalizer held on node classes while NodeClaims reference them, and on profiles in use.
pub const TERMINATION_FINALIZER: &str = "karpenter.dklesev.github.io/termination";
pub const NODECLASS_HASH_ANNOTATION: &str = "karpenter.dklesev.github.io/nodeclass-hash";
pub const NODECLASS_HASH_VERSION_ANNOTATION: &str =
    "karpenter.dklesev.github.io/nodeclass-hash-version";
pub const NODECLASS_HASH_VERSION: &str = "v1";
/// Default pool namespace holding every SSHHost and its key Secret.
pub const DEFAULT_POOL_NAMESPACE: &str = "kpssh-system";
