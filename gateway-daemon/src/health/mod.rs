//! Active health checks (issue 30): a BackendHealthPolicy's checks of its target
//! Services' endpoints, run from the gateway, and their results as the endpoints'
//! readiness.
//!
//! Data flow: after each read of the objects the loop hands the checker what they ask
//! (`checks::wanted`, pure); the checker (a thread running a current-thread tokio
//! runtime) checks every endpoint once an interval, each at its own offset in the
//! interval (spread in time), at most `MAX_IN_FLIGHT` at once, and keeps each
//! endpoint's health (`state`: thresholds). When one turns healthy or unhealthy it logs
//! the change and wakes the loop, which plans with the slices as the results make them
//! (`overlay`): an unhealthy endpoint is not ready, so a TCP route keeps its
//! connections to it and gives it no new flow, a UDP route's flows move. If no endpoint
//! of a Service is left that is ready and healthy, the checks are not applied to it
//! (fail open: all its endpoints are served, as Envoy's panic threshold does), and that
//! is said.

pub mod checks;
mod overlay;
mod probe;
pub mod state;
pub mod status;
mod tcp;

use std::{
    cmp::Reverse,
    collections::{BinaryHeap, HashMap},
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::{Duration, Instant, SystemTime},
};

use checks::{Owner, Target, Wanted};
use state::{EndpointHealth, Outcome};

/// Checks running at once, at most (a dead backend holds one for its timeout).
const MAX_IN_FLIGHT: usize = 256;

/// The checker: what it checks and what it found, shared with the loop.
#[derive(Clone)]
pub struct Health {
    shared: Arc<Mutex<Table>>,
}

impl std::fmt::Debug for Health {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Health")
            .field("counts", &self.counts())
            .finish()
    }
}

/// What the checker holds.
#[derive(Default)]
struct Table {
    /// What to check.
    wanted: Wanted,
    /// Per endpoint of a policy: its health, and when it is checked next.
    endpoints: HashMap<Key, Checked>,
    /// When each target (by its index in `wanted`) is checked next, soonest first.
    queue: BinaryHeap<Reverse<(Instant, usize)>>,
    /// Counts the `set`s: a check started before the last one does not queue its
    /// target again (`set` queued every target).
    epoch: u64,
    /// Counts every change of an endpoint's health.
    generation: u64,
    /// Checks made, and failed, since the start.
    made: u64,
    failed: u64,
    /// The Services served in full because none of their endpoints is healthy (fail
    /// open), as last said.
    open: Vec<Arc<Owner>>,
}

/// An endpoint of a policy's target.
type Key = (Arc<Owner>, SocketAddr);

struct Checked {
    health: EndpointHealth,
    next: Instant,
    running: bool,
}

/// One row of `berth get backends`.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct BackendRow {
    /// Namespace.
    pub namespace: String,
    /// The Service.
    pub service: String,
    /// The policy checking it.
    pub policy: String,
    /// Endpoint address and the port checked.
    pub endpoint: String,
    /// `healthy`, `unhealthy`, or `unhealthy (served: fail open)`.
    pub health: String,
    /// RFC 3339 time of the last check, if any.
    pub last_check: Option<String>,
    /// Its latency in milliseconds.
    pub latency_ms: Option<f64>,
    /// Why it failed ("" when it passed).
    pub detail: String,
}

/// The checker's counters, for `/metrics`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Endpoints checked.
    pub endpoints: u64,
    /// Of those, unhealthy.
    pub unhealthy: u64,
    /// Checks made since the start.
    pub checks: u64,
    /// Of those, failed.
    pub failed: u64,
}

impl Health {
    /// Starts the checker thread; `wake` wakes the loop after a change of health.
    pub fn start(wake: impl Fn() + Send + Sync + 'static) -> std::io::Result<Self> {
        let health = Health {
            shared: Arc::new(Mutex::new(Table::default())),
        };
        let checker = health.clone();
        std::thread::Builder::new()
            .name("health".into())
            .spawn(move || checker.run(wake))?;
        Ok(health)
    }

