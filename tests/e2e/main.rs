//! End-to-end tier (E1–E11, and S44/S52/S62 on the real control plane): the real `kpssh controller` binary against a real control plane
//! (kube-apiserver, etcd, kube-scheduler, kube-controller-manager) and real OpenSSH hosts whose
//! profile starts a fake kubelet that really bootstraps with the minted token.
//!
//! A custom harness (`harness = false`): the same binary is also the hosts' daemons (the fake
//! kubelet and runtime, selected by `KPSSH_E2E_ROLE`), and all scenarios run at once — each in
//! its own thread, namespace, node class, NodePool and hosts — so the waits of the scenarios
//! (E3 watches a rebooted host for 90 s) overlap. Arguments that are not options filter the
//! scenarios by substring (`cargo test --test e2e -- E3`); `--list` lists them.

#[path = "../support/controlplane.rs"]
mod controlplane;
#[path = "../support/fake_kubelet.rs"]
mod fake_kubelet;
#[path = "../support/go_layout.rs"]
mod go_layout;
#[path = "../support/nodehost.rs"]
mod nodehost;
#[path = "../support/sshd.rs"]
mod sshd;
#[path = "../support/testhost.rs"]
mod testhost;

mod drain;
mod faults;
mod go_host;
mod kubelet;
mod migration;
mod scale;
mod verified;
mod world;

use std::time::{Duration, Instant};

use futures::FutureExt as _;
use futures::future::BoxFuture;
use world::{Sc, World};

type Outcome = Result<(), String>;
type ScenarioFn = for<'a> fn(&'a mut Sc) -> BoxFuture<'a, Outcome>;

/// Every scenario, named as in SCENARIOS.md.
const SCENARIOS: &[(&str, ScenarioFn)] = &[
    ("E1_scale_up_pod_to_ready_node", |sc| {
        Box::pin(scale::e1(sc))
    }),
    ("E2_consolidation_back_to_warm_pool", |sc| {
        Box::pin(scale::e2(sc))
    }),
    ("E3_rebooted_warm_host_does_not_rejoin", |sc| {
        Box::pin(faults::e3(sc))
    }),
    ("E4_force_deleted_nodeclaim_zombie_guard", |sc| {
        Box::pin(faults::e4(sc))
    }),
    ("E5_power_loss_during_leave", |sc| Box::pin(faults::e5(sc))),
    ("E6_verified_join_and_leave_through_the_shim", |sc| {
        Box::pin(verified::e6(sc))
    }),
    ("E7_rogue_signed_join_refused_by_the_shim", |sc| {
        Box::pin(verified::e7(sc))
    }),
    ("E8_unsigned_verified_profile_refused_before_ssh", |sc| {
        Box::pin(verified::e8(sc))
    }),
    (
        "E9_migration_from_the_go_provider_without_a_disruption",
        |sc| Box::pin(migration::e9(sc)),
    ),
    (
        "E10_adopted_node_with_its_own_name_drained_and_deleted",
        |sc| Box::pin(drain::e10(sc)),
    ),
    (
        "S44_pdb_blocked_drain_without_grace_period_holds_the_host",
        |sc| Box::pin(drain::s44(sc)),
    ),
    ("S52_kubectl_delete_node_drains_and_releases", |sc| {
        Box::pin(drain::s52(sc))
    }),
    (
        "S62_go_layout_verified_host_probes_joins_and_leaves_through_sudo",
        |sc| Box::pin(go_host::s62(sc)),
    ),
    (
        "E11_real_kubelet_joins_through_the_shipped_profile_and_runs_pods",
        |sc| Box::pin(kubelet::e11(sc)),
    ),
];

/// The whole tier is bounded; a scenario bounds each of its own waits well inside this.
const SCENARIO_LIMIT: Duration = Duration::from_secs(600);

/// Scenarios that set the cluster up before the controller starts (E9: the cluster as the Go
/// provider left it). The controller starts once they are done, the other scenarios after it.
fn prepares_first(name: &str) -> bool {
    name.starts_with("E9_")
}

