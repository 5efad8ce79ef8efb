//! One timer for every host's next probe.
//!
//! Each host actor used to spawn a task that slept until its next probe and then sent it:
//! at 10,000 hosts probed every five minutes that is 33 tasks a second created, timed and
//! torn down to deliver one message each. The clock keeps every due probe in one ordered
//! queue and a single task delivers them.
//!
//! Nothing is ever cancelled: a probe that runs early (a spec change, the router's nudge)
//! schedules the next one with a new ticket, and the entry it replaced arrives carrying a
//! ticket the actor no longer holds, which it ignores.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::{Arc, OnceLock};

use tokio::sync::mpsc;
use tokio::time::Instant;

use super::metrics::SharedMetrics;

/// Who a due probe goes to: the host actor (`crate::actors::host`), which takes it as a
/// `ProbeDue(ticket)` message. Returns whether it was delivered.
pub trait ProbeTarget: Send + 'static {
    fn probe_due(&self, ticket: u64) -> bool;
}

/// One scheduled probe: `ticket` to `to` at `at`.
struct Due {
    at: Instant,
    to: Box<dyn ProbeTarget>,
    ticket: u64,
}

/// The handle host actors schedule through; its task starts with the first schedule (so
/// that a context can be built outside a runtime) and ends when every handle is gone.
#[derive(Clone, Default)]
pub struct ProbeClock {
    tx: Arc<OnceLock<mpsc::UnboundedSender<Command>>>,
}

enum Command {
    Schedule(Due),
    /// Drop every scheduled probe and end the task.
    Stop,
}

impl ProbeClock {
    /// Deliver `ticket` to `to` at `at`.
    pub fn schedule(
        &self,
        at: Instant,
        to: Box<dyn ProbeTarget>,
        ticket: u64,
        metrics: &SharedMetrics,
    ) {
        let tx = self.tx.get_or_init(|| {
            let (tx, rx) = mpsc::unbounded_channel();
            tokio::spawn(deliver(rx, metrics.clone()));
            tx
        });
        // The task only stops once every sender is dropped, and this is one.
        let _ = tx.send(Command::Schedule(Due { at, to, ticket }));
    }

    /// End the clock now: the probes it holds are dropped with their targets, and later
    /// schedules go nowhere. For a controller torn down in a process that goes on (the
    /// simulation's crash), whose clock would otherwise hold every host actor of the dead
    /// controller until its last scheduled probe came due.
    pub fn stop(&self) {
        if let Some(tx) = self.tx.get() {
            let _ = tx.send(Command::Stop);
        }
    }
}

/// Due probes, earliest first: by time, then by the order they were scheduled in (so that
/// probes due at the same instant go out in a replayable order). A heap rather than an
/// ordered map: only the earliest is ever looked at, and a fleet day pushes and pops
/// millions.
type Queue = BinaryHeap<Reverse<Queued>>;

/// One entry of the queue, ordered by `(at, seq)` alone (`seq` is unique).
struct Queued {
    at: Instant,
    seq: u64,
    to: Box<dyn ProbeTarget>,
    ticket: u64,
}

impl PartialEq for Queued {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}

impl Eq for Queued {}

impl PartialOrd for Queued {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Queued {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.at, self.seq).cmp(&(other.at, other.seq))
    }
}

async fn deliver(mut rx: mpsc::UnboundedReceiver<Command>, metrics: SharedMetrics) {
    let mut queue = Queue::new();
    let mut seq = 0u64;
    let mut push = |queue: &mut Queue, due: Due| {
        seq += 1;
        queue.push(Reverse(Queued {
            at: due.at,
            seq,
            to: due.to,
            ticket: due.ticket,
        }));
    };
    let sleep = tokio::time::sleep_until(Instant::now());
    tokio::pin!(sleep);
    loop {
        let next = queue.peek().map(|q| q.0.at);
        if let Some(at) = next
            && sleep.deadline() != at
        {
            sleep.as_mut().reset(at);
        }
        tokio::select! {
            biased;
            cmd = rx.recv() => {
                let Some(Command::Schedule(due)) = cmd else { return };
                push(&mut queue, due);
                while let Ok(cmd) = rx.try_recv() {
                    let Command::Schedule(due) = cmd else { return };
                    push(&mut queue, due);
                }
            }
            () = &mut sleep, if next.is_some() => {
                let now = Instant::now();
                while let Some(Reverse(first)) = queue.peek() {
                    if first.at > now {
                        break;
                    }
                    let Some(Reverse(Queued { to, ticket, .. })) = queue.pop() else {
                        break;
                    };
                    if to.probe_due(ticket) {
                        metrics.mailbox_in("host");
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::sync::mpsc;
    use tokio::time::Instant;

    use super::{ProbeClock, ProbeTarget};

    /// Stands in for a host actor: reports each due probe with the virtual time it came.
    #[derive(Clone)]
    struct Recorder(mpsc::UnboundedSender<(u64, Duration)>, Instant);

    impl ProbeTarget for Recorder {
        fn probe_due(&self, ticket: u64) -> bool {
            self.0.send((ticket, self.1.elapsed())).is_ok()
        }
    }

    /// Probes arrive at their time, in time order, and those due together in the order they
    /// were scheduled, whatever order they were scheduled in.
    #[tokio::test(start_paused = true)]
    async fn delivers_each_probe_at_its_time_in_order() {
        let origin = Instant::now();
        let (tx, mut rx) = mpsc::unbounded_channel();
        let a = Recorder(tx.clone(), origin);
        let b = Recorder(tx, origin);
        let clock = ProbeClock::default();
        let metrics = std::sync::Arc::new(crate::provider::metrics::Metrics::new());
        let secs = Duration::from_secs;
        clock.schedule(origin + secs(300), Box::new(a.clone()), 1, &metrics);
        clock.schedule(origin + secs(60), Box::new(b.clone()), 7, &metrics);
        clock.schedule(origin + secs(300), Box::new(b.clone()), 8, &metrics);
        clock.schedule(origin + secs(5), Box::new(a.clone()), 2, &metrics);
        let mut got = vec![];
        for _ in 0..4 {
            got.push(rx.recv().await.expect("a probe"));
        }
        assert_eq!(
            got,
            [(2, secs(5)), (7, secs(60)), (1, secs(300)), (8, secs(300))]
        );
        // One scheduled after the clock went idle still wakes it.
        clock.schedule(Instant::now() + secs(30), Box::new(a), 3, &metrics);
        assert_eq!(rx.recv().await, Some((3, secs(330))));
    }

    /// A stopped clock lets go of the targets it held (the dead controller's host actors)
    /// at once and delivers nothing more.
    #[tokio::test(start_paused = true)]
    async fn a_stopped_clock_drops_what_it_holds() {
        let origin = Instant::now();
        let (tx, mut rx) = mpsc::unbounded_channel();
        let held = Recorder(tx, origin);
        let clock = ProbeClock::default();
        let metrics = std::sync::Arc::new(crate::provider::metrics::Metrics::new());
        clock.schedule(
            origin + Duration::from_secs(300),
            Box::new(held),
            1,
            &metrics,
        );
        tokio::task::yield_now().await;
        clock.stop();
        // The only other sender was the one in the scheduled target: once the clock drops
        // it, the channel closes, long before the probe would have been due.
        let closed = tokio::time::timeout(Duration::from_secs(1), rx.recv()).await;
        assert_eq!(closed, Ok(None), "the clock still holds its target");
    }
}
