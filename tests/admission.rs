//! CRD admission against a real kube-apiserver: every v1beta1 rule of DESIGN §1 accepts what it
//! should and rejects the rest with 422 Invalid.

#[path = "support/controlplane.rs"]
mod controlplane;

use controlplane::ControlPlane;
use k8s_openapi::api::core::v1::Namespace;
use kpssh::api::{SSHHost, SSHJoinProfile, SSHNodeClass, crds};
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::ApiResource;
use serde_json::{Value, json};

async fn setup() -> kube::Client {
    let cp = ControlPlane::shared();
    let yaml = crds::to_yaml(&crds::kpssh_crds()).expect("crd yaml");
    cp.install_crds(&yaml).await;
    let client = cp.client().await;
    let ns: Api<Namespace> = Api::all(client.clone());
    let _ = ns
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "pool"}})).expect("ns"),
        )
        .await;
    client
}

fn api<K: kube::Resource<DynamicType = ()>>(
    client: &kube::Client,
    ns: Option<&str>,
) -> Api<DynamicObject> {
    let ar = ApiResource::erase::<K>(&());
    match ns {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
        None => Api::all_with(client.clone(), &ar),
    }
}

fn obj(kind: &str, name: &str, ns: Option<&str>, spec: Value) -> DynamicObject {
    let mut meta = json!({"name": name});
    if let Some(ns) = ns {
        meta["namespace"] = json!(ns);
    }
    serde_json::from_value(json!({
        "apiVersion": "karpenter.dklesev.github.io/v1beta1",
        "kind": kind,
        "metadata": meta,
        "spec": spec,
    }))
    .expect("object")
}

/// Create and expect success; returns the stored object.
async fn accept(api: &Api<DynamicObject>, o: DynamicObject) -> DynamicObject {
    let name = o.metadata.name.clone().unwrap_or_default();
    api.create(&PostParams::default(), &o)
        .await
        .unwrap_or_else(|e| panic!("{name} should be accepted: {e}"))
}

/// Create and expect a 422 whose message mentions `needle`.
async fn reject(api: &Api<DynamicObject>, o: DynamicObject, needle: &str) {
    let name = o.metadata.name.clone().unwrap_or_default();
    match api.create(&PostParams::default(), &o).await {
        Ok(_) => panic!("{name} should be rejected ({needle})"),
        Err(kube::Error::Api(s)) => {
            assert_eq!(s.code, 422, "{name}: {}", s.message);
            assert_eq!(s.reason, "Invalid", "{name}: {}", s.message);
            assert!(
                s.message.contains(needle),
                "{name}: {:?} lacks {needle:?}",
                s.message
            );
        }
        Err(e) => panic!("{name}: unexpected error {e}"),
    }
}

fn host_spec(extra: Value) -> Value {
    let mut spec = json!({
        "address": "10.0.0.1",
        "sshKeySecretRef": {"name": "key"},
        "capacity": {"cpu": "4", "memory": "8Gi"},
    });
    if let (Some(s), Some(e)) = (spec.as_object_mut(), extra.as_object()) {
        for (k, v) in e {
            s.insert(k.clone(), v.clone());
        }
    }
    spec
}