    fn table(&self) -> std::sync::MutexGuard<'_, Table> {
        self.shared.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Checks what `wanted` asks from now on; endpoints still asked keep their health.
    /// New problems are logged.
    pub fn set(&self, wanted: Wanted) {
        let mut t = self.table();
        if t.wanted == wanted {
            return;
        }
        for p in wanted
            .problems
            .iter()
            .filter(|p| !t.wanted.problems.contains(p))
        {
            tracing::warn!("BackendHealthPolicy {p} (not checked)");
        }
        let now = Instant::now();
        let mut endpoints = HashMap::with_capacity(wanted.targets.len());
        let mut queue = BinaryHeap::with_capacity(wanted.targets.len());
        for (i, target) in wanted.targets.iter().enumerate() {
            let key = (Arc::clone(&target.owner), target.endpoint);
            let kept = t.endpoints.remove(&key);
            let checked = kept.unwrap_or_else(|| Checked {
                health: EndpointHealth::new(SystemTime::now()),
                // Spread: each endpoint at its own offset within the interval.
                next: now + offset(&key, target.check.interval),
                running: false,
            });
            queue.push(Reverse((checked.next, i)));
            endpoints.insert(key, checked);
        }
        // An endpoint no longer checked that was unhealthy changes what the loop plans.
        if t.endpoints.values().any(|c| !c.health.healthy) {
            t.generation += 1;
        }
        t.endpoints = endpoints;
        t.queue = queue;
        t.epoch += 1;
        t.wanted = wanted;
    }

    /// Counts every change of health (the loop plans again when it moved).
    pub fn generation(&self) -> u64 {
        self.table().generation
    }

    /// `snapshot` as the checks make it, if they change it (see the module doc).
    pub fn overlay(&self, snapshot: &crate::model::Snapshot) -> Option<crate::model::Snapshot> {
        let mut t = self.table();
        let unhealthy: Vec<(&Arc<Owner>, SocketAddr)> = t
            .endpoints
            .iter()
            .filter(|(_, c)| !c.health.healthy)
            .map(|((o, e), _)| (o, *e))
            .collect();
        if unhealthy.is_empty() {
            t.open.clear();
            return None;
        }
        let (out, open) = overlay::apply(snapshot, &unhealthy);
        if open != t.open {
            for o in open.iter().filter(|o| !t.open.contains(o)) {
                tracing::warn!(
                    "Service {}/{}: every endpoint fails BackendHealthPolicy {}'s checks: all \
                     are served (fail open)",
                    o.namespace,
                    o.service,
                    o.policy
                );
            }
            t.open = open;
        }
        out
    }

    /// The rows of `berth get backends`.
    pub fn rows(&self) -> Vec<BackendRow> {
        let t = self.table();
        let mut rows: Vec<BackendRow> = t
            .endpoints
            .iter()
            .map(|((o, e), c)| {
                let h = &c.health;
                let health = match (h.healthy, t.open.contains(o)) {
                    (true, _) => "healthy",
                    (false, true) => "unhealthy (served: fail open)",
                    (false, false) => "unhealthy",
                };
                BackendRow {
                    namespace: o.namespace.to_string(),
                    service: o.service.to_string(),
                    policy: o.policy.to_string(),
                    endpoint: e.to_string(),
                    health: health.into(),
                    last_check: h
                        .last
                        .as_ref()
                        .map(|l| humantime::format_rfc3339_millis(l.at).to_string()),
                    latency_ms: h.last.as_ref().map(|l| l.latency.as_secs_f64() * 1000.0),
                    detail: h
                        .last
                        .as_ref()
                        .map(|l| l.detail.clone())
                        .unwrap_or_default(),
                }
            })
            .collect();
        rows.sort_by(|a, b| {
            (&a.namespace, &a.service, &a.policy, &a.endpoint).cmp(&(
                &b.namespace,
                &b.service,
                &b.policy,
                &b.endpoint,
            ))
        });
        rows
    }

    /// Per target Service of each policy: its endpoints, how many are healthy, and
    /// whether it is served in full for want of any (fail open).
    pub fn results(&self) -> status::Results {
        let t = self.table();
        let mut out = status::Results::new();
        for ((o, _), c) in &t.endpoints {
            let key = (
                o.namespace.as_str().into(),
                o.policy.as_str().into(),
                o.service.as_str().into(),
            );
            let found = out.entry(key).or_default();
            found.endpoints += 1;
            found.healthy += u64::from(c.health.healthy);
            found.open = t.open.contains(o);
        }
        out
    }

    /// The checker's counters.
    pub fn counts(&self) -> Counts {
        let t = self.table();
        Counts {
            endpoints: t.endpoints.len() as u64,
            unhealthy: t.endpoints.values().filter(|c| !c.health.healthy).count() as u64,
            checks: t.made,
            failed: t.failed,
        }
    }

