//! Multi-node consolidation (S57), as core's `MultiNodeConsolidation`: a NodePool's
//! under-utilised candidates, in disruption order and within its budget, are tried as prefixes
//! (the first N) in a binary search for the largest N whose pods all fit on the other nodes
//! (delete the N) or, those that do not, on one new node cheaper than the N together (replace
//! the N by one). Always two nodes or more: one alone is single-node consolidation's. As
//! core's, the search assumes that a prefix that cannot be consolidated is not part of a
//! longer one that can, and looks at no more than [`MAX_CANDIDATES`] + 1 nodes.
//!
//! The command found is validated again just before it is acted on, as core's validation does:
//! every candidate is read again from the API (do-not-disrupt, PodDisruptionBudgets) and the
//! placement is simulated again on a fresh view of the cluster; a command that no longer holds
//! is dropped, and single-node consolidation has its turn.

use super::super::provisioning::NewClaim;
use super::super::scheduling::{PodInfo, sort_pods};
use super::super::state::ClusterState;
use super::candidates::Candidate;
use super::consolidation::{Elsewhere, Plan};
use super::exchange::{cordon, uncordon};
use super::replacement::{Replacer, launch_for};
use super::validation::{Decision, Verdict, validate};
use super::{Disrupter, KarpenterError, Reason, Round, mark};
use crate::api::karpenter::claim_type;
use crate::api::{NodeClaim, NodePool, SSHNodeClass};
use crate::k8s::Cluster;
use crate::provider::Context;
use crate::ssh::Transport;

/// Core's `maxParallel`: the search looks at the first 100 candidates (101 when there are
/// more, as core's bounds do).
pub const MAX_CANDIDATES: usize = 100;

/// A candidate as the search sees it.
pub struct Entry<'a> {
    pub candidate: &'a Candidate,
    /// Its node's name.
    pub node: String,
    /// The pods its disruption would move, largest first.
    pub moving: Vec<PodInfo>,
    /// Its instance type (for the price of what it costs now).
    pub ty: Option<String>,
}

/// What to do with the first `len` candidates.
pub enum Action {
    /// Every pod fits on the other nodes.
    Delete,
    /// The pods that fit nowhere else go to one new node (the rest to other nodes).
    Replace(NewClaim),
}

pub struct Command {
    pub len: usize,
    pub plan: Plan,
    pub action: Action,
}

impl Command {
    pub fn decision(&self) -> &'static str {
        match self.action {
            Action::Delete => "delete",
            Action::Replace(_) => "replace",
        }
    }
}