#[tokio::test]
async fn sshhost_rules() {
    let client = setup().await;
    let hosts = api::<SSHHost>(&client, Some("pool"));
    let stored = accept(
        &hosts,
        obj("SSHHost", "defaults", Some("pool"), host_spec(json!({}))),
    )
    .await;
    assert_eq!(stored.data["spec"]["port"], 22, "port defaults to 22");
    assert_eq!(stored.data["spec"]["user"], "root", "user defaults to root");
    assert_eq!(stored.data["spec"]["execMode"], "Raw");
    for (name, port) in [("port-zero", 0), ("port-big", 65536)] {
        reject(
            &hosts,
            obj(
                "SSHHost",
                name,
                Some("pool"),
                host_spec(json!({"port": port})),
            ),
            "spec.port",
        )
        .await;
    }
    reject(
        &hosts,
        obj(
            "SSHHost",
            "no-key-name",
            Some("pool"),
            host_spec(json!({"sshKeySecretRef": {"name": ""}})),
        ),
        "sshKeySecretRef.name",
    )
    .await;
    reject(
        &hosts,
        obj(
            "SSHHost",
            "no-memory",
            Some("pool"),
            host_spec(json!({"capacity": {"cpu": "2"}})),
        ),
        "capacity must hold cpu and memory",
    )
    .await;
    for (i, ip) in ["10.1.2.3", "fd00::1", "2001:db8::42"].iter().enumerate() {
        accept(
            &hosts,
            obj(
                "SSHHost",
                &format!("ip-ok-{i}"),
                Some("pool"),
                host_spec(json!({"nodeAddress": ip})),
            ),
        )
        .await;
    }
    for (i, bad) in ["host.example.com", "1.2.3.4.5", "999.999.999.999"]
        .iter()
        .enumerate()
    {
        reject(
            &hosts,
            obj(
                "SSHHost",
                &format!("ip-bad-{i}"),
                Some("pool"),
                host_spec(json!({"nodeAddress": bad})),
            ),
            "nodeAddress must be an IPv4 or IPv6 literal",
        )
        .await;
    }
    reject(
        &hosts,
        obj(
            "SSHHost",
            "exec-case",
            Some("pool"),
            host_spec(json!({"execMode": "verified"})),
        ),
        "spec.execMode",
    )
    .await;
    reject(
        &hosts,
        obj(
            "SSHHost",
            "verified-no-signers",
            Some("pool"),
            host_spec(json!({"execMode": "Verified"})),
        ),
        "requires at least one entry in trustedSigners",
    )
    .await;
    accept(
        &hosts,
        obj(
            "SSHHost",
            "verified-ok",
            Some("pool"),
            host_spec(json!({"execMode": "Verified", "trustedSigners": ["ssh-ed25519 AAAA x"]})),
        ),
    )
    .await;
    let seventeen: Vec<String> = (0..17).map(|i| format!("ssh-ed25519 AAAA{i}")).collect();
    reject(
        &hosts,
        obj(
            "SSHHost",
            "too-many-signers",
            Some("pool"),
            host_spec(json!({"execMode": "Verified", "trustedSigners": seventeen})),
        ),
        "spec.trustedSigners",
    )
    .await;

    // address is immutable
    let patch = json!({"spec": {"address": "10.9.9.9"}});
    match hosts
        .patch("defaults", &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Err(kube::Error::Api(s)) => {
            assert_eq!(s.code, 422);
            assert!(s.message.contains("address is immutable"), "{}", s.message);
        }
        other => panic!("address change must be rejected, got {other:?}"),
    }
    // status.state is a closed enum
    let status = json!({"status": {"state": "Bogus"}});
    match hosts
        .patch_status("defaults", &PatchParams::default(), &Patch::Merge(&status))
        .await
    {
        Err(kube::Error::Api(s)) => {
            assert_eq!(s.code, 422);
            assert!(s.message.contains("status.state"), "{}", s.message);
        }
        other => panic!("unknown state must be rejected, got {other:?}"),
    }
    let ok = json!({"status": {"state": "Available"}});
    hosts
        .patch_status("defaults", &PatchParams::default(), &Patch::Merge(&ok))
        .await
        .expect("Available is a state");
}

fn class_spec(extra: Value) -> Value {
    let mut spec = json!({"joinProfileRef": {"name": "tls-bootstrap"}});
    if let (Some(s), Some(e)) = (spec.as_object_mut(), extra.as_object()) {
        for (k, v) in e {
            s.insert(k.clone(), v.clone());
        }
    }
    spec
}

