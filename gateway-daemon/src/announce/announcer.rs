//! The edge of the announce decision, shared by both modes' loops: takes the
//! operator's requests and the stopping signal from [`Control`], keeps the operator's
//! drain in the drain file, decides ([`Announce::decide`]), makes the datapath publish
//! accordingly (interface, proxy neighbours, table: one set), logs each transition
//! once, and publishes the [`Status`] the admin endpoint serves. The loops call
//! [`Announcer::step`] at least every second and whenever [`Control`] wakes them; it
//! touches the kernel only when what is published changes.

use std::{collections::BTreeSet, net::IpAddr, sync::Arc, time::SystemTime};

use super::{
    control::Request, drain_file::DrainFile, Announce, Control, Inputs, State, Status, Timing,
    Transition,
};
use crate::{
    datapath::Datapath,
    publish::{Published, Shared},
};

/// Applies the announce decision (see the module).
#[derive(Debug)]
pub struct Announcer {
    machine: Announce,
    control: Arc<Control>,
    /// Where the operator's drain is kept (none: not kept, in tests).
    file: Option<DrainFile>,
    /// When the operator's drain began, while it holds.
    operator_drain: Option<SystemTime>,
    /// Why the drain file could not be written or removed, if it could not.
    persist_error: Option<String>,
    /// Why publishing failed at the last step, if it did (logged once per message).
    failing: Option<String>,
    /// The status last published.
    last: Option<Arc<Status>>,
}

impl Announcer {
    /// An announcer deciding with `timing`, taking requests from `control`, keeping the
    /// operator's drain in `file`, which it reads now: a drain an earlier run left
    /// holds from the start.
    pub fn new(timing: Timing, control: Arc<Control>, file: Option<DrainFile>) -> Self {
        let operator_drain = file.as_ref().and_then(|f| match f.read() {
            Ok(since) => since,
            Err(e) => {
                // The operator asked for a drain, or the file would not be there.
                tracing::error!(
                    error = %crate::error_chain(&e),
                    "reading the drain file; starting drained (berth undrain removes it)"
                );
                Some(SystemTime::now())
            }
        });
        Announcer {
            machine: Announce::new(timing),
            control,
            file,
            operator_drain,
            persist_error: None,
            failing: None,
            last: None,
        }
    }

    /// Whether the node starts withdrawn (a drain kept from an earlier run): the
    /// datapath is told before it publishes anything.
    pub fn starts_withdrawn(&self) -> bool {
        self.operator_drain.is_some()
    }

    /// The requests it takes.
    pub fn control(&self) -> &Arc<Control> {
        &self.control
    }

    /// Takes requests, decides at the current time, applies the decision to
    /// `datapath` and publishes the status into `shared` (when it changed).
    pub fn step(&mut self, datapath: Option<&mut Datapath>, shared: &Shared) {
        let now = SystemTime::now();
        let taken = self.control.take();
        if let Some(request) = taken.request {
            self.take_request(request, now);
        }
        let prev = Arc::clone(&shared.lock().unwrap_or_else(|e| e.into_inner()));
        let not_ready = prev.not_ready();
        let (decision, transition) = self.machine.decide(
            now,
            Inputs {
                not_ready: not_ready.as_deref(),
                operator_drain: self.operator_drain,
                stopping: taken.stopping,
            },
        );
        let places = Places::of(datapath.as_deref());
        let before = places.published.clone();
        let places = match datapath {
            Some(dp) => {
                let result = dp.set_announcing(decision.state.announcing());
                self.report(result.map_err(|e| crate::error_chain(&e)));
                Places::of(Some(dp))
            }
            None => places,
        };
        let status = Arc::new(Status {
            state: decision.state,
            reason: decision.reason.clone(),
            since: humantime::format_rfc3339_seconds(decision.since).to_string(),
            addresses: places.published.iter().copied().collect(),
            served: places.served.iter().copied().collect(),
            interface: places.interface.clone(),
            table: places.table,
            drain_timeout: humantime::format_duration(self.machine.timing().drain_timeout)
                .to_string(),
            operator_drain: self.operator_drain.is_some(),
            applied: taken.requested,
            persist_error: self.persist_error.clone(),
        });
        if let Some(t) = transition {
            log_transition(t, &status, &before);
        }
        if self.last.as_ref() == Some(&status) {
            return;
        }
        self.last = Some(Arc::clone(&status));
        let mut guard = shared.lock().unwrap_or_else(|e| e.into_inner());
        let mut p = Published::clone(&guard);
        p.announce = Some(status);
        *guard = Arc::new(p);
    }

