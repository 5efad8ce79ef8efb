//! S62 on the real control plane: a host laid out as the Go provider's docs describe Verified
//! mode (`tests/support/go_layout.rs`: login `kpsshgo` whose sshd `Match` block forces
//! `/opt/kpssh/kpssh-shim`, sudo to exactly that file, the shim configured by environment)
//! under the real `kpssh controller`: it probes Available, a pending pod's NodeClaim joins it,
//! deleting the NodeClaim makes it leave.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt as _;
use kpssh::api::{HostState, NodeClaim, SSHHost};
use kpssh::profile::verified::sshsig::allowed_signers_line;
use kube::api::{Api, DeleteParams, WatchEvent, WatchParams};

use crate::go_layout::GO_USER;
use crate::scale::check_warm_and_disabled;
use crate::testhost::ExecMode;
use crate::verified::{launch_events, profile_dir};
use crate::world::{POOL_NS, Sc, profile, sign};

/// The host's trust root, named only by the shim's environment: `/etc/kpssh/allowed_signers`
/// (the shim's default) trusts nobody, so a shim that ignored the environment refuses the join.
const POOL_SIGNERS: &str = "/etc/kpssh/pool_signers";

/// `ancestry PHASE` prints `PHASE ruid/euid:comm …` for the calling phase script and its
/// ancestors, up to the sshd session that started them.
const ANCESTRY: &str = r#"#!/bin/sh
out=$1
p=$PPID
while [ "$p" -gt 1 ]; do
  comm=$(cat "/proc/$p/comm") || break
  ids=$(awk '/^Uid:/ {print $2 "/" $3}' "/proc/$p/status")
  out="$out $ids:$comm"
  case $comm in sshd*) break ;; esac
  p=$(awk '/^PPid:/ {print $2}' "/proc/$p/status")
done
printf '%s\n' "$out"
"#;

/// Every state the SSHHost goes through (consecutive repeats folded), from a watch.
fn record_states(api: Api<SSHHost>, name: String) -> Arc<Mutex<Vec<HostState>>> {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let out = seen.clone();
    tokio::spawn(async move {
        let wp = WatchParams::default()
            .fields(&format!("metadata.name={name}"))
            .timeout(290);
        let Ok(stream) = api.watch(&wp, "0").await else {
            return;
        };
        let mut stream = stream.boxed();
        while let Some(Ok(ev)) = stream.next().await {
            let host = match ev {
                WatchEvent::Added(h) | WatchEvent::Modified(h) => h,
                _ => continue,
            };
            let mut seen = out.lock().unwrap_or_else(|e| e.into_inner());
            if seen.last() != Some(&host.state()) {
                seen.push(host.state());
            }
        }
    });
    seen
}

