//! Batching: a window opens with the first new pending pod and closes when no new pod arrived
//! for `batch_idle`, or after `batch_max` in total.

use std::time::Duration;

use tokio::time::Instant;

use crate::karpenter::KarpenterConfig;
use crate::karpenter::state::ClusterState;

pub async fn wait(state: &ClusterState, cfg: &KarpenterConfig, poll: Duration) {
    let start = Instant::now();
    let mut last_change = start;
    let mut seq = state.pending_seq();
    loop {
        if last_change.elapsed() >= cfg.batch_idle || start.elapsed() >= cfg.batch_max {
            return;
        }
        tokio::time::sleep(poll).await;
        let now_seq = state.pending_seq();
        if now_seq != seq {
            seq = now_seq;
            last_change = Instant::now();
        }
    }
}