#[tokio::test]
async fn sshnodeclass_rules() {
    let client = setup().await;
    let classes = api::<SSHNodeClass>(&client, None);
    let stored = accept(
        &classes,
        obj("SSHNodeClass", "nc-defaults", None, class_spec(json!({}))),
    )
    .await;
    assert_eq!(stored.data["spec"]["pricePerCPUHour"], "0.02");
    assert_eq!(stored.data["spec"]["providerIDSource"], "Static");
    assert_eq!(stored.data["spec"]["maxPods"], 110);
    assert_eq!(
        stored.data["spec"]["kubeReserved"],
        json!({"cpu": "80m", "memory": "300Mi"})
    );
    accept(
        &classes,
        obj(
            "SSHNodeClass",
            "nc-vars-ok",
            None,
            class_spec(json!({"vars": {"k8sMinor": "36", "_x": "y"}})),
        ),
    )
    .await;
    reject(
        &classes,
        obj(
            "SSHNodeClass",
            "nc-vars-digit",
            None,
            class_spec(json!({"vars": {"1abc": "x"}})),
        ),
        "shell identifiers",
    )
    .await;
    reject(
        &classes,
        obj(
            "SSHNodeClass",
            "nc-vars-dash",
            None,
            class_spec(json!({"vars": {"a-b": "x"}})),
        ),
        "shell identifiers",
    )
    .await;
    reject(
        &classes,
        obj(
            "SSHNodeClass",
            "nc-vars-long",
            None,
            class_spec(json!({"vars": {"a": "x".repeat(2049)}})),
        ),
        "at most 2048",
    )
    .await;
    for (i, p) in ["abc", "1e3", "-1", "0.02.1"].iter().enumerate() {
        reject(
            &classes,
            obj(
                "SSHNodeClass",
                &format!("nc-price-{i}"),
                None,
                class_spec(json!({"pricePerCPUHour": p})),
            ),
            "pricePerCPUHour",
        )
        .await;
    }
    accept(
        &classes,
        obj(
            "SSHNodeClass",
            "nc-price-ok",
            None,
            class_spec(json!({"pricePerCPUHour": "1.25"})),
        ),
    )
    .await;
    reject(
        &classes,
        obj(
            "SSHNodeClass",
            "nc-pid-case",
            None,
            class_spec(json!({"providerIDSource": "adopt"})),
        ),
        "providerIDSource",
    )
    .await;
    reject(
        &classes,
        obj(
            "SSHNodeClass",
            "nc-empty-profile",
            None,
            json!({"joinProfileRef": {"name": ""}}),
        ),
        "joinProfileRef.name",
    )
    .await;
    reject(
        &classes,
        obj(
            "SSHNodeClass",
            "nc-empty-secret",
            None,
            class_spec(json!({"joinSecretRef": {"name": ""}})),
        ),
        "joinSecretRef.name",
    )
    .await;
    reject(
        &classes,
        obj(
            "SSHNodeClass",
            "nc-http",
            None,
            class_spec(json!({"cluster": {"endpoint": "http://api:6443"}})),
        ),
        "https://",
    )
    .await;
    accept(
        &classes,
        obj(
            "SSHNodeClass",
            "nc-https",
            None,
            class_spec(json!({"cluster": {"endpoint": "https://api:6443"}})),
        ),
    )
    .await;
    reject(
        &classes,
        obj(
            "SSHNodeClass",
            "nc-reserved",
            None,
            class_spec(json!({"kubeReserved": {"gpu": "1"}})),
        ),
        "kubeReserved",
    )
    .await;
    let gate_pods = json!({"taintKey": "a", "removeWhen": {"podsReady": {"namespace": "kube-system", "selector": {"matchLabels": {"k": "v"}}}}});
    let gate_cond = json!({"taintKey": "b", "removeWhen": {"nodeCondition": {"type": "NetworkReady", "status": "True"}}});
    // S62: the Go provider v1.1 leaves nodeCondition.status out (it means True).
    let gate_no_status =
        json!({"taintKey": "c", "removeWhen": {"nodeCondition": {"type": "NetworkReady"}}});
    accept(
        &classes,
        obj(
            "SSHNodeClass",
            "nc-gates-ok",
            None,
            class_spec(json!({"startupTaintGates": [gate_pods, gate_cond, gate_no_status]})),
        ),
    )
    .await;
    let both = json!({"taintKey": "a", "removeWhen": {"podsReady": {"namespace": "x", "selector": {"matchLabels": {"k": "v"}}}, "nodeCondition": {"type": "T", "status": "True"}}});
    reject(
        &classes,
        obj(
            "SSHNodeClass",
            "nc-gate-both",
            None,
            class_spec(json!({"startupTaintGates": [both]})),
        ),
        "removeWhen needs exactly one of podsReady or nodeCondition",
    )
    .await;
    // The flat shape an earlier kpssh accepted is refused with the field to add.
    let flat = json!({"taintKey": "a", "nodeCondition": {"type": "T"}});
    reject(
        &classes,
        obj(
            "SSHNodeClass",
            "nc-gate-flat",
            None,
            class_spec(json!({"startupTaintGates": [flat]})),
        ),
        "removeWhen",
    )
    .await;
    let neither = json!({"taintKey": "a", "removeWhen": {}});
    reject(
        &classes,
        obj(
            "SSHNodeClass",
            "nc-gate-neither",
            None,
            class_spec(json!({"startupTaintGates": [neither]})),
        ),
        "removeWhen needs exactly one of podsReady or nodeCondition",
    )
    .await;
    reject(
        &classes,
        obj(
            "SSHNodeClass",
            "nc-gate-dup",
            None,
            class_spec(json!({"startupTaintGates": [gate_cond, gate_cond]})),
        ),
        "taintKey values must be unique",
    )
    .await;
    let empty_sel =
        json!({"taintKey": "a", "removeWhen": {"podsReady": {"namespace": "x", "selector": {}}}});
    reject(
        &classes,
        obj(
            "SSHNodeClass",
            "nc-gate-empty-sel",
            None,
            class_spec(json!({"startupTaintGates": [empty_sel]})),
        ),
        "selector must not be empty",
    )
    .await;
    let zero = json!({"taintKey": "a", "removeWhen": {"podsReady": {"namespace": "x", "selector": {"matchLabels": {"k": "v"}}, "minReady": 0}}});
    reject(
        &classes,
        obj(
            "SSHNodeClass",
            "nc-gate-zero",
            None,
            class_spec(json!({"startupTaintGates": [zero]})),
        ),
        "minReady",
    )
    .await;
}