    /// Applies an operator's request: the drain starts (or holds on) and is kept in
    /// the drain file, or ends and the file goes.
    fn take_request(&mut self, request: Request, now: SystemTime) {
        let written = match request {
            Request::Drain => {
                let since = *self.operator_drain.get_or_insert(now);
                tracing::info!("drain requested (berth drain): withdrawing the addresses");
                self.file.as_ref().map(|f| f.write(since))
            }
            Request::Undrain => {
                self.operator_drain = None;
                tracing::info!("undrain requested (berth undrain): announcing the addresses");
                self.file.as_ref().map(DrainFile::remove)
            }
        };
        self.persist_error = match written {
            Some(Err(e)) => {
                let message = crate::error_chain(&e);
                tracing::error!(
                    error = message,
                    "the drain file could not be changed: the drain holds (or is lifted) \
                     until the daemon stops, not across a restart"
                );
                Some(message)
            }
            _ => None,
        };
    }

    /// Logs a publishing failure once per message, and the recovery.
    fn report(&mut self, result: Result<(), String>) {
        match result {
            Ok(()) => {
                if self.failing.take().is_some() {
                    tracing::info!("gateway addresses published as decided again");
                }
            }
            Err(message) => {
                if self.failing.as_deref() != Some(&message) {
                    tracing::error!(
                        error = message,
                        "publishing the gateway addresses failed; retrying"
                    );
                }
                self.failing = Some(message);
            }
        }
    }
}

/// What the datapath publishes and where.
#[derive(Debug, Default)]
struct Places {
    served: BTreeSet<IpAddr>,
    published: BTreeSet<IpAddr>,
    interface: Option<String>,
    table: Option<u32>,
}

impl Places {
    fn of(dp: Option<&Datapath>) -> Places {
        let Some(dp) = dp else {
            return Places::default();
        };
        Places {
            served: dp.served_addresses(),
            published: dp.published_addresses(),
            interface: dp.address_interface().map(str::to_string),
            table: dp.announce_table(),
        }
    }
}

fn list<'a>(addresses: impl IntoIterator<Item = &'a IpAddr>) -> String {
    let all: Vec<String> = addresses.into_iter().map(IpAddr::to_string).collect();
    if all.is_empty() {
        return "none".into();
    }
    all.join(" ")
}

/// Says a transition once: the state, the addresses it withdrew or announced, where,
/// and why.
fn log_transition(t: Transition, now: &Status, before: &BTreeSet<IpAddr>) {
    let from = t.from.map_or("start", State::name);
    let places = now.places();
    if now.state.announcing() {
        tracing::info!(
            state = now.state.name(),
            from,
            announced = %list(&now.addresses),
            newly = %list(now.addresses.iter().filter(|a| !before.contains(a))),
            places,
            "announcing the gateway addresses"
        );
        return;
    }
    tracing::info!(
        state = now.state.name(),
        from,
        withdrawn = %list(before.iter().filter(|a| !now.addresses.contains(a))),
        not_published = %list(&now.withdrawn()),
        places,
        reason = now.reason.as_deref().unwrap_or_default(),
        "gateway addresses withdrawn; the datapath keeps serving flows that still arrive"
    );
}
