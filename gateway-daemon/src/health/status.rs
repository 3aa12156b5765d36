//! BackendHealthPolicies' status (GEP-713, one entry per target Service): `Accepted`
//! (or why not, naming the field), and `berth.dev/Healthy` from the checks' results:
//! how many endpoints pass, and whether the Service is served in full because none
//! does (fail open). Pure.

use std::collections::HashMap;

use crate::{
    model::{PolicyAncestorStatus, PolicyStatus, Snapshot, Str, Time},
    planner::traffic::{policy_condition, PolicyEntry},
};

use super::checks::{check_of, target_of};

/// Condition type of a BackendHealthPolicy target's check results.
pub const HEALTHY: &str = "berth.dev/Healthy";

/// What the checks found for one target Service of one policy.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Found {
    /// Endpoints checked.
    pub endpoints: u64,
    /// Of those, healthy.
    pub healthy: u64,
    /// None is healthy and ready: all are served (fail open).
    pub open: bool,
}

/// Per (namespace, policy, Service): what the checks found.
pub type Results = HashMap<(Str, Str, Str), Found>;

/// The status of every BackendHealthPolicy of `snapshot`, by namespace and name, with
/// the checks' `results` (`None`: none are run, as in `berth check`).
pub fn entries(snapshot: &Snapshot, results: Option<&Results>, now: &Time) -> Vec<PolicyEntry> {
    let mut out: Vec<PolicyEntry> = snapshot
        .backend_health_policies
        .iter()
        .map(|policy| {
            let (ns, name) = (policy.metadata.ns(), policy.metadata.name.as_str());
            let generation = policy.metadata.generation;
            let check = check_of(policy);
            let ancestors = policy
                .spec
                .target_refs
                .iter()
                .enumerate()
                .map(|(i, t)| {
                    let accepted = match (&check, target_of(snapshot, ns, i, t)) {
                        (_, Err((reason, problem))) => Err((reason, problem)),
                        (Err(e), Ok(())) => Err(("Invalid", e.clone())),
                        (Ok(_), Ok(())) => Ok(()),
                    };
                    let mut conditions = vec![match &accepted {
                        Ok(()) => policy_condition(
                            "Accepted",
                            true,
                            "Accepted",
                            "its endpoints are checked".into(),
                            now,
                            generation,
                        ),
                        Err((reason, problem)) => policy_condition(
                            "Accepted",
                            false,
                            reason,
                            problem.clone(),
                            now,
                            generation,
                        ),
                    }];
                    if let (Ok(()), Some(results)) = (&accepted, results) {
                        let key = (Str::from(ns), Str::from(name), Str::from(t.name.as_str()));
                        let found = results.get(&key).copied().unwrap_or_default();
                        conditions.push(healthy(found, now, generation));
                    }
                    PolicyAncestorStatus::ours(t, ns, conditions)
                })
                .collect();
            PolicyEntry {
                kind: crate::model::PolicyKind::BackendHealthPolicy,
                namespace: ns.into(),
                name: name.into(),
                status: PolicyStatus { ancestors },
            }
        })
        .collect();
    out.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    out
}

/// The `berth.dev/Healthy` condition of what the checks `found`.
fn healthy(found: Found, now: &Time, generation: Option<i64>) -> crate::model::Condition {
    let Found {
        endpoints,
        healthy,
        open,
    } = found;
    let (ok, reason, message) = if open {
        (
            false,
            "FailOpen",
            format!("no endpoint passes the checks: all {endpoints} are served (fail open)"),
        )
    } else if healthy < endpoints {
        (
            false,
            "Unhealthy",
            format!(
                "{healthy} of {endpoints} endpoints pass the checks; the others take no new flows"
            ),
        )
    } else {
        (
            true,
            "Healthy",
            format!("{healthy} of {endpoints} endpoints pass the checks"),
        )
    };
    policy_condition(HEALTHY, ok, reason, message, now, generation)
}
