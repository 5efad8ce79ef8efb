//! `kpssh crds`: print kpssh's CustomResourceDefinitions (generated from the Rust types), or
//! Karpenter's `karpenter.sh/v1` ones (upstream's files, embedded unchanged).

use clap::Args;

use crate::api::crds;

#[derive(Args, Debug)]
pub struct CrdsArgs {
    /// Print Karpenter's `karpenter.sh/v1` NodePool and NodeClaim CRDs instead of kpssh's own
    /// (upstream's, with their validation), for a cluster that has no Karpenter installed.
    #[arg(long)]
    pub karpenter: bool,
}

pub fn run(args: &CrdsArgs) -> anyhow::Result<i32> {
    if args.karpenter {
        print!("{}", crds::karpenter_crds_yaml());
    } else {
        print!("{}", crds::to_yaml(&crds::kpssh_crds())?);
    }
    Ok(0)
}
