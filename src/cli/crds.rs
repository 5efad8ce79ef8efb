//! `kpssh crds`: print the CustomResourceDefinitions generated from the Rust types.

use clap::Args;

use crate::api::crds;

#[derive(Args, Debug)]
pub struct CrdsArgs {
    /// Print the `karpenter.sh/v1` NodePool and NodeClaim CRDs instead of kpssh's own, for a
    /// cluster that has no Karpenter installed.
    #[arg(long)]
    pub karpenter: bool,
}

pub fn run(args: &CrdsArgs) -> anyhow::Result<i32> {
    let set = if args.karpenter {
        crds::karpenter_crds()
    } else {
        crds::kpssh_crds()
    };
    print!("{}", crds::to_yaml(&set)?);
    Ok(0)
}
