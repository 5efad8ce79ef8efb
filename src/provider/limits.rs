//! Fleet-wide limits shared by every host actor: concurrent probes, concurrent phases and SSH
//! dials per second. All run on tokio's clock so that the simulation stays deterministic under
//! a paused clock.

use std::num::NonZeroU32;
use std::sync::Arc;

use governor::middleware::NoOpMiddleware;
use governor::nanos::Nanos;
use governor::state::{InMemoryState, NotKeyed};
use governor::{Quota, RateLimiter};

use tokio::sync::{Mutex, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use super::Config;

#[derive(Clone)]
pub struct Limits {
    probes: Arc<Semaphore>,
    phases: Arc<Semaphore>,
    /// Leaves have slots of their own: a release or a zombie's leave must not queue behind a
    /// burst of launches (a zombie must be gone within two probe intervals, S9).
    leaves: Arc<Semaphore>,
    dials: Arc<DialPacer>,
}

impl Limits {
    pub fn new(config: &Config) -> Self {
        Limits {
            probes: Arc::new(Semaphore::new(config.max_concurrent_probes.max(1))),
            phases: Arc::new(Semaphore::new(config.max_concurrent_phases.max(1))),
            leaves: Arc::new(Semaphore::new(config.max_concurrent_phases.max(1))),
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
        let permit = self.phase_slot().await;
        self.dials.wait().await;
        permit
    }

    /// Wait for a phase slot only. A launch holds one from install through join, so that a
    /// launch once started finishes before later ones start: with every slot taken, installs
    /// queued behind each other would otherwise push each join to the back of the queue.
    pub async fn phase_slot(&self) -> OwnedSemaphorePermit {
        acquire(&self.phases).await
    }

    /// Wait for a leave slot and a dial slot.
    pub async fn leave(&self) -> OwnedSemaphorePermit {
        let permit = acquire(&self.leaves).await;
        self.dials.wait().await;
        permit
    }

    /// Wait for a dial slot only (a session under a phase slot already held).
    pub async fn dial(&self) {
        self.dials.wait().await;
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

/// Spaces dials evenly at `rate` per second: a `governor` GCRA with burst 1, read on tokio's
/// clock (so a paused clock in the simulation paces dials deterministically). Waiters queue on
/// a fair lock and only the head polls the limiter, so a slot wakes one task, not every waiter.
pub struct DialPacer {
    limiter: RateLimiter<NotKeyed, InMemoryState, TokioClock, NoOpMiddleware<Nanos>>,
    clock: TokioClock,
    queue: Mutex<()>,
}

/// governor's clock on tokio time: nanoseconds since the pacer was made.
#[derive(Clone)]
struct TokioClock {
    origin: Instant,
}

impl governor::clock::Clock for TokioClock {
    type Instant = Nanos;

    fn now(&self) -> Nanos {
        let elapsed = self.origin.elapsed().as_nanos();
        Nanos::new(u64::try_from(elapsed).unwrap_or(u64::MAX))
    }
}

impl DialPacer {
    pub fn new(per_second: u32) -> Self {
        let rate = NonZeroU32::new(per_second).unwrap_or(NonZeroU32::MIN);
        let quota = Quota::per_second(rate).allow_burst(NonZeroU32::MIN);
        let clock = TokioClock {
            origin: Instant::now(),
        };
        DialPacer {
            limiter: RateLimiter::direct_with_clock(quota, clock.clone()),
            clock,
            queue: Mutex::new(()),
        }
    }

    pub async fn wait(&self) {
        let _turn = self.queue.lock().await;
        while let Err(not_until) = self.limiter.check() {
            let from = governor::clock::Clock::now(&self.clock);
            tokio::time::sleep(not_until.wait_time_from(from)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

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
