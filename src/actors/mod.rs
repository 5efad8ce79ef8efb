//! The actor core (DESIGN §2): a [`supervisor::Supervisor`] keeps one host actor ([`host::spawn`]) per
//! SSHHost; the [`router::Router`] turns NodeClaims into claims and `Launch`/`Release` messages.
//! A host's status is only ever written by its own actor, except the claim itself, which the
//! router writes as a compare-and-swap that the actor's own writes are fenced against.

pub mod host;
pub mod nodeclass;
pub mod router;
mod shard;
pub mod status;
pub mod supervisor;

use ractor::{Actor, ActorRef, SpawnErr};

use crate::k8s::Cluster;
use crate::provider::Context;
use crate::ssh::Transport;

/// The controller's long-lived actors.
pub struct Controller {
    pub supervisor: ActorRef<supervisor::SupervisorMsg>,
    pub router: ActorRef<router::RouterMsg>,
    pub nodeclasses: ActorRef<nodeclass::NodeClassMsg>,
}

impl Controller {
    /// Stop taking work: the router first (no new claims), then the host actors finish the
    /// message in hand (a phase in flight completes) within `grace`.
    pub async fn shutdown(self, grace: std::time::Duration) {
        let _ = self.router.stop_and_wait(None, Some(grace)).await;
        let _ = self.nodeclasses.stop_and_wait(None, Some(grace)).await;
        let hosts = self
            .supervisor
            .call(supervisor::SupervisorMsg::StopHosts, Some(grace))
            .await;
        if let Ok(ractor::rpc::CallResult::Success(tasks)) = hosts {
            let _ = tokio::time::timeout(grace, futures::future::join_all(tasks)).await;
        }
        let _ = self.supervisor.stop_and_wait(None, Some(grace)).await;
    }
}

/// Start the supervisor, the router and the node class controller, as `kpssh controller` and
/// the simulation do.
pub async fn spawn_controller<C: Cluster, T: Transport>(
    ctx: &Context<C, T>,
) -> Result<Controller, SpawnErr> {
    let (supervisor, _) =
        Actor::spawn(None, supervisor::Supervisor::default(), ctx.clone()).await?;
    let (router, _) = Actor::spawn(
        None,
        router::Router::default(),
        (ctx.clone(), supervisor.clone()),
    )
    .await?;
    let (nodeclasses, _) =
        Actor::spawn(None, nodeclass::NodeClassController::default(), ctx.clone()).await?;
    Ok(Controller {
        supervisor,
        router,
        nodeclasses,
    })
}
