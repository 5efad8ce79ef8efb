//! `kpssh crds --karpenter` against upstream: the `karpenter.sh/v1` NodePool and NodeClaim CRDs
//! of the `sigs.k8s.io/karpenter` module, fetched at test time through the Go module proxy
//! (`go mod download`, into the Go module cache), at the version the reference oracle pins
//! (`tests/oracle/go.mod`), which must be the one kpssh embeds.

use std::path::PathBuf;
use std::process::Command;

use kpssh::api::crds::KARPENTER_VERSION;
use serde_json::Value;

const MODULE: &str = "sigs.k8s.io/karpenter";
const FILES: [&str; 2] = [
    "karpenter.sh_nodepools.yaml",
    "karpenter.sh_nodeclaims.yaml",
];

/// The version of `sigs.k8s.io/karpenter` that `tests/oracle/go.mod` requires.
fn pinned_version() -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/oracle/go.mod");
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    text.lines()
        .map(str::split_whitespace)
        .find_map(|mut w| match (w.next(), w.next()) {
            (Some(MODULE), Some(v)) => Some(v.to_string()),
            (Some("require"), Some(MODULE)) => w.next().map(str::to_string),
            _ => None,
        })
        .unwrap_or_else(|| panic!("{path} does not require {MODULE}"))
}

/// The module's directory in the Go module cache, downloaded through the module proxy
/// (`GOPROXY`) when it is not there yet.
fn module_dir(version: &str) -> PathBuf {
    let out = Command::new("timeout")
        .args(["600", "go", "mod", "download", "-json"])
        .arg(format!("{MODULE}@{version}"))
        .env("GOTOOLCHAIN", "local")
        .env("GOFLAGS", "-mod=mod")
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/oracle"))
        .output()
        .unwrap_or_else(|e| panic!("go mod download (is Go installed? docs/development.md): {e}"));
    let info: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "go mod download {MODULE}@{version}: {e}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    assert!(
        out.status.success() && info.get("Error").is_none(),
        "go mod download {MODULE}@{version}: {info}"
    );
    PathBuf::from(info["Dir"].as_str().expect("Dir in go mod download -json"))
}

#[test]
fn karpenter_crds_equal_the_upstream_modules_files() {
    let version = pinned_version();
    assert_eq!(
        version, KARPENTER_VERSION,
        "tests/oracle/go.mod pins {MODULE} {version}, kpssh embeds the CRDs of {KARPENTER_VERSION}: \
         move both (src/api/upstream/README.md)"
    );
    let dir = module_dir(&version).join("pkg/apis/crds");
    let upstream: Vec<String> = FILES
        .iter()
        .map(|f| {
            let p = dir.join(f);
            std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        })
        .collect();
    let printed = Command::new(env!("CARGO_BIN_EXE_kpssh"))
        .args(["crds", "--karpenter"])
        .output()
        .expect("kpssh crds --karpenter");
    assert!(printed.status.success());
    let printed = String::from_utf8(printed.stdout).expect("utf-8");
    // Byte for byte: the two files, in order.
    assert!(
        printed == upstream.concat(),
        "`kpssh crds --karpenter` differs from {} of {MODULE}@{version}: copy them again \
         (src/api/upstream/README.md)",
        dir.display()
    );
    // And as objects: the same two CRDs, every field (schema, validation rules, defaults).
    let docs = |text: &str| -> Vec<Value> {
        serde_yaml::Deserializer::from_str(text)
            .map(|d| serde::Deserialize::deserialize(d).expect("yaml document"))
            .filter(|v: &Value| !v.is_null())
            .collect()
    };
    let ours = docs(&printed);
    let theirs: Vec<Value> = upstream.iter().flat_map(|t| docs(t)).collect();
    assert_eq!(ours.len(), 2);
    assert_eq!(ours, theirs);
    for (doc, name) in ours
        .iter()
        .zip(["nodepools.karpenter.sh", "nodeclaims.karpenter.sh"])
    {
        assert_eq!(doc["metadata"]["name"], name);
    }
}
