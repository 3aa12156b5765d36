//! One endpoint's health as its checks make it: healthy until `unhealthy_threshold`
//! checks in a row fail, unhealthy until `healthy_threshold` in a row pass (an endpoint
//! starts healthy: a daemon that restarts, or a policy just added, takes nothing out of
//! service before a check said so). Pure.

use std::time::{Duration, SystemTime};

use super::checks::Check;

/// The last check of an endpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    /// When it ended.
    pub at: SystemTime,
    /// Passed or not.
    pub passed: bool,
    /// How long it took.
    pub latency: Duration,
    /// Why it failed ("" when it passed).
    pub detail: String,
}

/// An endpoint's health.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EndpointHealth {
    /// Healthy (takes new flows) or not.
    pub healthy: bool,
    /// Checks in a row that went the other way than `healthy`.
    against: u32,
    /// The last check, if any.
    pub last: Option<Outcome>,
    /// Since when `healthy` holds.
    pub since: SystemTime,
}

impl EndpointHealth {
    /// An endpoint not checked yet (healthy).
    pub fn new(now: SystemTime) -> Self {
        EndpointHealth {
            healthy: true,
            against: 0,
            last: None,
            since: now,
        }
    }

    /// Records a check; returns whether the endpoint turned healthy or unhealthy.
    pub fn record(&mut self, outcome: Outcome, check: &Check) -> bool {
        let passed = outcome.passed;
        let at = outcome.at;
        self.last = Some(outcome);
        if passed == self.healthy {
            self.against = 0;
            return false;
        }
        self.against += 1;
        let threshold = if self.healthy {
            check.unhealthy_threshold
        } else {
            check.healthy_threshold
        };
        if self.against < threshold {
            return false;
        }
        self.healthy = passed;
        self.against = 0;
        self.since = at;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(passed: bool) -> Outcome {
        Outcome {
            at: SystemTime::UNIX_EPOCH,
            passed,
            latency: Duration::ZERO,
            detail: String::new(),
        }
    }

    #[test]
    fn an_endpoint_turns_unhealthy_after_the_threshold_of_failures_in_a_row_and_back() {
        let c = Check::tcp_with_defaults();
        let mut h = EndpointHealth::new(SystemTime::UNIX_EPOCH);
        let mut turns = Vec::new();
        for passed in [
            false, false, true, false, false, false, true, false, true, true, true,
        ] {
            if h.record(outcome(passed), &c) {
                turns.push(h.healthy);
            }
        }
        // Two failures then a pass: still healthy; three in a row: unhealthy; a pass
        // broken by a failure: still unhealthy; two passes in a row: healthy.
        assert_eq!(turns, [false, true]);
        assert!(h.healthy);
    }
}
