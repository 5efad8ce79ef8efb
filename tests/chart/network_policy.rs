//! The chart's NetworkPolicy (#23): no egress rule without a destination, no open default.

use std::collections::BTreeSet;

use serde_json::Value;

use super::{ALL_ON, of_kind, one};
use crate::helm::render;

/// #23: every egress rule of the NetworkPolicy names its destination (a rule without `to:`
/// allows every address), and SSH and API-server egress have no default: enabling the policy
/// without them, or with a /0 CIDR, fails the render with a message naming the value.
#[test]
fn network_policy_names_every_destination_and_has_no_open_default() {
    let refused: &[(&[&str], &str)] = &[
        (&["networkPolicy.enabled=true"], "networkPolicy.sshCIDRs"),
        (
            &[
                "networkPolicy.enabled=true",
                "networkPolicy.sshCIDRs={10.0.0.0/8}",
            ],
            "networkPolicy.apiServerCIDRs",
        ),
        (
            &[
                "networkPolicy.enabled=true",
                "networkPolicy.sshCIDRs={10.0.0.0/8,0.0.0.0/0}",
                "networkPolicy.apiServerCIDRs={172.18.0.2/32}",
            ],
            "allowAnyDestination",
        ),
        (
            &[
                "networkPolicy.enabled=true",
                "networkPolicy.sshCIDRs={10.0.0.0/8}",
                "networkPolicy.apiServerCIDRs={::/0}",
            ],
            "allowAnyDestination",
        ),
        (
            &[
                "networkPolicy.enabled=true",
                "networkPolicy.sshCIDRs={10.0.0.0/8}",
                "networkPolicy.apiServerCIDRs={172.18.0.2/32}",
                "networkPolicy.dnsTo=null",
            ],
            "networkPolicy.dnsTo",
        ),
    ];
    for (set, names) in refused {
        let err = render("kpssh", "kpssh-system", set)
            .err()
            .unwrap_or_else(|| panic!("{set:?} must be refused"));
        assert!(err.contains(names), "{set:?}: {err}");
    }
    // Disabled (the default), nothing is required and no policy renders.
    let objs = render("kpssh", "kpssh-system", &[]).expect("defaults");
    assert!(of_kind(&objs, "NetworkPolicy").is_empty());

    let objs = render("kpssh", "kpssh-system", ALL_ON).expect("render");
    let np = one(&objs, "NetworkPolicy");
    let egress = np["spec"]["egress"].as_array().expect("egress rules");
    assert_eq!(egress.len(), 3, "DNS, API server, SSH: {egress:?}");
    for rule in egress {
        let to = rule["to"].as_array().map(Vec::len).unwrap_or(0);
        assert!(
            to > 0,
            "an egress rule without `to:` allows every address: {rule}"
        );
    }
    let blocks = |rule: &Value| -> Vec<String> {
        (rule["to"].as_array().into_iter().flatten())
            .filter_map(|p| p["ipBlock"]["cidr"].as_str().map(str::to_string))
            .collect()
    };
    let port_set = |rule: &Value| -> BTreeSet<i64> {
        (rule["ports"].as_array().into_iter().flatten())
            .filter_map(|p| p["port"].as_i64())
            .collect()
    };
    let dns = &egress[0];
    assert_eq!(port_set(dns), BTreeSet::from([53]));
    assert_eq!(
        dns["to"][0]["podSelector"]["matchLabels"]["k8s-app"], "kube-dns",
        "DNS only to the cluster DNS: {dns}"
    );
    assert_eq!(
        dns["to"][0]["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"],
        "kube-system"
    );
    let api = &egress[1];
    assert_eq!(blocks(api), vec!["172.18.0.2/32"]);
    assert_eq!(port_set(api), BTreeSet::from([443, 6443]));
    let ssh = &egress[2];
    assert_eq!(blocks(ssh), vec!["10.20.0.0/16", "192.0.2.7/32"]);
    assert_eq!(port_set(ssh), BTreeSet::from([22]));

    // Every address only on purpose.
    let mut open: Vec<&str> = ALL_ON.to_vec();
    open.extend([
        "networkPolicy.sshCIDRs={0.0.0.0/0}",
        "networkPolicy.allowAnyDestination=true",
    ]);
    let objs = render("kpssh", "kpssh-system", &open).expect("explicitly open");
    let np = one(&objs, "NetworkPolicy");
    assert_eq!(blocks(&np["spec"]["egress"][2]), vec!["0.0.0.0/0"]);
}
