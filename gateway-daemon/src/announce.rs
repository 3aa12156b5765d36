//! Whether this node announces its gateway addresses: one decision, pure.
//!
//! Berth never speaks BGP: the operator's routing daemon (BIRD, FRR) announces what the
//! daemon publishes, the addresses on its address interface (`berth0`, `protocol
//! direct`, FRR's `redistribute connected`) and, with `--announce-table N`, host routes
//! of protocol `berth` in kernel table N (`protocol kernel { kernel table N; learn; }`;
//! see `deploy/bird`, `deploy/frr`). The set
//! published is the addresses of the installed services while the node *announces*,
//! else empty; the datapath itself keeps serving every flow that still arrives.
//!
//! The node announces unless, in this order of precedence:
//! - it is stopping (SIGTERM with `--drain-on-stop`; not persisted),
//! - the operator drained it (`berth drain`, persisted in the state directory): it is
//!   *draining* for `--drain-timeout`, then *drained*,
//! - it has not been ready (what `/readyz` reports) for longer than
//!   `--not-ready-grace`.
//!
//! [`Announce::decide`] is that decision, with no I/O and no clock of its own; the
//! edges are [`Announcer`] (requests in, the drain file, the datapath's publication,
//! the published [`Status`]), [`control`] (requests from the admin endpoint and the
//! signal handler) and [`drain_file`].

mod announcer;
pub mod control;
pub mod drain_file;

use std::{
    collections::BTreeSet,
    net::IpAddr,
    time::{Duration, SystemTime},
};

use serde::{Deserialize, Serialize};

pub use announcer::Announcer;
pub use control::Control;

/// Default of `--not-ready-grace`.
pub const DEFAULT_NOT_READY_GRACE: Duration = Duration::from_secs(10);
/// Default of `--drain-timeout`.
pub const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

/// Whether the node announces, and if not, why.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum State {
    /// The served addresses are published.
    Announced,
    /// Withdrawn by `berth drain`, for less than the drain timeout.
    Draining,
    /// Withdrawn by `berth drain`, for the drain timeout or longer.
    Drained,
    /// Withdrawn on SIGTERM (`--drain-on-stop`); the daemon exits after the drain
    /// timeout.
    Stopping,
    /// Withdrawn: not ready for longer than the grace period.
    #[serde(rename = "withdrawn-not-ready")]
    NotReady,
}

impl State {
    /// Every state, in the order `/metrics` lists them.
    pub const ALL: [State; 5] = [
        State::Announced,
        State::Draining,
        State::Drained,
        State::Stopping,
        State::NotReady,
    ];

    /// Whether the served addresses are published.
    pub fn announcing(self) -> bool {
        self == State::Announced
    }

    /// Its name in `/api/v1/announce` and `/readyz`.
    pub fn name(self) -> &'static str {
        match self {
            State::Announced => "announced",
            State::Draining => "draining",
            State::Drained => "drained",
            State::Stopping => "stopping",
            State::NotReady => "withdrawn-not-ready",
        }
    }

    /// Its label in `/metrics` (`berth_drain_state{state=...}`).
    pub fn metric_label(self) -> &'static str {
        match self {
            State::NotReady => "not_ready",
            other => other.name(),
        }
    }

    /// What withdrew the addresses, in a word or two ("" while announced).
    pub fn cause(self) -> &'static str {
        match self {
            State::Announced => "",
            State::Draining | State::Drained => "berth drain",
            State::Stopping => "SIGTERM, --drain-on-stop",
            State::NotReady => "not ready",
        }
    }
}

/// The durations the decision depends on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timing {
    /// How long the node may be not ready before its addresses are withdrawn
    /// (`--not-ready-grace`).
    pub not_ready_grace: Duration,
    /// How long a drain is *draining* before it is *drained*, and how long a stopping
    /// daemon keeps running (`--drain-timeout`).
    pub drain_timeout: Duration,
}

impl Default for Timing {
    fn default() -> Self {
        Timing {
            not_ready_grace: DEFAULT_NOT_READY_GRACE,
            drain_timeout: DEFAULT_DRAIN_TIMEOUT,
        }
    }
}

