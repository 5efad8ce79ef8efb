//! Injected time. Production reads the system clock; the simulation derives wall time from
//! tokio's (paused) clock so that timestamps written to the API replay exactly for a seed.

use std::time::Duration;

use jiff::Timestamp;
use tokio::time::Instant;

#[derive(Clone, Debug)]
pub struct Clock {
    simulated: Option<(Timestamp, Instant)>,
}

impl Clock {
    /// The system clock.
    pub fn system() -> Self {
        Clock { simulated: None }
    }

    /// Wall time that starts at `start` and advances with tokio's clock (pause it for tests).
    pub fn simulated(start: Timestamp) -> Self {
        Clock {
            simulated: Some((start, Instant::now())),
        }
    }

    pub fn now(&self) -> Timestamp {
        match self.simulated {
            None => Timestamp::now(),
            Some((origin, at)) => {
                let elapsed = Instant::now().saturating_duration_since(at);
                let span =
                    jiff::SignedDuration::try_from(elapsed).unwrap_or(jiff::SignedDuration::MAX);
                origin.checked_add(span).unwrap_or(Timestamp::MAX)
            }
        }
    }

    /// Time elapsed since `earlier`, zero if `earlier` is in the future.
    pub fn since(&self, earlier: Timestamp) -> Duration {
        let d = self.now().duration_since(earlier);
        Duration::try_from(d).unwrap_or(Duration::ZERO)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn simulated_clock_follows_paused_tokio_time() {
        let start: Timestamp = "2026-01-01T00:00:00Z".parse().expect("valid timestamp");
        let clock = Clock::simulated(start);
        assert_eq!(clock.now(), start);
        tokio::time::sleep(Duration::from_secs(90)).await;
        assert_eq!(clock.since(start), Duration::from_secs(90));
    }
}