fn profile_spec(extra: Value) -> Value {
    let mut spec = json!({"scripts": {"install": "true", "join": "true", "leave": "true"}});
    if let (Some(s), Some(e)) = (spec.as_object_mut(), extra.as_object()) {
        for (k, v) in e {
            s.insert(k.clone(), v.clone());
        }
    }
    spec
}

#[tokio::test]
async fn sshjoinprofile_rules() {
    let client = setup().await;
    let profiles = api::<SSHJoinProfile>(&client, None);
    let stored = accept(
        &profiles,
        obj(
            "SSHJoinProfile",
            "p-defaults",
            None,
            profile_spec(json!({})),
        ),
    )
    .await;
    assert_eq!(stored.data["spec"]["version"], "1");
    assert_eq!(
        stored.data["spec"]["timeouts"],
        json!({"install": "10m", "join": "5m", "leave": "3m"})
    );
    for (i, t) in ["20m", "1h30m", "90s"].iter().enumerate() {
        accept(
            &profiles,
            obj(
                "SSHJoinProfile",
                &format!("p-t-ok-{i}"),
                None,
                profile_spec(json!({"timeouts": {"join": t}})),
            ),
        )
        .await;
    }
    for (i, t) in ["1.5h", "500ms", "banana"].iter().enumerate() {
        reject(
            &profiles,
            obj(
                "SSHJoinProfile",
                &format!("p-t-bad-{i}"),
                None,
                profile_spec(json!({"timeouts": {"join": t}})),
            ),
            "spec.timeouts.join",
        )
        .await;
    }
    reject(
        &profiles,
        obj(
            "SSHJoinProfile",
            "p-version",
            None,
            profile_spec(json!({"version": "1 2"})),
        ),
        "spec.version",
    )
    .await;
    reject(
        &profiles,
        obj(
            "SSHJoinProfile",
            "p-no-leave",
            None,
            json!({"scripts": {"install": "true", "join": "true"}}),
        ),
        "spec.scripts.leave",
    )
    .await;
    let big = "x".repeat(256 * 1024 + 1);
    reject(
        &profiles,
        obj(
            "SSHJoinProfile",
            "p-big",
            None,
            json!({"scripts": {"install": big, "join": "true", "leave": "true"}}),
        ),
        "spec.scripts.install",
    )
    .await;
    let big_sig = "s".repeat(16 * 1024 + 1);
    reject(
        &profiles,
        obj(
            "SSHJoinProfile",
            "p-big-sig",
            None,
            profile_spec(json!({"signatures": {"join": big_sig}})),
        ),
        "spec.signatures.join",
    )
    .await;
}

