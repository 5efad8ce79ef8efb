//! #23, High: the chart's bootstrap-token guard (a ValidatingAdmissionPolicy) on the real
//! kube-apiserver. RBAC lets the controller's service account create and delete Secrets in
//! kube-system and cannot say which; the guard admits exactly the token Secrets the controller
//! makes (`kpssh::actors::host::launch::token_secret`) and refuses everything else a stolen
//! controller identity could try there: a service-account-token Secret (which the token
//! controller would fill with a kube-system service account's token), a foreign name or type,
//! another bootstrap group, a missing ownership label, any update, and deleting a Secret the
//! controller did not create. Reading any Secret there is refused by RBAC (no `get`).

#[path = "support/apply.rs"]
mod apply;
#[path = "support/controlplane.rs"]
mod controlplane;
#[path = "support/helm.rs"]
mod helm;

use std::time::{Duration, Instant};

use apply::apply;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use controlplane::ControlPlane;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{Namespace, Secret};
use kpssh::actors::host::launch::token_secret;
use kpssh::k8s::{Cluster, ClusterError, KubeCluster};
use serde_json::json;

const NS: &str = "kpssh-tg";
const SYSTEM: &str = "kube-system";

fn token(id: &str) -> Secret {
    token_secret(
        id,
        "0123456789abcdef",
        jiff::Timestamp::now() + jiff::SignedDuration::from_hours(1),
        "token guard test",
    )
}

fn data(s: &str) -> ByteString {
    ByteString(s.as_bytes().to_vec())
}

async fn create_as_admin(admin: &KubeCluster, obj: &Secret) {
    match admin.create(obj).await {
        Ok(_) | Err(ClusterError::AlreadyExists { .. }) => {}
        Err(e) => panic!("admin create: {e}"),
    }
}

