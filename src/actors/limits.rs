//! Fleet-wide limits shared by every host actor: concurrent probes, concurrent phases and SSH
//! dials per second. All run on tokio's clock so that the simulation stays deterministic under
//! a paused clock.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Mutex, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use super::Config;

#[derive(Clone)]
pub struct Limits {
    probes: Arc<Semaphore>,
    phases: Arc<Semaphore>,
    dials: Arc<DialPacer>,
}

impl Limits {
    pub fn new(config: &Config) -> Self {
        Limits {
            probes: Arc::new(Semaphore::new(config.max_concurrent_probes.max(1))),
            phases: Arc::new(Semaphore::new(config.max_concurrent_phases.max(1))),
            dials: Arc::new(DialPacer::new(config.ssh_dials_per_second)),
        }
    }

    /// Wait for a probe slot and a dial slot.
    pub async fn probe(&self) -> OwnedSemaphorePermit {
        let permit = acquire(&self.probes).await;
        self.dials.wait().await;
        permit
    }

    /// Wait for a phase slot and a dial slot.
    pub async fn phase(&self) -> OwnedSemaphorePermit {
        let permit = acquire(&self.phases).await;
        self.dials.wait().await;
        permit
    }
}

async fn acquire(sem: &Arc<Semaphore>) -> OwnedSemaphorePermit {
    loop {
        // The semaphores are never closed; the loop only guards against that impossibility
        // without a panic path.
        if let Ok(p) = sem.clone().acquire_owned().await {
            return p;
        }
        tokio::task::yield_now().await;
    }
}

/// Spaces dials evenly at `rate` per second (a GCRA with burst 1): each caller reserves the
/// next free slot and sleeps until it.
pub struct DialPacer {
    spacing: Duration,
    next: Mutex<Option<Instant>>,
}

impl DialPacer {
    pub fn new(per_second: u32) -> Self {
        DialPacer {
            spacing: Duration::from_secs(1) / per_second.max(1),
            next: Mutex::new(None),
        }
    }

    pub async fn wait(&self) {
        let slot = {
            let mut next = self.next.lock().await;
            let now = Instant::now();
            let slot = next.map_or(now, |n| n.max(now));
            *next = Some(slot + self.spacing);
            slot
        };
        tokio::time::sleep_until(slot).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn dials_are_spaced_at_the_configured_rate() {
        let pacer = Arc::new(DialPacer::new(10));
        let start = Instant::now();
        let mut handles = vec![];
        for _ in 0..20 {
            let p = pacer.clone();
            handles.push(tokio::spawn(async move {
                p.wait().await;
                Instant::now()
            }));
        }
        let mut last = start;
        for h in handles {
            last = last.max(h.await.expect("task"));
        }
        // 20 dials at 10/s: the last one goes at 1.9s.
        assert_eq!(last - start, Duration::from_millis(1900));
    }
}
