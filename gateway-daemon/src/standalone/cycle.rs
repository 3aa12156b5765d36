//! One planning cycle under the store's lock: first-seen times, the plan, and the
//! claim writer that commits the plan's claim changes (planning again if another
//! writer created a claim meanwhile).

use std::{sync::Arc, time::SystemTime};

use super::CycleError;
use crate::{
    model::{PortClaim, Snapshot},
    planner::{
        self,
        changes::{claim_changes, ClaimChange},
        Plan,
    },
    store::{Store, StoreError},
};

/// Plans once from `snapshot`, commits the claim changes and returns the plan.
pub fn cycle(
    store: &Store,
    snapshot: &Snapshot,
    now: SystemTime,
    settings: &planner::Settings,
    memo: &mut planner::Memo,
) -> Result<Plan, CycleError> {
    let started = std::time::Instant::now();
    let _lock = store.lock()?;
    // Routes without a creation time are ordered by when Berth first saw them.
    let now_text: crate::model::Time = humantime::format_rfc3339_seconds(now).to_string().into();
    let (added, removed) = store.with_first_seen(|seen| seen.pass(&snapshot.routes, &now_text))?;
    let mut seen_changed = !added.is_empty() || !removed.is_empty();
    let t_seen = started.elapsed();
    loop {
        let stored = store.claims_shared()?;
        let t_claims = started.elapsed();
        let plan = planner::plan_with(
            &planner::Input {
                snapshot,
                claims: &stored,
                now,
                default_addresses: settings.default_addresses,
                ephemeral_ports: crate::host::ephemeral_ports(),
                snat_ports: settings.snat_ports.clone(),
                capacity: settings.capacity,
                allocate: true,
            },
            memo,
        );
        let t_plan = started.elapsed();
        let changes = claim_changes(&stored, &plan.claims);
        let t_changes = started.elapsed();
        if seen_changed || !changes.is_empty() {
            // Other readers of the directory must read it again.
            store.begin_write()?;
            if seen_changed {
                store.record_first_seen(&added, &removed)?;
                seen_changed = false;
            }
        }
        // Deletions keep only names: the stored claims are let go before writing, so
        // that the store's write need not copy the claims it shares with `stored`.
        let writes = Writes::of(changes);
        drop(stored);
        let r = writes.commit(store);
        tracing::debug!(
            lock_and_first_seen = ?t_seen,
            read_claims = ?(t_claims - t_seen),
            plan = ?(t_plan - t_claims),
            claim_changes = ?(t_changes - t_plan),
            commit = ?(started.elapsed() - t_changes),
            "cycle"
        );
        match r {
            Ok(()) => {
                // Said once: the claim is released for good by this commit.
                for why in &plan.released {
                    tracing::warn!("{why}");
                }
                return Ok(plan);
            }
            // Someone else created that claim meanwhile: read again and plan again.
            Err(StoreError::AlreadyExists { .. }) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// Claim changes as the store takes them: deleted by name, updated, created.
struct Writes {
    deleted: Vec<(String, String)>,
    updates: Vec<Arc<PortClaim>>,
    creates: Vec<Arc<PortClaim>>,
}

impl Writes {
    fn of(changes: Vec<ClaimChange>) -> Self {
        let mut w = Writes {
            deleted: Vec::new(),
            updates: Vec::new(),
            creates: Vec::new(),
        };
        for change in changes {
            match change {
                ClaimChange::Delete(c) => w
                    .deleted
                    .push((c.metadata.ns().to_string(), c.metadata.name.to_string())),
                ClaimChange::Update(c) => w.updates.push(Arc::clone(c)),
                ClaimChange::Create(c) => w.creates.push(Arc::clone(c)),
            }
        }
        w
    }

    /// Writes them in one commit of the store (deletions first: a port handed over
    /// within one plan is free before its new claim is created).
    fn commit(&self, store: &Store) -> Result<(), StoreError> {
        let deletes: Vec<(&str, &str)> = self
            .deleted
            .iter()
            .map(|(ns, name)| (ns.as_str(), name.as_str()))
            .collect();
        store.commit(&deletes, &self.updates, &self.creates)
    }
}