/// The message of a refusal; panics on anything else.
fn refused(r: Result<(), ClusterError>, what: &str) -> String {
    match r {
        Err(ClusterError::Forbidden { message, .. }) => message,
        other => panic!("{what} must be refused, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bootstrap_token_guard_admits_only_the_controllers_tokens() {
    let cp = ControlPlane::shared();
    let client = cp.client().await;
    let admin = KubeCluster::new(client.clone());
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": NS}})).expect("ns");
    match admin.create(&ns).await {
        Ok(_) | Err(ClusterError::AlreadyExists { .. }) => {}
        Err(e) => panic!("namespace: {e}"),
    }
    let objs = helm::render("tg", NS, &[]).expect("render");
    for obj in &objs {
        let kind = obj["kind"].as_str().unwrap_or_default();
        if kind.contains("Role")
            || kind.starts_with("ValidatingAdmissionPolicy")
            || kind == "ServiceAccount"
        {
            apply(&client, obj, false)
                .await
                .unwrap_or_else(|e| panic!("apply {kind}: {e}"));
        }
    }
    let user = format!("system:serviceaccount:{NS}:tg-kpssh");
    let groups = ["system:serviceaccounts", "system:serviceaccounts:kpssh-tg"];
    let sa = KubeCluster::new(cp.client_for(&user, &groups).await);

    // A service-account-token Secret for a kube-system service account: the classic escalation.
    // RBAC allows the create; only the guard stops it. The API server loads a new policy
    // asynchronously, so wait (bounded) until it answers.
    let sa_token: Secret = serde_json::from_value(json!({
        "metadata": {"name": "tg-escalate", "namespace": SYSTEM,
                     "annotations": {"kubernetes.io/service-account.name": "default"}},
        "type": "kubernetes.io/service-account-token"
    }))
    .expect("secret");
    let deadline = Instant::now() + Duration::from_secs(30);
    let message = loop {
        match sa.create(&sa_token).await {
            Err(ClusterError::Forbidden { message, .. }) => break message,
            Ok(_) => {
                let _ = admin
                    .delete::<Secret>(Some(SYSTEM), "tg-escalate", None)
                    .await;
                assert!(
                    Instant::now() < deadline,
                    "the guard never refused a service-account-token Secret"
                );
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            Err(e) => panic!("unexpected: {e}"),
        }
    };
    assert!(
        message.contains("only bootstrap.kubernetes.io/token Secrets"),
        "{message}"
    );

    // The controller's own token, exactly as the launch code builds it, is admitted.
    sa.create(&token("tg0001"))
        .await
        .expect("the controller's token is admitted");

    // A bootstrap token under another name.
    let mut foreign_name = token("tg0002");
    foreign_name.metadata.name = Some("kpssh-token-tg0002".into());
    let m = refused(
        sa.create(&foreign_name).await.map(|_| ()),
        "a token Secret not named bootstrap-token-*",
    );
    assert!(m.contains("named bootstrap-token-<id>"), "{m}");

    // A bootstrap token for another group (kubeadm's, often bound to CSR auto-approval), and
    // one carrying kpssh's group next to another.
    for groups in [
        "system:bootstrappers:kubeadm:default-node-token",
        "system:bootstrappers:kpssh,system:bootstrappers:kubeadm:default-node-token",
    ] {
        let mut other_group = token("tg0003");
        if let Some(d) = other_group.data.as_mut() {
            d.insert("auth-extra-groups".into(), data(groups));
        }
        let m = refused(
            sa.create(&other_group).await.map(|_| ()),
            "a token for another group",
        );
        assert!(
            m.contains("system:bootstrappers:kpssh and nothing else"),
            "{m}"
        );
    }
    // The group through stringData (merged into data by the API server) is refused too.
    let mut string_data = token("tg0004");
    if let Some(d) = string_data.data.as_mut() {
        d.remove("auth-extra-groups");
    }
    string_data.string_data = Some(
        [(
            "auth-extra-groups".to_string(),
            "system:bootstrappers:kubeadm:default-node-token".to_string(),
        )]
        .into(),
    );
    refused(
        sa.create(&string_data).await.map(|_| ()),
        "a token whose group comes through stringData",
    );
    // Without the ownership label (it could not be deleted later, and marks nothing as ours).
    let mut unlabelled = token("tg0005");
    unlabelled.metadata.labels = None;
    let m = refused(
        sa.create(&unlabelled).await.map(|_| ()),
        "an unlabelled token",
    );
    assert!(m.contains("app.kubernetes.io/managed-by=kpssh"), "{m}");
    // An Opaque Secret named like a token.
    let mut opaque = token("tg0006");
    opaque.type_ = Some("Opaque".into());
    refused(sa.create(&opaque).await.map(|_| ()), "an Opaque Secret");

    // Reading is refused by RBAC, even the controller's own token.
    refused(
        sa.get::<Secret>(Some(SYSTEM), "bootstrap-token-tg0001")
            .await
            .map(|_| ()),
        "reading a token Secret",
    );
    // Updating is refused (RBAC has no update or patch either).
    refused(
        sa.patch::<Secret>(
            Some(SYSTEM),
            "bootstrap-token-tg0001",
            &json!({"data": {"auth-extra-groups": B64.encode("system:bootstrappers:x")}}),
        )
        .await
        .map(|_| ()),
        "patching a token Secret",
    );

    // Deleting: a foreign Secret and a foreign (unlabelled) bootstrap token are refused.
    let foreign: Secret = serde_json::from_value(json!({
        "metadata": {"name": "tg-foreign", "namespace": SYSTEM},
        "stringData": {"key": "value"}
    }))
    .expect("secret");
    create_as_admin(&admin, &foreign).await;
    let mut kubeadm_token = token("tg0007");
    kubeadm_token.metadata.labels = None;
    if let Some(d) = kubeadm_token.data.as_mut() {
        d.insert(
            "auth-extra-groups".into(),
            data("system:bootstrappers:kubeadm:default-node-token"),
        );
    }
    create_as_admin(&admin, &kubeadm_token).await;
    for name in ["tg-foreign", "bootstrap-token-tg0007"] {
        let m = refused(
            sa.delete::<Secret>(Some(SYSTEM), name, None)
                .await
                .map(|_| ()),
            "deleting a Secret the controller did not create",
        );
        assert!(m.contains("only its own bootstrap tokens"), "{m}");
        let still: Option<Secret> = admin.get(Some(SYSTEM), name).await.expect("get");
        assert!(still.is_some(), "{name} must survive");
    }
    // Its own token it deletes, and an unlabelled token of kpssh's group (as the Go provider
    // minted them: a migrated host's recorded token).
    sa.delete::<Secret>(Some(SYSTEM), "bootstrap-token-tg0001", None)
        .await
        .expect("the controller deletes its own token");
    let mut go_minted = token("tg0008");
    go_minted.metadata.labels = None;
    create_as_admin(&admin, &go_minted).await;
    sa.delete::<Secret>(Some(SYSTEM), "bootstrap-token-tg0008", None)
        .await
        .expect("the controller deletes a Go provider's kpssh-group token");
    let gone: Option<Secret> = admin
        .get(Some(SYSTEM), "bootstrap-token-tg0001")
        .await
        .expect("get");
    assert!(gone.is_none());
    for name in ["tg-foreign", "bootstrap-token-tg0007"] {
        let _ = admin.delete::<Secret>(Some(SYSTEM), name, None).await;
    }
}