    /// The checker thread: starts the checks that are due, at most `MAX_IN_FLIGHT` at
    /// once, and sleeps until the next is due (a tenth of a second at most, so that new
    /// targets start soon), a TCP check answers or one times out. TCP checks run on
    /// `tcp::Checks` (no task, timer or runtime registration each: see there), the
    /// others each in a task.
    fn run(self, wake: impl Fn() + Send + Sync + 'static) {
        let runtime = match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(r) => r,
            Err(e) => {
                tracing::error!(error = %e, "health checks cannot run");
                return;
            }
        };
        let wake: Arc<dyn Fn() + Send + Sync> = Arc::new(wake);
        let limit = Arc::new(tokio::sync::Semaphore::new(MAX_IN_FLIGHT));
        runtime.block_on(async move {
            let mut tcp = match tcp::Checks::new() {
                Ok(c) => c,
                Err(e) => {
                    tracing::error!(error = %e, "health checks cannot run");
                    return;
                }
            };
            let mut done = Vec::new();
            let sleep = tokio::time::sleep(Duration::ZERO);
            tokio::pin!(sleep);
            loop {
                let (epoch, due) = self.take_due(limit.available_permits());
                for (i, target) in due {
                    let Ok(permit) = Arc::clone(&limit).acquire_owned().await else {
                        return;
                    };
                    if let checks::CheckKind::Tcp = target.check.kind {
                        let (endpoint, timeout) = (target.endpoint, target.check.timeout);
                        let with = (permit, (epoch, i), target);
                        done.extend(tcp.start(endpoint, timeout, with));
                        continue;
                    }
                    let (me, wake) = (self.clone(), Arc::clone(&wake));
                    tokio::spawn(async move {
                        let started = Instant::now();
                        let check = &target.check;
                        let result = probe::run(&check.kind, target.endpoint, check.timeout).await;
                        drop(permit);
                        let took = started.elapsed();
                        if me.record((epoch, i), &target, result, took) {
                            wake();
                        }
                    });
                }
                let now = Instant::now();
                let timeout = tcp.finish(now, &mut done);
                let mut changed = false;
                for tcp::Done {
                    with: (permit, at, target),
                    result,
                    took,
                } in done.drain(..)
                {
                    drop(permit);
                    changed |= self.record(at, &target, result, took);
                }
                if changed {
                    wake();
                }
                // Checks due within a few milliseconds start together.
                let mut until = self
                    .until_next()
                    .clamp(Duration::from_millis(5), Duration::from_millis(100));
                if let Some(t) = timeout {
                    until = until.min(t.saturating_duration_since(now));
                }
                // Kept when it is no later (woken by an answer): a timer moved is work.
                let at = tokio::time::Instant::from_std(now + until);
                if sleep.is_elapsed() || sleep.deadline() > at {
                    sleep.as_mut().reset(at);
                }
                tokio::select! {
                    r = tcp.ready(), if !tcp.idle() => {
                        if let Err(e) = r {
                            tracing::error!(error = %e, "health checks cannot run");
                            return;
                        }
                    }
                    () = &mut sleep => {}
                }
            }
        });
    }

    /// The targets due now (at most `room`, with their index), marked running, and the
    /// epoch they were taken in.
    fn take_due(&self, room: usize) -> (u64, Vec<(usize, Target)>) {
        let now = Instant::now();
        let mut t = self.table();
        let Table {
            wanted,
            endpoints,
            queue,
            epoch,
            ..
        } = &mut *t;
        let mut due = Vec::new();
        while due.len() < room {
            match queue.peek() {
                Some(Reverse((at, _))) if *at <= now => {}
                _ => break,
            }
            let Some(Reverse((_, i))) = queue.pop() else {
                break;
            };
            let Some(target) = wanted.targets.get(i) else {
                continue;
            };
            let key = (Arc::clone(&target.owner), target.endpoint);
            if let Some(c) = endpoints.get_mut(&key) {
                if !c.running {
                    c.running = true;
                    due.push((i, target.clone()));
                }
            }
        }
        (*epoch, due)
    }

    /// How long until the next check is due.
    fn until_next(&self) -> Duration {
        let now = Instant::now();
        self.table()
            .queue
            .peek()
            .map_or(Duration::from_millis(100), |Reverse((at, _))| {
                at.saturating_duration_since(now)
            })
    }

    /// Records a check of `target`; logs a change of health and says whether there was
    /// one.
    fn record(
        &self,
        (epoch, i): (u64, usize),
        target: &Target,
        result: Result<(), String>,
        latency: Duration,
    ) -> bool {
        let mut t = self.table();
        t.made += 1;
        t.failed += u64::from(result.is_err());
        let key = (Arc::clone(&target.owner), target.endpoint);
        // Gone from the targets meanwhile: nothing to record.
        let Some(c) = t.endpoints.get_mut(&key) else {
            return false;
        };
        c.running = false;
        c.next = Instant::now() + target.check.interval;
        let next = c.next;
        if epoch == t.epoch {
            t.queue.push(Reverse((next, i)));
        }
        let Some(c) = t.endpoints.get_mut(&key) else {
            return false;
        };
        let outcome = Outcome {
            at: SystemTime::now(),
            passed: result.is_ok(),
            latency,
            detail: result.err().unwrap_or_default(),
        };
        let detail = outcome.detail.clone();
        if !c.health.record(outcome, &target.check) {
            return false;
        }
        {
            let healthy = c.health.healthy;
            t.generation += 1;
            let o = &target.owner;
            if healthy {
                tracing::info!(
                    "backend {} of Service {}/{} is healthy again (BackendHealthPolicy {})",
                    target.endpoint,
                    o.namespace,
                    o.service,
                    o.policy
                );
            } else {
                tracing::warn!(
                    "backend {} of Service {}/{} is unhealthy: {detail} (BackendHealthPolicy \
                     {}): it takes no new flows",
                    target.endpoint,
                    o.namespace,
                    o.service,
                    o.policy
                );
            }
        }
        true
    }
}

