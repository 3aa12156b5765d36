//! One planning cycle under the store's lock: first-seen times, then the shared
//! `reconcile_once` over the state directory's claims.

use std::{sync::Arc, time::SystemTime};

use super::CycleError;
use crate::{
    model::{PortClaim, Snapshot, Time},
    planner::{self, changes::claim_writes, traffic::PolicyEntry, Plan},
    reconcile::{self, ClaimStore, Committed, Read, ReconcileError},
    store::{Found, Store, StoreError, StoreLock},
};

/// Plans once from `snapshot`, commits the claim changes and returns the plan.
pub fn cycle(
    store: &Store,
    snapshot: &Snapshot,
    now: SystemTime,
    settings: &planner::Settings,
    memo: &mut planner::Memo,
    health: Vec<PolicyEntry>,
) -> Result<Plan, CycleError> {
    let mut claims = Directory::lock(store, snapshot, now)?;
    let cycle = reconcile::Cycle {
        snapshot,
        now,
        settings,
        ephemeral_ports: crate::host::ephemeral_ports(),
        health,
    };
    let plan = reconcile::now(reconcile::reconcile_once(
        cycle,
        memo,
        &mut claims,
        &mut reconcile::Published,
    ));
    plan.map_err(|e| match e {
        ReconcileError::Claims(e) => e.into(),
        ReconcileError::Status(never) => match never {},
        ReconcileError::Unsettled(e) => e.into(),
    })
}

/// The state directory's claims, locked for one cycle, with the first-seen times the
/// cycle adds and removes (written with the first commit).
struct Directory<'s> {
    store: &'s Store,
    _lock: StoreLock,
    first_seen: Option<Found>,
}

impl<'s> Directory<'s> {
    /// Locks the store and passes over the first-seen times: routes without a creation
    /// time are ordered by when Berth first saw them.
    fn lock(store: &'s Store, snapshot: &Snapshot, now: SystemTime) -> Result<Self, StoreError> {
        let lock = store.lock()?;
        let now_text = Time::at(now);
        let (added, removed) =
            store.with_first_seen(|seen| seen.pass(&snapshot.routes, now_text))?;
        let changed = !added.is_empty() || !removed.is_empty();
        Ok(Directory {
            store,
            _lock: lock,
            first_seen: changed.then_some((added, removed)),
        })
    }
}

impl ClaimStore for Directory<'_> {
    type Error = StoreError;

    async fn read(&mut self) -> Result<Read, StoreError> {
        Ok(Read {
            claims: self.store.claims_shared()?,
            allocate: true,
        })
    }

    async fn commit(&mut self, read: Read, plan: &Plan) -> Result<Committed, StoreError> {
        let writes = claim_writes(&read.claims, &plan.claims);
        if self.first_seen.is_some() || !writes.is_empty() {
            // Other readers of the directory must read it again.
            self.store.begin_write()?;
            if let Some((added, removed)) = self.first_seen.take() {
                self.store.record_first_seen(&added, &removed)?;
            }
        }
        // Deletions keep only names: the stored claims are let go before writing, so
        // that the store's write need not copy the claims it shares with `read`.
        let deleted: Vec<(String, String)> = writes
            .deletes
            .iter()
            .map(|c| (c.metadata.ns().to_string(), c.metadata.name.to_string()))
            .collect();
        let updates: Vec<Arc<PortClaim>> = writes.updates.into_iter().cloned().collect();
        let creates: Vec<Arc<PortClaim>> = writes.creates.into_iter().cloned().collect();
        drop(read);
        let deletes: Vec<(&str, &str)> = deleted
            .iter()
            .map(|(ns, name)| (ns.as_str(), name.as_str()))
            .collect();
        // Deletions first: a port handed over within one plan is free before its new
        // claim is created.
        match self.store.commit(&deletes, &updates, &creates) {
            Ok(()) => Ok(Committed::Done),
            // Someone else created that claim meanwhile: read again and plan again.
            Err(StoreError::AlreadyExists { namespace, name }) => {
                Ok(Committed::Raced(format!("{namespace}/{name}")))
            }
            Err(e) => Err(e),
        }
    }
}
