//! Issue #10 item 5: controller memory per idle host (no open SSH session).
//!
//! A counting allocator tracks the live heap. N simulated hosts are created in the in-memory
//! API, the real actor core (supervisor, one host actor per host, router, node classes, the
//! host view) brings them to Available on tokio's paused clock and then idles through several
//! probe intervals. The live heap is read with the controller running, the controller is then
//! stopped and every handle to it dropped, and the heap read again: the difference divided by
//! N is the controller's memory per idle host. What stays (the API store with every host's
//! status, the simulated machines, the runtime) is not the controller's. The status the
//! controller wrote into the store stays too, so the figure does not include it.
//!
//! `cargo bench --bench memory`; `KPSSH_BENCH_HOSTS` (10000) sets N.

#[path = "support/heap.rs"]
mod heap;
#[path = "support/report.rs"]
mod report;

use std::time::Duration;

use kpssh::api::{HostState, SSHHost};
use kpssh::k8s::Cluster;
use kpssh::provider::Config;
use kpssh::sim::SimHost;
use kpssh::sim::world::World;
use report::{Mode, Target};
use serde_json::json;

#[global_allocator]
static ALLOC: heap::Counting = heap::Counting;

use heap::live;

struct Measured {
    hosts: usize,
    with_controller: isize,
    without_controller: isize,
    available_after: Duration,
}

fn main() {
    let mode = Mode::detect();
    let hosts = mode.pick("KPSSH_BENCH_HOSTS", 10_000, 50);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .expect("runtime");
    let m = rt.block_on(measure(hosts));
    let per_host = (m.with_controller - m.without_controller) as f64 / m.hosts as f64;
    let kib = |b: f64| b / 1024.0;
    report::print_table(
        "controller memory per idle host (live heap, counting allocator)",
        &[
            "hosts",
            "heap with controller",
            "heap without",
            "per idle host",
        ],
        &[vec![
            m.hosts.to_string(),
            format!("{:.1} MiB", kib(m.with_controller as f64) / 1024.0),
            format!("{:.1} MiB", kib(m.without_controller as f64) / 1024.0),
            format!("{:.1} KiB", kib(per_host)),
        ]],
    );
    println!(
        "(all {} hosts Available after {:.0} virtual seconds; measured after 3 idle probe intervals)",
        m.hosts,
        m.available_after.as_secs_f64()
    );
    let targets = vec![Target {
        name: "controller memory per idle host (KiB)".into(),
        measured: kib(per_host),
        bound: 32.0,
        at_least: false,
    }];
    report::print_targets(&targets);
    assert!(
        m.with_controller > m.without_controller,
        "stopping the controller must free memory"
    );
    report::write_json(
        mode,
        "memory",
        json!({
            "benchmark": "memory",
            "hosts": m.hosts,
            "heap_with_controller_bytes": m.with_controller,
            "heap_without_controller_bytes": m.without_controller,
            "per_idle_host_bytes": per_host.round(),
            "targets": targets.iter().map(Target::json).collect::<Vec<_>>(),
        }),
    );
}

async fn measure(hosts: usize) -> Measured {
    let w = World::start_bare(Config::default(), 5)
        .await
        .expect("world");
    w.add_profile_and_class("p", "pool")
        .await
        .expect("profile and class");
    let started = tokio::time::Instant::now();
    for i in 0..hosts {
        let addr = format!("10.{}.{}.{}", 100 + i / 65536, (i / 256) % 256, i % 256);
        w.add_host(
            &format!("h{i:05}"),
            "standard",
            SimHost::new(&addr, 16, 64 * 1024 * 1024),
        )
        .await
        .expect("host");
    }
    let available = loop {
        tokio::time::sleep(Duration::from_secs(30)).await;
        let hs: Vec<SSHHost> = w.cluster.list(Some(&w.ns()), None).await.expect("list");
        let n = hs
            .iter()
            .filter(|h| h.state() == HostState::Available)
            .count();
        if n >= hosts {
            break started.elapsed();
        }
        assert!(
            started.elapsed() < Duration::from_secs(6 * 3600),
            "only {n} of {hosts} hosts Available"
        );
    };
    // Idle: three probe intervals with nothing changing.
    tokio::time::sleep(3 * w.ctx.config.probe_interval).await;
    let with_controller = live();
    let World {
        cluster,
        transport,
        ctx,
        supervisor,
        router,
        nodeclasses,
        karpenter,
        karpenter_config: _,
    } = w;
    // Stopping the supervisor stops its host actors.
    supervisor.stop(None);
    router.stop(None);
    nodeclasses.stop(None);
    drop((ctx, supervisor, router, nodeclasses, karpenter));
    // Let the stopped actors' tasks and timers wind down.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let without_controller = live();
    drop((cluster, transport));
    Measured {
        hosts,
        with_controller,
        without_controller,
        available_after: available,
    }
}
