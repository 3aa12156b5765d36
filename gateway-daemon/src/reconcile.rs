//! One reconcile cycle, the same in both modes: read the stored claims, plan, commit the
//! plan's claim changes (planning again when another writer got to a claim first), then
//! write statuses. Each mode supplies where its claims live (`ClaimStore`: the state
//! directory, or PortClaims through the API) and where statuses go (`StatusSink`: the
//! Kubernetes API; standalone mode publishes them with the state document instead).

use std::{ops::RangeInclusive, time::SystemTime};

use crate::{
    model::{ClaimList, Snapshot},
    planner::{self, traffic::PolicyEntry, Plan},
};

/// How many times one cycle plans again after losing a claim race.
pub const MAX_RACES: usize = 10;

/// The claims one attempt plans over.
pub struct Read {
    /// The claims as stored (and as this writer last wrote them).
    pub claims: ClaimList,
    /// Whether this writer assigns ports and commits. One that does not (a Kubernetes
    /// follower) plans over the stored claims only and writes nothing.
    pub allocate: bool,
}

/// How a commit ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Committed {
    /// Every change of the plan is stored.
    Done,
    /// Another writer changed the claim named here since it was read: plan again.
    Raced(String),
    /// This writer may no longer write (why): plan again as a reader.
    NotWriter(String),
}

/// Where claims live.
#[expect(
    async_fn_in_trait,
    reason = "implemented and called inside the crate only, on concrete types"
)]
pub trait ClaimStore {
    /// Why reading or writing failed.
    type Error;
    /// The claims to plan over.
    async fn read(&mut self) -> Result<Read, Self::Error>;
    /// Stores the changes that turn `read` into the claims `plan` wants.
    async fn commit(&mut self, read: Read, plan: &Plan) -> Result<Committed, Self::Error>;
}

/// Where the statuses of a committed plan go.
#[expect(
    async_fn_in_trait,
    reason = "implemented and called inside the crate only, on concrete types"
)]
pub trait StatusSink {
    /// Why writing failed.
    type Error;
    /// Writes the statuses of `plan`, whose claims are stored.
    async fn write(&mut self, plan: &Plan) -> Result<(), Self::Error>;
}

/// Statuses that travel with the state document only (standalone mode).
pub struct Published;

impl StatusSink for Published {
    type Error = std::convert::Infallible;
    async fn write(&mut self, _: &Plan) -> Result<(), Self::Error> {
        Ok(())
    }
}

/// What one cycle plans from besides the claims.
pub struct Cycle<'a> {
    /// All objects.
    pub snapshot: &'a Snapshot,
    /// The current time.
    pub now: SystemTime,
    /// The daemon's planning settings.
    pub settings: &'a planner::Settings,
    /// The host's ephemeral ports, when the plan is for this host only.
    pub ephemeral_ports: Option<RangeInclusive<u16>>,
    /// Health checks' policy entries, added to the plan's policies.
    pub health: Vec<PolicyEntry>,
}

/// Errors of one cycle.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError<C, S> {
    /// Reading or writing claims failed.
    #[error("claims")]
    Claims(#[source] C),
    /// Writing a status failed.
    #[error("status")]
    Status(#[source] S),
    /// Claims kept changing under us.
    #[error(transparent)]
    Unsettled(#[from] Unsettled),
}

/// Claims kept changing under a cycle: every attempt lost a race.
#[derive(Debug, thiserror::Error)]
#[error("claims kept changing while planning ({MAX_RACES} races in one cycle)")]
pub struct Unsettled;

/// Plans `cycle` over `store`'s claims, commits the claim changes (planning again after
/// a lost race, `MAX_RACES` times at most) and writes the statuses to `sink`. Returns the
/// plan to program.
pub async fn reconcile_once<C: ClaimStore, S: StatusSink>(
    cycle: Cycle<'_>,
    memo: &mut planner::Memo,
    store: &mut C,
    sink: &mut S,
) -> Result<Plan, ReconcileError<C::Error, S::Error>> {
    for _ in 0..MAX_RACES {
        let started = std::time::Instant::now();
        let read = store.read().await.map_err(ReconcileError::Claims)?;
        let t_read = started.elapsed();
        let allocate = read.allocate;
        let mut plan = planner::plan_with(
            &planner::Input {
                snapshot: cycle.snapshot,
                claims: &read.claims,
                now: cycle.now,
                default_addresses: cycle.settings.default_addresses,
                ephemeral_ports: cycle.ephemeral_ports.clone(),
                snat_ports: cycle.settings.snat_ports.clone(),
                capacity: cycle.settings.capacity,
                allocate,
            },
            memo,
        );
        let t_plan = started.elapsed();
        let committed = if allocate {
            store.commit(read, &plan).await
        } else {
            Ok(Committed::Done)
        };
        tracing::debug!(
            read_claims = ?t_read,
            plan = ?(t_plan - t_read),
            commit = ?(started.elapsed() - t_plan),
            "cycle"
        );
        match committed.map_err(ReconcileError::Claims)? {
            Committed::Done => {
                planner::traffic::add_policies(&mut plan, cycle.health);
                if allocate {
                    // Said once: the claim is released for good by this commit.
                    for why in &plan.released {
                        tracing::warn!("{why}");
                    }
                    sink.write(&plan).await.map_err(ReconcileError::Status)?;
                }
                return Ok(plan);
            }
            Committed::Raced(claim) => {
                tracing::info!(claim, "lost a claim race; planning again");
            }
            Committed::NotWriter(why) => tracing::info!("{why}; planning again"),
        }
    }
    Err(Unsettled.into())
}

/// Runs a cycle whose store and sink never wait (files under a lock).
pub fn now<T>(cycle: impl std::future::Future<Output = T>) -> T {
    use futures::FutureExt as _;
    // Invariant: no `.await` in such a store or sink reaches a future that pends.
    cycle
        .now_or_never()
        .expect("a store and sink that never wait finish at once")
}

#[cfg(test)]
mod tests;
