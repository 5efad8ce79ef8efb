//! A host actor's mailbox: a queue with one reader (the actor's task) and any number of
//! senders (the supervisor, the router through it, the probe clock, the actor's own timers).
//!
//! Why not a ractor actor per host, as the other actors are: a fleet runs one host actor per
//! host, and at 10,000 hosts ractor's machinery was an eighth of the simulated fleet day's CPU
//! (each message's handler future boxed, copied and wrapped in `catch_unwind`, a four-port
//! `select!` per message) and about 12 KiB per host (two supervision channels, the message
//! port's first block, the signal and stop ports, the task cell). A host actor needs none of
//! what that buys (remote actors, registries, supervision trees): one queue, a graceful stop
//! that lets the message in hand finish, and its failure reported to the supervisor, which
//! [`super::spawn`] does with one `catch_unwind` around the actor's whole life.
//!
//! The queue is an empty `VecDeque` until a message waits (no per-host block allocated up
//! front, as a channel's is); `Notify` keeps a wake-up for a message sent while the actor was
//! busy, so nothing is missed between looking at the queue and waiting.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::Notify;

use super::HostMsg;

/// The sending side: cheap to clone, held by whoever may message the host.
#[derive(Clone)]
pub struct HostRef(Arc<Mailbox>);

/// The receiving side, owned by the actor's task; dropping it (the actor ended, stopped,
/// was killed or panicked) closes the mailbox, and later sends fail.
pub struct Inbox(Arc<Mailbox>);

struct Mailbox {
    inner: Mutex<Queue>,
    wake: Notify,
}

#[derive(Default)]
struct Queue {
    messages: VecDeque<HostMsg>,
    /// No reader any more: sends are refused.
    closed: bool,
    /// Asked to stop: the reader takes no further message.
    stopping: bool,
}

impl std::fmt::Debug for HostRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HostRef")
    }
}

/// A new mailbox: its sender and its reader.
pub fn mailbox() -> (HostRef, Inbox) {
    let shared = Arc::new(Mailbox {
        inner: Mutex::new(Queue::default()),
        wake: Notify::new(),
    });
    (HostRef(shared.clone()), Inbox(shared))
}

impl Mailbox {
    // A panic while holding the lock cannot leave the queue half-changed (every critical
    // section is one push, pop or flag), so a poisoned lock is still a sound queue.
    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl HostRef {
    /// Queue `msg` for the actor; handed back when the actor is gone.
    pub fn send_message(&self, msg: HostMsg) -> Result<(), HostMsg> {
        {
            let mut queue = self.0.lock();
            if queue.closed {
                return Err(msg);
            }
            queue.messages.push_back(msg);
        }
        self.0.wake.notify_one();
        Ok(())
    }

    /// Stop after the message in hand (a phase in flight completes); messages still queued
    /// are dropped, as a stopped actor's are.
    pub fn stop(&self) {
        self.0.lock().stopping = true;
        self.0.wake.notify_one();
    }

    /// Whether the actor's task has ended.
    #[cfg(test)]
    fn is_closed(&self) -> bool {
        self.0.lock().closed
    }
}

impl Inbox {
    /// The next message, waiting for one; `None` once a stop was asked for.
    pub async fn next(&self) -> Option<HostMsg> {
        loop {
            {
                let mut queue = self.0.lock();
                if queue.stopping {
                    return None;
                }
                if let Some(msg) = queue.messages.pop_front() {
                    return Some(msg);
                }
            }
            self.0.wake.notified().await;
        }
    }
}

impl Drop for Inbox {
    fn drop(&mut self) {
        let dropped = {
            let mut queue = self.0.lock();
            queue.closed = true;
            std::mem::take(&mut queue.messages)
        };
        // Outside the lock: a message may hold the last reference to something large.
        drop(dropped);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn messages_arrive_in_order_and_a_send_while_busy_is_not_lost() {
        let (tx, rx) = mailbox();
        tx.send_message(HostMsg::Probe).expect("open");
        tx.send_message(HostMsg::ProbeDue(7)).expect("open");
        assert!(matches!(rx.next().await, Some(HostMsg::Probe)));
        assert!(matches!(rx.next().await, Some(HostMsg::ProbeDue(7))));
        // A message sent while the reader is not waiting (busy) wakes its next wait.
        let reader = tokio::spawn(async move {
            let msg = rx.next().await;
            (msg, rx)
        });
        tokio::task::yield_now().await;
        tx.send_message(HostMsg::BackoffDue).expect("open");
        let (msg, _rx) = reader.await.expect("reader");
        assert!(matches!(msg, Some(HostMsg::BackoffDue)));
    }

    #[tokio::test]
    async fn stop_ends_the_reader_and_a_dropped_reader_refuses_sends() {
        let (tx, rx) = mailbox();
        tx.send_message(HostMsg::Probe).expect("open");
        tx.stop();
        assert!(rx.next().await.is_none(), "stop wins over queued messages");
        assert!(!tx.is_closed());
        drop(rx);
        assert!(tx.is_closed());
        assert!(
            matches!(tx.send_message(HostMsg::Probe), Err(HostMsg::Probe)),
            "the message comes back"
        );
    }
}
