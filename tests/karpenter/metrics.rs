//! Issue 9 metrics in the simulation: the series change when the event happens. A pending pod
//! becomes a NodeClaim and a node (E1 in the simulation: provisioning latency, claims, limiter
//! waits, the billing view), then the empty node is consolidated (S38: a disruption decision,
//! the host detached).

use kpssh::api::HostState;
use kpssh::api::karpenter::Budget;
use kpssh::k8s::Cluster;

use super::*;

/// The value of one sample line `series` (name with labels) in the exposition.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        l.strip_prefix(series)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}

fn scrape(e: &Env) -> String {
    e.w.ctx.metrics.encode(&e.w.ctx.hosts)
}

#[tokio::test(start_paused = true)]
async fn s38_metrics_follow_provisioning_billing_and_consolidation() {
    let e = env().await;
    hosts(&e, "h", "small", 1, 2, 4, 71).await;
    let mut np = nodepool("default");
    np.spec.disruption.consolidate_after = Some("2m".into());
    np.spec.disruption.budgets = vec![Budget {
        nodes: "100%".into(),
        ..Default::default()
    }];
    e.w.cluster.create(&np).await.expect("np");
    let before = scrape(&e);
    assert_eq!(sample(&before, "kpssh_claims_total"), Some(0.0), "{before}");
    assert!(
        sample(
            &before,
            r#"kpssh_limiter_wait_seconds_count{limit="probe"}"#
        )
        .is_some_and(|n| n >= 1.0),
        "probes waited for the probe limit: {before}"
    );
    assert_eq!(
        sample(&before, r#"kpssh_attached_vcpus{nodepool="default"}"#),
        None,
        "nothing attached yet"
    );
    e.w.cluster
        .create(&pod("p", "500m", "256Mi"))
        .await
        .expect("pod");
    assert!(
        e.w.until(3 * MINUTE, || async { running(&e).await == 1 })
            .await
    );
    let ready =
        e.w.until(MINUTE, || async {
            sample(
                &scrape(&e),
                r#"kpssh_provisioning_latency_seconds_count{stage="nodeclaim_to_ready"}"#,
            ) == Some(1.0)
        })
        .await;
    let text = scrape(&e);
    assert!(ready, "{text}");
    assert_eq!(sample(&text, "kpssh_claims_total"), Some(1.0), "{text}");
    for stage in ["pod_to_nodeclaim", "pod_to_ready"] {
        let series = format!(r#"kpssh_provisioning_latency_seconds_count{{stage="{stage}"}}"#);
        assert_eq!(sample(&text, &series), Some(1.0), "{stage}: {text}");
    }
    let total = sample(
        &text,
        r#"kpssh_provisioning_latency_seconds_sum{stage="pod_to_ready"}"#,
    )
    .expect("sum");
    let to_claim = sample(
        &text,
        r#"kpssh_provisioning_latency_seconds_sum{stage="pod_to_nodeclaim"}"#,
    )
    .expect("sum");
    assert!(total > 0.0 && total >= to_claim, "{text}");
    assert_eq!(
        sample(&text, r#"kpssh_limiter_wait_seconds_count{limit="phase"}"#),
        Some(1.0),
        "install and join share one phase slot: {text}"
    );
    assert_eq!(
        sample(&text, r#"kpssh_limiter_wait_seconds_count{limit="dial"}"#),
        Some(2.0),
        "install and join each waited for the dial rate: {text}"
    );
    // The billing view: one 2-vCPU host at the default 0.02 per vCPU-hour.
    assert_eq!(
        sample(&text, r#"kpssh_attached_vcpus{nodepool="default"}"#),
        Some(2.0),
        "{text}"
    );
    let cost = sample(&text, r#"kpssh_cost_per_hour{nodepool="default"}"#).expect("cost");
    assert!((cost - 0.04).abs() < 1e-9, "{text}");
    let depth = sample(&text, r#"kpssh_mailbox_depth{actor="host"}"#).expect("host mailbox");
    assert!(
        (0.0..=2.0).contains(&depth),
        "sends and handles balance: {text}"
    );
    assert_eq!(
        sample(&text, r#"kpssh_disruption_decisions_total{reason="Empty"}"#),
        None,
        "no decision yet"
    );
    // Empty node: consolidated after consolidateAfter, host warm, billing stops.
    e.w.cluster
        .delete::<k8s_openapi::api::core::v1::Pod>(Some("default"), "p", None)
        .await
        .expect("del");
    let ok =
        e.w.until(6 * MINUTE, || async {
            claims(&e).await.is_empty()
                && host_states(&e).await.get(&HostState::Available) == Some(&1)
        })
        .await;
    let text = scrape(&e);
    assert!(ok, "consolidated: {text}");
    assert_eq!(
        sample(&text, r#"kpssh_disruption_decisions_total{reason="Empty"}"#),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        sample(&text, r#"kpssh_attached_vcpus{nodepool="default"}"#),
        Some(0.0),
        "{text}"
    );
    assert_eq!(
        sample(&text, r#"kpssh_cost_per_hour{nodepool="default"}"#),
        Some(0.0),
        "{text}"
    );
    assert_eq!(
        sample(
            &text,
            r#"kpssh_instance_phase_duration_seconds_count{phase="leave",outcome="success"}"#
        ),
        Some(1.0),
        "{text}"
    );
}
