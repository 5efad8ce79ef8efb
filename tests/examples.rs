//! Every shipped example parses into its kind, and the API server accepts it.

#[path = "support/controlplane.rs"]
mod controlplane;

use controlplane::ControlPlane;
use k8s_openapi::api::core::v1::{Namespace, Secret};
use kpssh::api::{NodePool, SSHHost, SSHNodeClass, crds};
use kpssh::k8s::{Cluster, ClusterError, KubeCluster};
use serde::Deserialize;
use serde_json::Value;

fn docs(file: &str) -> Vec<Value> {
    let path = format!("{}/examples/{file}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_yaml::Deserializer::from_str(&text)
        .map(|d| Value::deserialize(d).unwrap_or_else(|e| panic!("{path}: {e}")))
        .collect()
}

async fn apply<K: kpssh::k8s::Object>(c: &KubeCluster, v: &Value) {
    let obj: K = serde_json::from_value(v.clone()).unwrap_or_else(|e| panic!("{v}: {e}"));
    match c.create(&obj).await {
        Ok(_) | Err(ClusterError::AlreadyExists { .. }) => {}
        Err(e) => panic!("the API server refused {}: {e}", v["metadata"]["name"]),
    }
}

#[tokio::test]
async fn examples_are_accepted_by_the_api_server() {
    let cp = ControlPlane::shared();
    let yaml = format!(
        "{}{}",
        crds::to_yaml(&crds::kpssh_crds()).expect("yaml"),
        crds::to_yaml(&crds::karpenter_crds()).expect("yaml")
    );
    cp.install_crds(&yaml).await;
    let c = KubeCluster::new(cp.client().await);
    let ns: Namespace =
        serde_json::from_value(serde_json::json!({"metadata": {"name": "kpssh-system"}}))
            .expect("ns");
    match c.create(&ns).await {
        Ok(_) | Err(ClusterError::AlreadyExists { .. }) => {}
        Err(e) => panic!("{e}"),
    }
    let mut seen = 0;
    for file in ["sshhost.yaml", "sshnodeclass.yaml", "nodepool.yaml"] {
        for doc in docs(file) {
            match doc["kind"].as_str() {
                Some("Secret") => apply::<Secret>(&c, &doc).await,
                Some("SSHHost") => apply::<SSHHost>(&c, &doc).await,
                Some("SSHNodeClass") => apply::<SSHNodeClass>(&c, &doc).await,
                Some("NodePool") => {
                    let pool: NodePool = serde_json::from_value(doc.clone()).expect("nodepool");
                    assert!(
                        pool.is_ours(),
                        "the example NodePool must point at an SSHNodeClass"
                    );
                    apply::<NodePool>(&c, &doc).await
                }
                other => panic!("{file}: unexpected kind {other:?}"),
            }
            seen += 1;
        }
    }
    assert_eq!(seen, 4);
}