/// What consolidating `prefix` together would be: core's `computeConsolidation` for several
/// candidates. `replacer`: what a replacement may be (None: deletion only).
pub fn compute(
    view: &mut Elsewhere,
    replacer: Option<&Replacer>,
    prefix: &[Entry<'_>],
) -> Option<Command> {
    let nodes: Vec<&str> = prefix.iter().map(|e| e.node.as_str()).collect();
    let mut moving: Vec<PodInfo> = prefix.iter().flat_map(|e| e.moving.clone()).collect();
    sort_pods(&mut moving);
    let (plan, left) = view.plan_many(&nodes, &moving, replacer.is_some())?;
    if left.is_empty() {
        return Some(Command {
            len: prefix.len(),
            plan,
            action: Action::Delete,
        });
    }
    let r = replacer?;
    let mut price = 0.0;
    let mut types = Vec::with_capacity(prefix.len());
    for e in prefix {
        // As core: a candidate whose price is unknown cannot be priced against a replacement.
        let ty = e.ty.as_deref()?;
        price += r.price(ty)?;
        types.push(ty.to_string());
    }
    let new = r.node_for_many(&left, price, &types)?;
    Some(Command {
        len: prefix.len(),
        plan,
        action: Action::Replace(new),
    })
}

/// Core's `firstNConsolidationOption`: the largest prefix of `entries` (at least two) that
/// can be consolidated, by binary search.
pub fn search(
    view: &mut Elsewhere,
    replacer: Option<&Replacer>,
    entries: &[Entry<'_>],
) -> Option<Command> {
    if entries.len() < 2 {
        return None;
    }
    let mut lo = 1;
    let mut hi = if entries.len() <= MAX_CANDIDATES {
        entries.len() - 1
    } else {
        MAX_CANDIDATES
    };
    let mut best = None;
    while lo <= hi {
        let mid = (lo + hi) / 2;
        match compute(view, replacer, &entries[..=mid]) {
            Some(cmd) => {
                best = Some(cmd);
                lo = mid + 1;
            }
            None => hi = mid - 1,
        }
    }
    best
}

/// What a multi-node command did.
#[derive(Default)]
pub(super) struct Outcome {
    /// Claims marked for disruption (a deletion).
    pub marked: Vec<(String, Reason)>,
    /// Claims cordoned and waiting for their common replacement.
    pub replaced: usize,
}

impl Outcome {
    pub fn acted(&self) -> usize {
        self.marked.len() + self.replaced
    }
}

/// The multi-node turn of one NodePool: `candidates` are its under-utilised candidates in
/// disruption order, `budget` how many more of its nodes may be disrupted now.
#[allow(clippy::too_many_arguments)]
pub(super) async fn consolidate<C: Cluster, T: Transport>(
    d: &mut Disrupter,
    ctx: &Context<C, T>,
    state: &ClusterState,
    pool: &NodePool,
    class: Option<&SSHNodeClass>,
    candidates: &[&Candidate],
    pending: &[PodInfo],
    budget: i64,
    round: &mut Round,
    replacer: &mut Option<Option<Replacer>>,
) -> Result<Outcome, KarpenterError> {
    let mut entries = vec![];
    for c in candidates {
        if entries.len() as i64 >= budget {
            break;
        }
        let node = c.node.metadata.name.clone().unwrap_or_default();
        if round.elsewhere(state).wanted_by_pending(pending, &node) {
            continue;
        }
        let mut moving = round.moving(state, &node);
        d.volumes.resolve(ctx, &mut moving).await?;
        // A pod with a constraint this layer cannot check keeps its node: no prefix with it
        // could be consolidated.
        if moving.iter().any(|p| p.unsupported.is_some()) {
            continue;
        }
        entries.push(Entry {
            candidate: c,
            node,
            moving,
            ty: claim_type(&c.claim),
        });
    }
    if entries.len() < 2 {
        return Ok(Outcome::default());
    }
    if let Some(class) = class
        && replacer.is_none()
    {
        *replacer = Some(Replacer::new(ctx, state, pool, class));
    }
    let r = replacer.as_ref().and_then(Option::as_ref);
    let Some(cmd) = search(round.elsewhere(state), r, &entries) else {
        return Ok(Outcome::default());
    };
    let chosen = &entries[..cmd.len];
    // Validation: every candidate as the API has it now, then the placement again on a view
    // of the cluster as it is now.
    for e in chosen {
        let decision = Decision {
            claim: &e.candidate.claim,
            node_name: &e.node,
            reason: Reason::Underutilized,
            replaced: false,
        };
        if validate(ctx, state, &decision).await? != Verdict::Go {
            tracing::debug!(nodes = cmd.len, node = %e.node, "multi-node consolidation abandoned: a candidate changed");
            return Ok(Outcome::default());
        }
    }
    let mut fresh = Elsewhere::new(&state.read());
    let still =
        compute(&mut fresh, r, chosen).is_some_and(|again| match (&cmd.action, &again.action) {
            (Action::Delete, Action::Delete) => true,
            (Action::Replace(a), Action::Replace(b)) => a.instance_type == b.instance_type,
            _ => false,
        });
    if !still {
        tracing::debug!(
            nodes = cmd.len,
            "multi-node consolidation abandoned: the cluster changed"
        );
        return Ok(Outcome::default());
    }
    tracing::info!(
        nodepool = ?pool.metadata.name,
        nodes = cmd.len,
        decision = cmd.decision(),
        pods = cmd.plan.moved(),
        "multi-node consolidation"
    );
    match cmd.action {
        Action::Delete => {
            let mut out = Outcome::default();
            let detail = format!("multi-node consolidation of {} nodes", cmd.len);
            for e in chosen {
                let c = e.candidate;
                if mark(
                    ctx,
                    state,
                    &c.claim,
                    &c.node,
                    Reason::Underutilized,
                    Some(&detail),
                )
                .await?
                {
                    let name = c.claim.metadata.name.clone().unwrap_or_default();
                    out.marked.push((name, Reason::Underutilized));
                }
            }
            // The next pool's turn sees these nodes drained (their pods on their way).
            round.elsewhere = None;
            Ok(out)
        }
        Action::Replace(new) => replace(ctx, state, pool, chosen, &new, round, replacer).await,
    }
}

/// Cordon the nodes of `chosen`, launch their common replacement and record the exchange on
/// each; the exchange is finished per old claim ([`super::exchange::finish`]).
async fn replace<C: Cluster, T: Transport>(
    ctx: &Context<C, T>,
    state: &ClusterState,
    pool: &NodePool,
    chosen: &[Entry<'_>],
    new: &NewClaim,
    round: &mut Round,
    replacer: &mut Option<Option<Replacer>>,
) -> Result<Outcome, KarpenterError> {
    let mut cordoned: Vec<&Entry<'_>> = vec![];
    for e in chosen {
        if !cordon(ctx, &e.node).await? {
            for c in &cordoned {
                uncordon(ctx, &c.node).await?;
            }
            return Ok(Outcome::default());
        }
        cordoned.push(e);
    }
    let olds: Vec<&NodeClaim> = chosen.iter().map(|e| &e.candidate.claim).collect();
    let launched = launch_for(ctx, state, pool, &olds, new, Reason::Underutilized.as_str()).await;
    let kept = match launched {
        Ok((Some(_), kept)) => kept,
        Ok((None, _)) => vec![],
        Err(e) => {
            // Nothing was launched: no old node may stay cordoned.
            for c in &cordoned {
                uncordon(ctx, &c.node).await?;
            }
            return Err(e);
        }
    };
    let mut out = Outcome::default();
    for e in chosen {
        let name = e
            .candidate
            .claim
            .metadata
            .name
            .as_deref()
            .unwrap_or_default();
        if kept.iter().any(|k| k == name) {
            round.elsewhere(state).forget(&e.node);
            out.replaced += 1;
        } else {
            uncordon(ctx, &e.node).await?;
        }
    }
    if out.replaced > 0
        && let Some(Some(r)) = replacer.as_mut()
    {
        r.reserve(&new.instance_type);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::super::consolidation::moving_pods;
    use super::super::consolidation::tests::{node, pod, state};
    use super::*;
    use crate::api::NodeClaim;

    fn candidates(st: &crate::karpenter::state::Inner, names: &[&str]) -> Vec<Candidate> {
        names
            .iter()
            .map(|n| Candidate {
                claim: NodeClaim::new(&format!("nc-{n}"), Default::default()),
                node: (st.nodes.get(*n)).map_or_else(|| node(n, "4"), |n| n.as_ref().clone()),
                reason: Reason::Underutilized,
                pods: moving_pods(st, n).len(),
            })
            .collect()
    }

    fn entries<'a>(st: &crate::karpenter::state::Inner, cs: &'a [Candidate]) -> Vec<Entry<'a>> {
        cs.iter()
            .map(|c| {
                let n = c.node.metadata.name.clone().unwrap_or_default();
                Entry {
                    candidate: c,
                    moving: moving_pods(st, &n),
                    node: n,
                    ty: None,
                }
            })
            .collect()
    }

    /// S57: six nodes of 4 cpu with one 1-cpu pod each. Single-node consolidation deletes one
    /// node per decision; the binary search finds the largest prefix whose pods fit on the
    /// others: four (their four pods on the two left, 3 cpu free each), not five.
    #[test]
    fn s57_binary_search_finds_the_largest_prefix_that_fits_elsewhere() {
        let names = ["n0", "n1", "n2", "n3", "n4", "n5"];
        let nodes: Vec<(&str, &str)> = names.iter().map(|n| (*n, "4")).collect();
        let pods = names
            .iter()
            .map(|n| pod(&format!("p-{n}"), "1", Some(n)))
            .collect();
        let st = state(&nodes, pods);
        let cs = candidates(&st, &names);
        let es = entries(&st, &cs);
        let mut view = Elsewhere::new(&st);
        let cmd = search(&mut view, None, &es).expect("a command");
        assert_eq!(cmd.len, 4, "four nodes deleted together");
        assert_eq!(cmd.decision(), "delete");
        assert_eq!(cmd.plan.moved(), 4);
        // Committed, the two nodes left are full: 3 cpu free each, 2 pods each... and
        // nothing more fits.
        view.commit(cmd.plan);
        assert!(
            search(&mut view, None, &es[4..]).is_none(),
            "the two nodes left hold each other's pods no more"
        );
    }

    /// S57: fewer than two candidates is single-node consolidation's; a prefix whose pods
    /// fit nowhere is no command; a pod this layer cannot check keeps every prefix with it.
    #[test]
    fn s57_no_command_for_one_node_or_pods_that_fit_nowhere() {
        let st = state(
            &[("a", "4"), ("b", "4"), ("c", "4")],
            vec![
                pod("pa", "3", Some("a")),
                pod("pb", "3", Some("b")),
                pod("pc", "3", Some("c")),
            ],
        );
        let cs = candidates(&st, &["a", "b", "c"]);
        let es = entries(&st, &cs);
        let mut view = Elsewhere::new(&st);
        assert!(search(&mut view, None, &es[..1]).is_none(), "one candidate");
        assert!(
            search(&mut view, None, &es).is_none(),
            "3-cpu pods fit nowhere"
        );
        let roomy = state(
            &[("a", "8"), ("b", "8"), ("c", "8")],
            vec![pod("pa", "1", Some("a")), pod("pb", "1", Some("b"))],
        );
        let cs = candidates(&roomy, &["a", "b"]);
        let mut es = entries(&roomy, &cs);
        let mut view = Elsewhere::new(&roomy);
        assert_eq!(search(&mut view, None, &es).map(|c| c.len), Some(2));
        es[0].moving[0].unsupported = Some("topology spread on zone".into());
        assert!(search(&mut view, None, &es).is_none());
    }
}
