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

    /// Wait for a probe slot, then for a dial slot if `dials()` says the probe opens a new
    /// SSH connection (`!transport.pooled(target)`): the pacer spaces new connections, and a
    /// probe over a pooled one opens none. `dials` is asked once the slot is held, since a
    /// connection can be pooled or evicted while the probe waits for it.
    pub async fn probe(&self, dials: impl FnOnce() -> bool) -> OwnedSemaphorePermit {
        let permit = acquire(&self.probes).await;
        self.pace(dials).await;
        permit
    }

    /// Wait for a phase slot, then for a dial slot if `dials()` says so (as for
    /// [`Limits::probe`]).
    pub async fn phase(&self, dials: impl FnOnce() -> bool) -> OwnedSemaphorePermit {
        let permit = self.phase_slot().await;
        self.pace(dials).await;
        permit
    }

    /// Wait for a phase slot only. A launch holds one from install through join, so that a
    /// launch once started finishes before later ones start: with every slot taken, installs
    /// queued behind each other would otherwise push each join to the back of the queue.
    pub async fn phase_slot(&self) -> OwnedSemaphorePermit {
        acquire(&self.phases).await
    }

    /// Wait for a leave slot, then for a dial slot if `dials()` says so (as for
    /// [`Limits::probe`]).
    pub async fn leave(&self, dials: impl FnOnce() -> bool) -> OwnedSemaphorePermit {
        let permit = acquire(&self.leaves).await;
        self.pace(dials).await;
        permit
    }

    /// Wait for a dial slot if `dials()` says the call opens a new connection (a session under
    /// a phase slot already held).
    pub async fn pace(&self, dials: impl FnOnce() -> bool) {
        if dials() {
            self.dials.wait().await;
        }
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

    /// Only probes that open a new connection wait for the dial rate: ten probes over pooled
    /// connections all start at once at 1 dial a second, while ten that dial take 9 s. (Before
    /// the fix every probe took a dial slot: the pooled ten took 9 s too.)
    #[tokio::test(start_paused = true)]
    async fn probes_over_pooled_connections_do_not_wait_for_the_dial_rate() {
        let limits = Limits::new(&Config {
            ssh_dials_per_second: 1,
            ..Config::default()
        });
        let start = Instant::now();
        let run = |dials: bool| {
            let limits = limits.clone();
            tokio::spawn(async move {
                let _permit = limits.probe(|| dials).await;
                Instant::now()
            })
        };
        let pooled: Vec<_> = (0..10).map(|_| run(false)).collect();
        for h in pooled {
            assert_eq!(h.await.expect("task"), start, "a pooled probe is not paced");
        }
        let dialling: Vec<_> = (0..10).map(|_| run(true)).collect();
        let mut last = start;
        for h in dialling {
            last = last.max(h.await.expect("task"));
        }
        assert_eq!(
            last - start,
            Duration::from_secs(9),
            "ten dials at 1 a second"
        );
    }
}
