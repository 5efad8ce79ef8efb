//! Reference-oracle tier (S60, S61): kpssh's answers against Go programs that compute the
//! reference ones — Go's own `text/template`, the Go provider's JoinHash, Karpenter core's
//! `NodePool.Hash()` and scheduling requirements — on generated inputs (proptest, at least
//! 1,000 cases per property; `PROPTEST_CASES` raises it); and `kpssh crds --karpenter` against
//! the CRD files of the same Karpenter module (`crds.rs`).
//!
//! The oracles are one Go binary (`tests/oracle/`, built once by `scripts/oracle.sh` and cached
//! under `~/.cache/kpssh/oracle-<hash>/`), run as one long-lived process per property that
//! answers JSON lines.

mod crds;
mod joinhash;
mod nodepool_hash;
mod requirements;
mod support;
mod template_builtins;
mod templates;