/// A loop's health checker (either mode), started when a BackendHealthPolicy first
/// asks for checks, and the generation of its results the last plan was made with.
pub struct Checker {
    health: Option<Health>,
    planned: u64,
    wake: Arc<dyn Fn() + Send + Sync>,
}

impl Checker {
    /// A checker that wakes the loop with `wake` when an endpoint's health changes.
    pub fn new(wake: impl Fn() + Send + Sync + 'static) -> Self {
        Checker {
            health: None,
            planned: 0,
            wake: Arc::new(wake),
        }
    }

    /// Follows what `snapshot`'s policies ask.
    pub fn follow(&mut self, snapshot: &crate::model::Snapshot) {
        if self.health.is_none() && !snapshot.backend_health_policies.is_empty() {
            let wake = Arc::clone(&self.wake);
            match Health::start(move || wake()) {
                Ok(h) => self.health = Some(h),
                Err(e) => tracing::error!(error = %e, "health checks cannot start"),
            }
        }
        if let Some(h) = &self.health {
            h.set(checks::wanted(snapshot));
        }
    }

    /// The checker, once started.
    pub fn handle(&self) -> Option<Health> {
        self.health.clone()
    }

    /// Whether an endpoint's health changed since the last plan.
    pub fn moved(&self) -> bool {
        self.health
            .as_ref()
            .is_some_and(|h| h.generation() != self.planned)
    }

    /// The status of `snapshot`'s BackendHealthPolicies with the checks' results (see
    /// `status`), as of `now`.
    pub fn policy_entries(
        &self,
        snapshot: &crate::model::Snapshot,
        now: std::time::SystemTime,
    ) -> Vec<crate::planner::traffic::PolicyEntry> {
        if snapshot.backend_health_policies.is_empty() {
            return Vec::new();
        }
        let results = self.health.as_ref().map(Health::results);
        let now = crate::model::Time::at(now);
        status::entries(snapshot, Some(&results.unwrap_or_default()), &now)
    }

    /// The snapshot to plan with: `snapshot` as the checks make it.
    pub fn overlay(&mut self, snapshot: &crate::model::Snapshot) -> Option<crate::model::Snapshot> {
        let h = self.health.as_ref()?;
        self.planned = h.generation();
        h.overlay(snapshot)
    }
}

/// Where in `interval` an endpoint's checks fall: a hash of its key, so that checks of
/// many endpoints spread over the interval.
fn offset(key: &Key, interval: Duration) -> Duration {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    key.hash(&mut h);
    let millis = interval.as_millis().max(1) as u64;
    Duration::from_millis(h.finish() % millis)
}
