//! Shrinking a failing scenario: retry it with fewer classes, pools, demand entries, hosts,
//! faults and host misbehaviour, even memory, Static node identity, one reduction at a time,
//! keeping every reduction after which the same invariant is still violated. What is left is
//! the smallest scenario found that still fails: a regression file, and a much shorter trace
//! to read.
//!
//! The seed stays the run's seed; a reduction redraws the schedule (fewer hosts, fewer fault
//! kinds), so a reduction can lose the violation even when it was unrelated to it: that
//! reduction is then simply not kept.

use std::time::Duration;

use super::run::{RunOptions, Violation, run_blocking};
use super::scenario::{NodeIdentity, PhaseProbabilities, Scenario};

/// The smallest failing scenario found.
#[derive(Debug, Clone)]
pub struct Shrunk {
    pub scenario: Scenario,
    /// The violation it still shows (of the invariant shrunk for).
    pub violation: Violation,
    /// Simulations run while shrinking.
    pub runs: usize,
}

/// Shrink `scenario` (run with `seed`) while it violates `invariant`, in at most `budget`
/// runs. `None` when the scenario does not violate it in the first place.
pub fn shrink(scenario: &Scenario, seed: u64, invariant: &str, budget: usize) -> Option<Shrunk> {
    let mut shrunk = shrink_with(scenario, budget, |sc| {
        let out = run_blocking(sc, seed, &RunOptions::default()).ok()?;
        out.summary
            .invariant_violations
            .into_iter()
            .find(|v| v.invariant == invariant)
    })?;
    shrunk.scenario.seed = seed;
    Some(shrunk)
}

/// The shrinking loop over any test of failure (`fails`: the violation a scenario still
/// shows, if any): greedy, first reduction that still fails wins, until none does or the
/// budget of calls is spent.
pub fn shrink_with(
    scenario: &Scenario,
    budget: usize,
    mut fails: impl FnMut(&Scenario) -> Option<Violation>,
) -> Option<Shrunk> {
    let mut runs = 1;
    let mut violation = fails(scenario)?;
    let mut best = scenario.clone();
    'outer: while runs < budget {
        for candidate in reductions(&best, &violation) {
            if runs >= budget {
                break 'outer;
            }
            if candidate.validate().is_err() {
                continue;
            }
            runs += 1;
            if let Some(v) = fails(&candidate) {
                best = candidate;
                violation = v;
                continue 'outer;
            }
        }
        break;
    }
    if !best.name.starts_with("shrunk-") {
        best.name = format!("shrunk-{}", best.name);
    }
    Some(Shrunk {
        scenario: best,
        violation,
        runs,
    })
}

/// A measure of how big a scenario is: what shrinking drives down.
pub fn size(sc: &Scenario) -> usize {
    let f = &sc.faults;
    let faults = [
        f.reboot.is_some(),
        f.power_loss.is_some(),
        f.ssh_refusal.is_some(),
        f.host_key_change.is_some(),
        f.slow_handshake.is_some(),
        f.controller_crash.is_some(),
        f.force_delete.is_some(),
        f.profile_bump.is_some(),
        f.api_conflict > 0.0,
        f.api_transient > 0.0,
        f.partition.is_some(),
    ]
    .iter()
    .filter(|x| **x)
    .count();
    sc.hosts() + sc.classes.len() + sc.node_pools.len() + sc.demand.len() + faults
}

/// Every one-step reduction of `sc`, biggest first.
fn reductions(sc: &Scenario, violation: &Violation) -> Vec<Scenario> {
    let mut out = vec![];
    // End the run soon after the violation.
    let end = Duration::from_secs(violation.at_seconds) + 4 * sc.step;
    if end < sc.duration {
        let mut s = sc.clone();
        s.duration = end;
        out.push(s);
    }
    for i in 0..sc.classes.len() {
        if sc.classes.len() > 1 {
            out.push(without_class(sc, i));
        }
    }
    for i in 0..sc.node_pools.len() {
        let mut s = sc.clone();
        let pool = s.node_pools.remove(i).name;
        s.demand
            .retain(|d| d.pool.as_deref() != Some(pool.as_str()));
        out.push(s);
    }
    for i in 0..sc.demand.len() {
        if sc.demand.len() > 1 {
            let mut s = sc.clone();
            s.demand.remove(i);
            out.push(s);
        }
    }
    for i in 0..11 {
        let mut s = sc.clone();
        if drop_fault(&mut s, i) {
            out.push(s);
        }
    }
    if sc.controller.node_repair {
        let mut s = sc.clone();
        s.controller.node_repair = false;
        out.push(s);
    }
    for i in 0..sc.demand.len() {
        if sc.demand[i].pdb.is_some() {
            let mut s = sc.clone();
            s.demand[i].pdb = None;
            out.push(s);
        }
        if sc.demand[i].do_not_disrupt > 0.0 {
            let mut s = sc.clone();
            s.demand[i].do_not_disrupt = 0.0;
            out.push(s);
        }
    }
    for i in 0..sc.node_pools.len() {
        if sc.node_pools[i].termination_grace_period.is_some() {
            let mut s = sc.clone();
            s.node_pools[i].termination_grace_period = None;
            out.push(s);
        }
        if sc.node_pools[i].expire_after.is_some() {
            let mut s = sc.clone();
            s.node_pools[i].expire_after = None;
            out.push(s);
        }
    }
    for i in 0..sc.classes.len() {
        let count = sc.classes[i].count;
        for smaller in [count / 2, count.saturating_sub(1)] {
            if smaller >= 1 && smaller < count {
                let mut s = sc.clone();
                s.classes[i].count = smaller;
                out.push(s);
            }
        }
    }
    for i in 0..sc.classes.len() {
        let c = &sc.classes[i];
        let quiet = PhaseProbabilities::default();
        if c.failure != quiet {
            let mut s = sc.clone();
            s.classes[i].failure = quiet.clone();
            out.push(s);
        }
        if c.hang != quiet {
            let mut s = sc.clone();
            s.classes[i].hang = quiet.clone();
            out.push(s);
        }
        if c.bad_leave_fraction > 0.0 {
            let mut s = sc.clone();
            s.classes[i].bad_leave_fraction = 0.0;
            out.push(s);
        }
        if c.memory_spread_mib > 0 {
            let mut s = sc.clone();
            s.classes[i].memory_spread_mib = 0;
            out.push(s);
        }
        if !c.identity.is_static() {
            let mut s = sc.clone();
            s.classes[i].identity = NodeIdentity::Static;
            out.push(s);
        }
    }
    for i in 0..sc.node_pools.len() {
        if !sc.node_pools[i].limits.is_empty() {
            for k in sc.node_pools[i].limits.keys() {
                let mut s = sc.clone();
                s.node_pools[i].limits.remove(k);
                out.push(s);
            }
        }
    }
    out.dedup();
    out
}