/// What the node is asked and what it is, at one instant.
#[derive(Clone, Copy, Debug, Default)]
pub struct Inputs<'a> {
    /// Why the node is not ready (what `/readyz` says), or `None` when it is.
    pub not_ready: Option<&'a str>,
    /// When the operator's drain began (`berth drain`), while it holds.
    pub operator_drain: Option<SystemTime>,
    /// When the stopping signal arrived (SIGTERM with `--drain-on-stop`), if it did.
    pub stopping: Option<SystemTime>,
}

/// The decision at one instant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    /// The state.
    pub state: State,
    /// When its cause began (the drain, the signal, the first not-ready moment); for
    /// `Announced`, when announcing began.
    pub since: SystemTime,
    /// Why the addresses are withdrawn, without the age (none while announced).
    pub reason: Option<String>,
}

/// A change of state, to be said once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Transition {
    /// The state before (none at the first decision).
    pub from: Option<State>,
    /// The state now.
    pub to: State,
}

/// The announce state machine: the time the node became not ready and the last
/// decision are all it remembers.
#[derive(Clone, Debug)]
pub struct Announce {
    timing: Timing,
    /// Since when the node is not ready, while it is not.
    not_ready_since: Option<SystemTime>,
    last: Option<Decision>,
}

impl Announce {
    /// A machine that has decided nothing yet.
    pub fn new(timing: Timing) -> Self {
        Announce {
            timing,
            not_ready_since: None,
            last: None,
        }
    }

    /// Its durations.
    pub fn timing(&self) -> Timing {
        self.timing
    }

    /// The decision at `now` given `inputs`, and the transition if the state changed
    /// (the first decision is one, from nothing).
    pub fn decide(
        &mut self,
        now: SystemTime,
        inputs: Inputs<'_>,
    ) -> (Decision, Option<Transition>) {
        let Inputs {
            not_ready,
            operator_drain,
            stopping,
        } = inputs;
        // Readiness is followed in every state, so that an undrained node that has been
        // not ready all along is withdrawn at once.
        self.not_ready_since = match not_ready {
            Some(_) => Some(self.not_ready_since.unwrap_or(now)),
            None => None,
        };
        let Timing {
            not_ready_grace,
            drain_timeout,
        } = self.timing;
        let (state, since, reason) = if let Some(at) = stopping {
            (
                State::Stopping,
                at,
                Some("addresses withdrawn on SIGTERM (--drain-on-stop)".to_string()),
            )
        } else if let Some(at) = operator_drain {
            let state = if age(now, at) >= drain_timeout {
                State::Drained
            } else {
                State::Draining
            };
            (
                state,
                at,
                Some("addresses withdrawn by berth drain".to_string()),
            )
        } else {
            match (not_ready, self.not_ready_since) {
                (Some(why), Some(at)) if age(now, at) >= not_ready_grace => (
                    State::NotReady,
                    at,
                    Some(format!(
                        "addresses withdrawn, not ready for longer than --not-ready-grace \
                         {} ({why}); first not ready",
                        humantime::format_duration(not_ready_grace)
                    )),
                ),
                _ => {
                    // Announcing since the last decision that was not, or since now.
                    let since = match &self.last {
                        Some(d) if d.state == State::Announced => d.since,
                        _ => now,
                    };
                    (State::Announced, since, None)
                }
            }
        };
        let decision = Decision {
            state,
            since,
            reason,
        };
        let from = self.last.as_ref().map(|d| d.state);
        let transition = (from != Some(state)).then_some(Transition { from, to: state });
        self.last = Some(decision.clone());
        (decision, transition)
    }
}

/// How long ago `then` was at `now` (zero if the clock went back).
fn age(now: SystemTime, then: SystemTime) -> Duration {
    now.duration_since(then).unwrap_or_default()
}

/// The addresses to publish: every served address while announcing (a decision whose
/// state `announcing()`), none otherwise.
pub fn published(announcing: bool, served: impl IntoIterator<Item = IpAddr>) -> BTreeSet<IpAddr> {
    if !announcing {
        return BTreeSet::new();
    }
    served.into_iter().collect()
}