/// #23: the CRD's rules are as strict as the code that later reads the fields, so an object the
/// API server admits is one the controller accepts: addresses (IP literal or DNS name, the
/// same test as `valid_address`), script size in UTF-8 bytes (not characters), and the v2
/// `expires` shape the manifest needs. Before, any address, scripts of up to 256 Ki characters
/// (up to 1 MiB of UTF-8) and RFC 3339 times with fractions or offsets were admitted.
#[tokio::test]
async fn cel_rules_are_as_strict_as_the_code() {
    use kpssh::api::host::valid_address;
    use kpssh::profile::verified::Expires;
    let client = setup().await;
    let hosts = api::<SSHHost>(&client, Some("pool"));
    let samples = [
        "10.0.0.7",
        "fd00::7",
        "host-1.example.com",
        "Host1",
        "a",
        "1.2.3.4.5",
        "-leading.example.com",
        "trailing-.example.com",
        "under_score.example.com",
        "two..dots",
        "space here",
        "-oProxyCommand=sh",
        "host.example.com.",
        "fe80::1%eth0",
        "[fd00::1]",
        "host:22",
    ];
    for (i, address) in samples.iter().enumerate() {
        for (field, spec) in [
            ("address", host_spec(json!({"address": address}))),
            (
                "proxyJump",
                host_spec(
                    json!({"proxyJump": {"address": address, "sshKeySecretRef": {"name": "b"}}}),
                ),
            ),
        ] {
            let o = obj(
                "SSHHost",
                &format!("addr-{field}-{i}").to_lowercase(),
                Some("pool"),
                spec,
            );
            if valid_address(address) {
                accept(&hosts, o).await;
            } else {
                reject(&hosts, o, "address must be an IP literal or a DNS name").await;
            }
        }
    }

    let profiles = api::<SSHJoinProfile>(&client, None);
    // 140,000 two-byte characters: under maxLength (characters), over 256 KiB in bytes.
    let wide = "é".repeat(140_000);
    assert!(wide.chars().count() <= 262_144 && wide.len() > 262_144);
    reject(
        &profiles,
        obj(
            "SSHJoinProfile",
            "p-wide",
            None,
            json!({"scripts": {"install": wide, "join": "true", "leave": "true"}}),
        ),
        "at most 262144 bytes",
    )
    .await;
    let fits = "é".repeat(131_072);
    assert_eq!(fits.len(), 262_144);
    accept(
        &profiles,
        obj(
            "SSHJoinProfile",
            "p-wide-fits",
            None,
            json!({"scripts": {"install": "true", "join": fits, "leave": "true"}}),
        ),
    )
    .await;

    for (i, expires) in [
        "2027-01-01T12:00:00Z",
        "2027-01-01T12:00:00.5Z",
        "2027-01-01T12:00:00+00:00",
        "2027-13-01T12:00:00Z",
        "2027-01-01 12:00:00Z",
        "2027-01-01T24:00:00Z",
        "2027-1-01T12:00:00Z",
    ]
    .iter()
    .enumerate()
    {
        let o = obj(
            "SSHJoinProfile",
            &format!("p-expires-{i}"),
            None,
            profile_spec(json!({"signaturesV2": {"expires": expires}})),
        );
        if expires.parse::<Expires>().is_ok() {
            accept(&profiles, o).await;
        } else {
            reject(&profiles, o, "signaturesV2.expires").await;
        }
    }
}
