//! `SimTransport`: the `Transport` port over simulated hosts, keyed by address. Host keys are
//! checked against the pin like the real transport does, before any session is counted.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;

use super::host::{ExecRecord, SimHost, SimPhase, parse_exports};
use super::kubelet::node_from_env;
use crate::k8s::{Cluster, MemoryCluster};
use crate::ssh::probe::parse_probe_output;
use crate::ssh::{
    CommandOutput, HostKeyPin, HostTarget, ProbeReport, RemoteCommand, Transport, TransportError,
};

#[derive(Clone)]
pub struct SimTransport {
    hosts: Arc<Mutex<BTreeMap<String, SimHost>>>,
    cluster: MemoryCluster,
    /// Delay between a successful join and the Node registering.
    pub registration_delay: Duration,
}

impl SimTransport {
    pub fn new(cluster: MemoryCluster) -> Self {
        SimTransport {
            hosts: Arc::new(Mutex::new(BTreeMap::new())),
            cluster,
            registration_delay: Duration::from_secs(5),
        }
    }

    pub fn add(&self, host: SimHost) {
        self.lock().insert(host.address.clone(), host);
    }

    /// Read or change a host.
    pub fn with<R>(&self, address: &str, f: impl FnOnce(&mut SimHost) -> R) -> Option<R> {
        self.lock().get_mut(address).map(f)
    }

    pub fn host(&self, address: &str) -> Option<SimHost> {
        self.lock().get(address).cloned()
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<String, SimHost>> {
        self.hosts.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Connect: reachability and the host-key pin (S3: a mismatch opens no session).
    fn connect(&self, target: &HostTarget) -> Result<SimHost, TransportError> {
        let mut hosts = self.lock();
        let host = hosts
            .get_mut(&target.address)
            .ok_or_else(|| TransportError::DialRefused {
                host: target.host.clone(),
                address: target.address.clone(),
            })?;
        if !host.reachable {
            return Err(TransportError::DialRefused {
                host: target.host.clone(),
                address: target.address.clone(),
            });
        }
        let expected = match &target.pin {
            HostKeyPin::Fingerprint(f) => Some(f.clone()),
            HostKeyPin::KnownHost(k) if k.starts_with("SHA256:") => Some(k.clone()),
            _ => None,
        };
        if let Some(e) = expected.filter(|e| *e != host.fingerprint) {
            return Err(TransportError::HostKeyMismatch {
                host: target.host.clone(),
                expected: e,
                actual: host.fingerprint.clone(),
            });
        }
        host.sessions += 1;
        Ok(host.clone())
    }
}

impl Transport for SimTransport {
    async fn probe(
        &self,
        target: &HostTarget,
        _verified_shim: Option<&str>,
    ) -> Result<ProbeReport, TransportError> {
        let host = self.connect(target)?;
        let facts = parse_probe_output(host.probe_stdout().as_bytes()).map_err(|source| {
            TransportError::Probe {
                host: target.host.clone(),
                source,
            }
        })?;
        Ok(ProbeReport {
            facts,
            fingerprint: host.fingerprint,
        })
    }

    async fn exec(
        &self,
        target: &HostTarget,
        cmd: RemoteCommand,
    ) -> Result<CommandOutput, TransportError> {
        let host = self.connect(target)?;
        let stdin = String::from_utf8_lossy(&cmd.stdin).into_owned();
        let phase = SimPhase::detect(&stdin);
        let env = parse_exports(&stdin);
        if phase.is_some_and(|p| host.hang.contains(&p)) {
            tokio::time::sleep(cmd.timeout).await;
            return Err(TransportError::CommandTimeout {
                host: target.host.clone(),
                after: cmd.timeout,
            });
        }
        tokio::time::sleep(host.phase_latency.min(cmd.timeout)).await;
        let exit = self
            .with(&target.address, |h| {
                h.log.push(ExecRecord {
                    phase,
                    command: cmd.command.clone(),
                    env: env.clone(),
                });
                let exit = phase.and_then(|p| h.fail_next.remove(&p)).unwrap_or(0);
                if exit == 0 {
                    match phase {
                        Some(SimPhase::Join) => {
                            h.kubelet_active = true;
                            h.kubelet_enabled = true;
                        }
                        Some(SimPhase::Leave) => {
                            h.kubelet_active = false;
                            h.kubelet_enabled = false;
                        }
                        _ => {}
                    }
                }
                exit
            })
            .unwrap_or(255);
        if exit == 0 && phase == Some(SimPhase::Join) {
            self.register_later(&target.address, env);
        }
        Ok(CommandOutput {
            exit_status: exit,
            stderr: if exit == 0 {
                vec![]
            } else {
                format!("{phase:?} failed").into_bytes()
            },
            ..Default::default()
        })
    }

    async fn forget(&self, _host: &str) {}
}

impl SimTransport {
    /// The kubelet registers its Node a little after join returns, if it is still running.
    fn register_later(&self, address: &str, env: BTreeMap<String, String>) {
        let this = self.clone();
        let address = address.to_string();
        tokio::spawn(async move {
            tokio::time::sleep(this.registration_delay).await;
            let running = this
                .with(&address, |h| h.kubelet_active && h.registers)
                .unwrap_or(false);
            if !running {
                return;
            }
            let node: Node = node_from_env(&env, &format!("sim://adopted/{address}"));
            let _ = this.cluster.create(&node).await;
        });
    }
}