/// What `/api/v1/announce` answers: the decision and what it did.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Status {
    /// The state.
    pub state: State,
    /// Why the addresses are withdrawn (none while announced).
    pub reason: Option<String>,
    /// When the state's cause began (RFC 3339).
    pub since: String,
    /// The addresses published now.
    pub addresses: Vec<IpAddr>,
    /// The addresses of the installed services (published while announcing).
    pub served: Vec<IpAddr>,
    /// The address interface they are published on, if any.
    pub interface: Option<String>,
    /// The routing table they are published in as routes, if any (`--announce-table`).
    pub table: Option<u32>,
    /// `--drain-timeout`.
    pub drain_timeout: String,
    /// Whether the operator's drain (`berth drain`) holds.
    pub operator_drain: bool,
    /// Operator requests (drain, undrain) applied since the daemon started.
    pub applied: u64,
    /// Why the operator's drain could not be written to (or removed from) the state
    /// directory, if it could not: it then holds until the daemon stops only.
    #[serde(default)]
    pub persist_error: Option<String>,
}

impl Status {
    /// The served addresses not published now.
    pub fn withdrawn(&self) -> Vec<IpAddr> {
        self.served
            .iter()
            .filter(|a| !self.addresses.contains(a))
            .copied()
            .collect()
    }

    /// Where addresses are published, e.g. "berth0, table 100" ("nowhere" without an
    /// address interface or table).
    pub fn places(&self) -> String {
        let mut places: Vec<String> = self.interface.iter().cloned().collect();
        places.extend(self.table.map(|t| format!("table {t}")));
        if places.is_empty() {
            return "nowhere".into();
        }
        places.join(", ")
    }

    /// How long ago the state's cause began, as "12s".
    pub fn age(&self, now: SystemTime) -> String {
        let since = humantime::parse_rfc3339_weak(&self.since).unwrap_or(now);
        let seconds = age(now, since).as_secs();
        humantime::format_duration(Duration::from_secs(seconds)).to_string()
    }

    /// One line for `/readyz` and logs: "draining: addresses withdrawn by berth drain
    /// 12s ago"; "announced" while announced.
    pub fn summary(&self, now: SystemTime) -> String {
        let Some(reason) = &self.reason else {
            return self.state.name().to_string();
        };
        let mut line = format!("{}: {reason} {} ago", self.state.name(), self.age(now));
        if self.state == State::Stopping {
            line.push_str(&format!(
                "; the daemon exits --drain-timeout ({}) after the signal",
                self.drain_timeout
            ));
        }
        line
    }

    /// The first line of every `berth get` table while the node does not announce:
    /// "NODE DRAINING (berth drain, 12s ago): 10.0.0.1 withdrawn; existing flows are
    /// served".
    pub fn banner(&self, now: SystemTime) -> Option<String> {
        if self.state.announcing() {
            return None;
        }
        let withdrawn = self.withdrawn();
        let what = if withdrawn.is_empty() {
            "no address to withdraw".to_string()
        } else {
            let list: Vec<String> = withdrawn.iter().map(IpAddr::to_string).collect();
            format!("{} withdrawn", list.join(", "))
        };
        let state = match self.state {
            State::NotReady => "WITHDRAWN (NOT READY)".to_string(),
            s => s.name().to_uppercase(),
        };
        Some(format!(
            "NODE {state} ({}, {} ago): {what}; existing flows are served",
            self.state.cause(),
            self.age(now)
        ))
    }
}

/// The moment [`Status::example`] says its state began.
#[cfg(test)]
pub(crate) const EXAMPLE_SINCE: &str = "2026-12-05T00:00:00Z";

#[cfg(test)]
impl Status {
    /// A status for tests: `state` since [`EXAMPLE_SINCE`] with `reason`, serving
    /// 10.0.0.1 and 2001:db8::1 and publishing `addresses`, on berth0 and in table
    /// 100, with the default drain timeout.
    pub(crate) fn example(state: State, reason: Option<&str>, addresses: &[&str]) -> Status {
        let ips = |list: &[&str]| list.iter().map(|a| a.parse().expect("an IP")).collect();
        Status {
            state,
            reason: reason.map(str::to_string),
            since: EXAMPLE_SINCE.into(),
            addresses: ips(addresses),
            served: ips(&["10.0.0.1", "2001:db8::1"]),
            interface: Some("berth0".into()),
            table: Some(100),
            drain_timeout: "30s".into(),
            operator_drain: matches!(state, State::Draining | State::Drained),
            applied: 1,
            persist_error: None,
        }
    }
}

#[cfg(test)]
mod tests;