/// `sc` without class `i`, its NodePools, and the demand for either.
fn without_class(sc: &Scenario, i: usize) -> Scenario {
    let mut s = sc.clone();
    let class = s.classes.remove(i).name;
    let gone: Vec<String> = s
        .node_pools
        .iter()
        .filter(|p| p.class == class)
        .map(|p| p.name.clone())
        .collect();
    s.node_pools.retain(|p| p.class != class);
    s.demand.retain(|d| {
        // Demand without a class is for the first class, which may be the one removed.
        let class_of = d.class.as_deref().unwrap_or(sc.classes[0].name.as_str());
        match &d.pool {
            Some(p) => !gone.contains(p),
            None => class_of != class,
        }
    });
    s
}

/// Switch off fault kind `i` (of eleven); false when it was off.
fn drop_fault(s: &mut Scenario, i: usize) -> bool {
    let f = &mut s.faults;
    match i {
        0 => f.reboot.take().is_some(),
        1 => f.power_loss.take().is_some(),
        2 => f.ssh_refusal.take().is_some(),
        3 => f.host_key_change.take().is_some(),
        4 => f.slow_handshake.take().is_some(),
        5 => f.controller_crash.take().is_some(),
        6 => f.force_delete.take().is_some(),
        7 => f.profile_bump.take().is_some(),
        8 => std::mem::take(&mut f.api_conflict) > 0.0,
        9 => std::mem::take(&mut f.api_transient) > 0.0,
        _ => f.partition.take().is_some(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::generate::random_scenario;

    /// Every reduction changes the scenario and grows nothing.
    #[test]
    fn reductions_are_smaller() {
        let v = Violation {
            invariant: "x".into(),
            at_seconds: 60,
            message: String::new(),
        };
        for seed in 0..50 {
            let sc = random_scenario(seed);
            for r in reductions(&sc, &v) {
                assert_ne!(r, sc, "seed {seed}: a reduction that changes nothing");
                assert!(size(&r) <= size(&sc), "seed {seed}: a reduction grew");
            }
        }
    }

    /// A failure that needs two hosts of one class and force deletes shrinks to exactly that:
    /// one class of two hosts, no other fault, no demand and no NodePool.
    #[test]
    fn shrinking_keeps_only_what_the_failure_needs() {
        let needs = |sc: &Scenario| {
            let ok = sc.faults.force_delete.is_some()
                && sc.classes.iter().any(|c| c.name == "c0" && c.count >= 2);
            ok.then(|| Violation {
                invariant: "x".into(),
                at_seconds: 600,
                message: "synthetic".into(),
            })
        };
        let sc = (0..500)
            .map(random_scenario)
            .find(|s| needs(s).is_some() && s.classes.len() >= 3 && s.classes[0].count >= 4)
            .expect("a big enough drawn scenario");
        let shrunk = shrink_with(&sc, 500, needs).expect("it fails");
        let s = &shrunk.scenario;
        assert_eq!(s.classes.len(), 1, "{s:?}");
        assert_eq!((s.classes[0].name.as_str(), s.classes[0].count), ("c0", 2));
        assert!(s.demand.is_empty(), "{:?}", s.demand);
        assert!(s.node_pools.is_empty(), "{:?}", s.node_pools);
        assert_eq!(size(s), 2 + 1 + 1, "hosts, class, the one fault");
        assert!(s.duration <= Duration::from_secs(600) + 4 * s.step);
        assert!(s.name.starts_with("shrunk-random-"));
        assert!(
            shrink_with(&sc, 10, |_| None).is_none(),
            "no failure, nothing to shrink"
        );
    }
}
