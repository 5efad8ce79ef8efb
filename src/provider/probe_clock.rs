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
use std::collections::{BinaryHeap, VecDeque};
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
/// probes due at the same instant go out in a replayable order).
///
/// Two parts, because almost every probe is scheduled one interval after now: those come in
/// time order and wait in a queue (`in_order`, first in first out); the others (a retry's
/// backoff, a recheck in a second) go to a heap. The earliest is the earlier of the two
/// fronts. A fleet day schedules millions: a heap alone paid a sift through a cold array of
/// every host's entry on each push and pop.
#[derive(Default)]
struct Queue {
    in_order: VecDeque<Queued>,
    others: BinaryHeap<Reverse<Queued>>,
    seq: u64,
}

impl Queue {
    fn push(&mut self, due: Due) {
        self.seq += 1;
        let q = Queued {
            at: due.at,
            seq: self.seq,
            to: due.to,
            ticket: due.ticket,
        };
        // `seq` only grows, so an entry not earlier than the last in the queue keeps it in
        // `(at, seq)` order.
        if self.in_order.back().is_none_or(|last| last.at <= q.at) {
            self.in_order.push_back(q);
        } else {
            self.others.push(Reverse(q));
        }
    }

    /// When the earliest is due.
    fn next_at(&self) -> Option<Instant> {
        self.front().map(|q| q.at)
    }

    fn front(&self) -> Option<&Queued> {
        if self.heap_first() {
            self.others.peek().map(|r| &r.0)
        } else {
            self.in_order.front()
        }
    }

    /// Whether the earliest entry is the heap's.
    fn heap_first(&self) -> bool {
        match (self.in_order.front(), self.others.peek()) {
            (Some(a), Some(Reverse(b))) => b < a,
            (a, b) => a.is_none() && b.is_some(),
        }
    }

    /// The earliest, if it is due at `now`.
    fn pop_due(&mut self, now: Instant) -> Option<Queued> {
        // Which front is earliest is judged once: this runs for every probe delivered.
        if self.heap_first() {
            self.others
                .peek()
                .is_some_and(|r| r.0.at <= now)
                .then(|| self.others.pop().map(|r| r.0))?
        } else {
            self.in_order
                .front()
                .is_some_and(|q| q.at <= now)
                .then(|| self.in_order.pop_front())?
        }
    }
}

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
    let mut queue = Queue::default();
    let sleep = tokio::time::sleep_until(Instant::now());
    tokio::pin!(sleep);
    loop {
        let next = queue.next_at();
        if let Some(at) = next
            && sleep.deadline() != at
        {
            sleep.as_mut().reset(at);
        }
        tokio::select! {
            biased;
            cmd = rx.recv() => {
                let Some(Command::Schedule(due)) = cmd else { return };
                queue.push(due);
                while let Ok(cmd) = rx.try_recv() {
                    let Command::Schedule(due) = cmd else { return };
                    queue.push(due);
                }
            }
            () = &mut sleep, if next.is_some() => {
                let now = Instant::now();
                while let Some(Queued { to, ticket, .. }) = queue.pop_due(now) {
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

    /// The two-part queue gives probes out exactly as one ordered list would: by time, then
    /// in the order scheduled, however in-order and out-of-order schedules interleave, and
    /// none before it is due.
    #[test]
    fn the_queue_keeps_time_then_schedule_order() {
        use rand::{Rng, SeedableRng};
        struct Nobody;
        impl ProbeTarget for Nobody {
            fn probe_due(&self, _: u64) -> bool {
                true
            }
        }
        let origin = Instant::now();
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        for _ in 0..50 {
            let mut queue = super::Queue::default();
            let mut expected = vec![];
            let mut now = 0u64;
            let mut got = vec![];
            for ticket in 0..300u64 {
                // Mostly "an interval from now" (in order), sometimes sooner (a retry) or
                // at the same instant as others.
                let after = match rng.random_range(0..10) {
                    0 => rng.random_range(0..5),
                    1 => 0,
                    _ => 300,
                };
                let at = now + after;
                queue.push(super::Due {
                    at: origin + Duration::from_secs(at),
                    to: Box::new(Nobody),
                    ticket,
                });
                expected.push((at, ticket));
                if rng.random_bool(0.3) {
                    now += rng.random_range(0..4);
                    while let Some(q) = queue.pop_due(origin + Duration::from_secs(now)) {
                        assert!(q.at <= origin + Duration::from_secs(now), "given out early");
                        got.push(((q.at - origin).as_secs(), q.ticket));
                    }
                }
            }
            while let Some(q) = queue.pop_due(origin + Duration::from_secs(u64::MAX / 4)) {
                got.push(((q.at - origin).as_secs(), q.ticket));
            }
            // A probe scheduled later is due no earlier than the time already given out, so
            // the whole sequence is the one ordered list (tickets grow with the schedule).
            expected.sort();
            assert_eq!(got, expected);
        }
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