fn uid_of(user: &str) -> Result<String, String> {
    let out = std::process::Command::new("id")
        .args(["-u", user])
        .output()
        .map_err(|e| format!("id -u {user}: {e}"))?;
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Each phase script ran as root, and root came only from sudo: below `sudo` every process is
/// root, above it (up to the sshd session) every one is the login user.
fn check_ancestry(text: &str, login_uid: &str) -> Result<(), String> {
    let phases: Vec<&str> = text.lines().filter_map(|l| l.split(' ').next()).collect();
    if phases != ["install", "join", "leave"] {
        return Err(format!("phase scripts ran {phases:?}:\n{text}"));
    }
    let login = format!("{login_uid}/{login_uid}");
    for line in text.lines() {
        let chain: Vec<(&str, &str)> = line
            .split(' ')
            .skip(1)
            .filter_map(|e| e.split_once(':'))
            .collect();
        let Some(s) = chain.iter().position(|(_, comm)| *comm == "sudo") else {
            return Err(format!("no sudo between sshd and the script: {line}"));
        };
        let (below, above) = (&chain[..s], &chain[s + 1..]);
        if below.is_empty() || below.iter().any(|(ids, _)| *ids != "0/0") {
            return Err(format!("the script must run as root under sudo: {line}"));
        }
        if !above
            .last()
            .is_some_and(|(_, comm)| comm.starts_with("sshd"))
            || above.iter().any(|(ids, _)| *ids != login)
        {
            return Err(format!(
                "above sudo only the login user (uid {login_uid}) up to sshd: {line}"
            ));
        }
    }
    Ok(())
}

/// S62: probe, join and leave of a Go-layout host through sudo, by the real controller.
pub async fn s62(sc: &mut Sc) -> Result<(), String> {
    let signer = &sc.world.signer;
    let line = allowed_signers_line(&signer.public).map_err(|e| e.to_string())?;
    let etc = vec![
        ("pool_signers".to_string(), format!("{line}\n")),
        (
            "shim.env".to_string(),
            format!("KPSSH_ALLOWED_SIGNERS={POOL_SIGNERS}\n"),
        ),
    ];
    let h = sc
        .add_host(
            ExecMode::GoLayout { etc },
            Some(vec![signer.public.clone()]),
        )
        .await;
    let states = record_states(sc.ns_api::<SSHHost>(POOL_NS), sc.host_name(h));
    let host = &sc.hosts[h];
    if host.user != GO_USER {
        return Err(format!("the SSHHost logs in as {}", host.user));
    }
    let ancestry = host.root.join("bin/ancestry");
    std::fs::write(&ancestry, ANCESTRY).map_err(|e| e.to_string())?;
    std::fs::set_permissions(
        &ancestry,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .map_err(|e| e.to_string())?;

    let name = format!("e2e-{}", sc.id);
    let mut p = profile(&name, &sc.world.base);
    let s = &mut p.spec.scripts;
    for (phase, script) in [
        ("install", &mut s.install),
        ("join", &mut s.join),
        ("leave", &mut s.leave),
    ] {
        script.push_str(&format!(
            "\"$root/bin/ancestry\" {phase} >> \"$root/var/log/ancestry\"\n"
        ));
    }
    let signed = sign(&p, signer, &profile_dir(sc));
    sc.class_and_profile(signed).await;
    sc.nodepool("Never").await;
    sc.wait(
        "host Available (probed through sudo)",
        Duration::from_secs(60),
        || async { Ok((sc.host_state(h).await? == HostState::Available).then_some(())) },
    )
    .await?;
    sc.bare_pod().await;
    // A shim that refuses the layout fails the launch: say so at once, with its reason.
    let started = std::time::Instant::now();
    while sc.host_state(h).await? != HostState::InUse {
        let failed = launch_events(sc, "LaunchFailed").await?;
        if !failed.is_empty() {
            return Err(format!("the shim refused the launch: {failed:?}"));
        }
        if started.elapsed() > Duration::from_secs(90) {
            return Err("the host did not join within 90s".into());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let node = sc.up_after_pending(h).await?;
    sc.api::<NodeClaim>()
        .delete(&node, &DeleteParams::default())
        .await
        .map_err(|e| format!("delete NodeClaim {node}: {e}"))?;
    sc.consolidated(h, &node).await?;
    check_warm_and_disabled(sc, h)?;

    let host = &sc.hosts[h];
    let phases = host.read("var/log/phases");
    if phases != format!("install\njoin {node}\nleave\nleft\n") {
        return Err(format!("the shim ran these phases: {phases:?}"));
    }
    // The root shim's rollback record under the default state dir: v2 envelopes ran there.
    if host
        .read(&format!("go/var-lib-kpssh/shim/{name}.hwm"))
        .is_empty()
    {
        return Err("no v2 rollback record in /var/lib/kpssh/shim".into());
    }
    let ancestry = host.read("var/log/ancestry");
    check_ancestry(&ancestry, &uid_of(GO_USER)?)?;
    println!(
        "[{}] phase scripts (ruid/euid:comm up to sshd):\n{ancestry}",
        sc.id
    );
    let log = host.read("var/log/sshd.log");
    let logins: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("Accepted publickey for"))
        .collect();
    if logins.is_empty()
        || logins
            .iter()
            .any(|l| !l.contains(&format!("for {GO_USER} from")))
    {
        return Err(format!("sshd logins other than {GO_USER}: {logins:?}"));
    }
    let seen = states.lock().unwrap_or_else(|e| e.into_inner()).clone();
    // Leave runs while the host is InUse (Leaving is the zombie guard's state).
    let want = [
        HostState::Pending,
        HostState::Available,
        HostState::Claimed,
        HostState::InUse,
        HostState::Available,
    ];
    if seen != want {
        return Err(format!("host states {seen:?}, want {want:?}"));
    }
    Ok(())
}