fn main() {
    fake_kubelet::run_role_if_asked();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let filters: Vec<&String> = args.iter().filter(|a| !a.starts_with('-')).collect();
    let selected: Vec<_> = SCENARIOS
        .iter()
        .filter(|(name, _)| filters.is_empty() || filters.iter().any(|f| name.contains(f.as_str())))
        .collect();
    if args.iter().any(|a| a == "--list") {
        for (name, _) in &selected {
            println!("{name}: test");
        }
        return;
    }
    if selected.is_empty() {
        println!("running 0 tests");
        return;
    }
    let started = Instant::now();
    let world: &'static World = Box::leak(Box::new(World::start()));
    world.expect_preparations(selected.iter().filter(|(n, _)| prepares_first(n)).count());
    let handles: Vec<_> = selected
        .iter()
        .map(|(name, f)| {
            let (name, f) = (*name, *f);
            // `E10_…` → `e10`: the scenario's namespace, class, NodePool and host names.
            let id = name.split('_').next().unwrap_or(name).to_ascii_lowercase();
            let h = std::thread::Builder::new()
                .name(name.into())
                .spawn(move || run_one(world, id, prepares_first(name), f))
                .expect("spawn scenario thread");
            (name, h)
        })
        .collect();
    world.wait_prepared(Duration::from_secs(300));
    world.start_controller();
    println!(
        "e2e: control plane and controller up after {:.1}s; running {} scenarios",
        started.elapsed().as_secs_f64(),
        selected.len()
    );
    let mut failed = 0;
    let mut summary = String::new();
    for (name, h) in handles {
        let (outcome, took) = match h.join() {
            Ok(r) => r,
            Err(p) => (Err(panic_text(&p)), Duration::ZERO),
        };
        match outcome {
            Ok(()) => summary.push_str(&format!("  ok      {:6.1}s  {name}\n", took.as_secs_f64())),
            Err(e) => {
                failed += 1;
                summary.push_str(&format!("  FAILED  {:6.1}s  {name}\n", took.as_secs_f64()));
                eprintln!("\n==== {name} FAILED\n{e}\n");
            }
        }
    }
    world.stop();
    // Every host was dropped with its scenario: none of its daemons may be left.
    let leftovers = testhost::daemons_of(std::process::id());
    if !leftovers.is_empty() {
        failed += 1;
        eprintln!("host daemons survived their hosts: pids {leftovers:?}");
    }
    println!(
        "\ne2e scenarios:\n{summary}e2e: {} passed, {failed} failed, tier wall time {:.1}s",
        selected.len() - failed,
        started.elapsed().as_secs_f64()
    );
    // Exit through `exit` so the control plane's atexit teardown runs.
    std::process::exit(i32::from(failed > 0));
}

fn panic_text(p: &Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "panic".into())
}

/// One scenario on its own thread and runtime. Every process a scenario forks (sshd) is
/// forked by this thread, which outlives the scenario's hosts (PR_SET_PDEATHSIG is per thread).
fn run_one(
    world: &'static World,
    id: String,
    prepares: bool,
    f: ScenarioFn,
) -> (Outcome, Duration) {
    if !prepares {
        world.wait_started();
    }
    let started = Instant::now();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let outcome = rt.block_on(async {
        let mut sc = Sc::new(world, &id).await;
        let run = std::panic::AssertUnwindSafe(f(&mut sc)).catch_unwind();
        let res = match tokio::time::timeout(SCENARIO_LIMIT, run).await {
            Ok(Ok(r)) => r,
            Ok(Err(p)) => Err(format!("panicked: {}", panic_text(&p))),
            Err(_) => Err(format!("scenario exceeded {SCENARIO_LIMIT:?}")),
        };
        // A preparing scenario that failed before it was done must not hold the others.
        if prepares {
            sc.prepared();
        }
        match res {
            Ok(()) => Ok(()),
            Err(e) => Err(format!("{e}\n{}", sc.dump().await)),
        }
    });
    (outcome, started.elapsed())
}
