//! RouteTrafficPolicies, read after each plan (full or incremental: a policy changes
//! no claim and no route status): each policy's settings, or what is wrong with it
//! naming the field; the flow settings of the datapath services of the routes it
//! targets; its status per target (GEP-713: Accepted, or why not). Pure.

use std::{collections::HashMap, sync::Arc, time::Duration};

use crate::{
    model::FlowSettings,
    model::{
        Condition, PolicyAncestorStatus, PolicyStatus, Protocol, RouteKey, RouteKind,
        RouteTrafficPolicy, Snapshot, Str, Time, GATEWAY_GROUP,
    },
};

use super::Plan;

/// The longest idle or affinity timeout a policy may set (Kubernetes' limit for
/// `sessionAffinityConfig.clientIP.timeoutSeconds`).
pub const MAX_TIMEOUT: Duration = Duration::from_secs(24 * 3600);

/// The session-affinity timeout when a policy sets none (Kubernetes' default).
pub const DEFAULT_AFFINITY: Duration = Duration::from_secs(3 * 3600);

/// A policy's computed status, for its status subresource and the state document.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PolicyEntry {
    /// Which kind of policy.
    pub kind: crate::model::PolicyKind,
    /// Namespace.
    pub namespace: Str,
    /// Name.
    pub name: Str,
    /// Status.
    pub status: PolicyStatus,
}

/// What a valid policy sets, in whole seconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TrafficSettings {
    /// UDP flows' idle timeout.
    pub udp_idle: Option<u32>,
    /// TCP flows' idle timeout.
    pub tcp_idle: Option<u32>,
    /// Session affinity's timeout (`None`: no affinity).
    pub affinity: Option<u32>,
}

impl TrafficSettings {
    /// The flow settings of a service of `protocol` (`None`: the defaults).
    fn for_service(self, protocol: Protocol) -> Option<FlowSettings> {
        let idle_secs = match protocol {
            Protocol::Udp => self.udp_idle,
            Protocol::Tcp => self.tcp_idle,
        };
        let s = FlowSettings {
            idle_secs,
            affinity_secs: self.affinity,
        };
        (s != FlowSettings::default()).then_some(s)
    }

    /// What it sets, for the Accepted message (`kind`: the target's).
    fn describe(self, kind: RouteKind) -> String {
        let secs = |s: u32| humantime::format_duration(Duration::from_secs(s.into())).to_string();
        let mut parts = Vec::new();
        let (own, other, other_field) = match kind {
            RouteKind::Udp => (self.udp_idle, self.tcp_idle, "tcpIdleTimeout"),
            RouteKind::Tcp => (self.tcp_idle, self.udp_idle, "udpIdleTimeout"),
        };
        if let Some(s) = own {
            parts.push(format!("idle timeout {}", secs(s)));
        }
        if let Some(s) = self.affinity {
            parts.push(format!(
                "session affinity by client address for {}",
                secs(s)
            ));
        }
        if parts.is_empty() {
            parts.push("the defaults".into());
        }
        let mut text = parts.join(", ");
        if other.is_some() {
            text.push_str(&format!(
                " ({other_field} does not apply to a {})",
                kind.name()
            ));
        }
        text
    }
}

/// A policy's settings, or what is wrong with it (naming the field).
pub fn settings_of(policy: &RouteTrafficPolicy) -> Result<TrafficSettings, String> {
    let spec = &policy.spec;
    let timeout = |field: &str, v: Option<&str>| -> Result<Option<u32>, String> {
        let Some(v) = v else {
            return Ok(None);
        };
        let d = humantime::parse_duration(v).map_err(|e| format!("{field} {v:?}: {e}"))?;
        if d < Duration::from_secs(1) || d > MAX_TIMEOUT {
            return Err(format!("{field} {v:?}: between 1s and 24h"));
        }
        // Whole seconds, rounded up.
        Ok(Some(d.as_secs() as u32 + u32::from(d.subsec_nanos() > 0)))
    };
    let udp_idle = timeout("spec.udpIdleTimeout", spec.udp_idle_timeout.as_deref())?;
    let tcp_idle = timeout("spec.tcpIdleTimeout", spec.tcp_idle_timeout.as_deref())?;
    let affinity = match &spec.session_affinity {
        None => None,
        Some(a) => match a.kind.as_str() {
            "None" => None,
            "ClientIP" => Some(
                timeout("spec.sessionAffinity.timeout", a.timeout.as_deref())?
                    .unwrap_or(DEFAULT_AFFINITY.as_secs() as u32),
            ),
            other => {
                return Err(format!(
                    "spec.sessionAffinity.type {other:?}: ClientIP or None"
                ))
            }
        },
    };
    Ok(TrafficSettings {
        udp_idle,
        tcp_idle,
        affinity,
    })
}

/// Reads `snapshot`'s RouteTrafficPolicies into `plan`: the flow settings of the
/// services of the routes they target (`plan.datapath.traffic`) and their statuses
/// (`plan.policies`). A route targeted by several policies takes the oldest's (by
/// creation time, then namespace and name); the others say `Conflicted` for it.
pub fn apply(snapshot: &Snapshot, plan: &mut Plan, now: &Time) {
    plan.policies.clear();
    if snapshot.route_traffic_policies.is_empty() {
        plan.datapath.traffic = Default::default();
        return;
    }
    let mut policies: Vec<&Arc<RouteTrafficPolicy>> =
        snapshot.route_traffic_policies.iter().collect();
    // Oldest first (a policy without a creation time in source order, after those with).
    policies.sort_by(|a, b| {
        let at = |p: &RouteTrafficPolicy| p.metadata.creation_timestamp;
        (at(a).is_none(), at(a)).cmp(&(at(b).is_none(), at(b)))
    });
    let mut taken: HashMap<RouteKey, (TrafficSettings, String)> = HashMap::new();
    for policy in policies {
        let (ns, name) = (policy.metadata.ns(), policy.metadata.name.as_str());
        let settings = settings_of(policy);
        let generation = policy.metadata.generation;
        let mut ancestors = Vec::new();
        for (i, t) in policy.spec.target_refs.iter().enumerate() {
            let kind = RouteKind::of_name(&t.kind).filter(|_| t.group == GATEWAY_GROUP);
            let (ok, reason, message) = match (&settings, kind) {
                (_, None) => (
                    false,
                    "Invalid",
                    format!(
                        "spec.targetRefs[{i}]: {}/{} is not a TCPRoute or UDPRoute of {GATEWAY_GROUP}",
                        t.group, t.kind
                    ),
                ),
                (Err(e), Some(_)) => (false, "Invalid", e.clone()),
                (Ok(s), Some(kind)) => {
                    let key = RouteKey {
                        kind,
                        namespace: ns.into(),
                        name: t.name.as_str().into(),
                    };
                    let planned = plan
                        .routes
                        .binary_search_by(|e| e.key().cmp(&(kind, ns, t.name.as_str())))
                        .is_ok();
                    if !planned {
                        (
                            false,
                            "TargetNotFound",
                            format!("{} {ns}/{} is not a route of a Gateway of Berth's", kind.name(), t.name),
                        )
                    } else if let Some((_, holder)) = taken.get(&key) {
                        (
                            false,
                            "Conflicted",
                            format!("{} {ns}/{} takes its settings from the older RouteTrafficPolicy {holder}", kind.name(), t.name),
                        )
                    } else {
                        taken.insert(key, (*s, name.to_string()));
                        (true, "Accepted", format!("applied: {}", s.describe(kind)))
                    }
                }
            };
            let accepted = policy_condition("Accepted", ok, reason, message, now, generation);
            ancestors.push(PolicyAncestorStatus::ours(t, ns, vec![accepted]));
        }
        plan.policies.push(PolicyEntry {
            kind: crate::model::PolicyKind::RouteTrafficPolicy,
            namespace: ns.into(),
            name: name.into(),
            status: PolicyStatus { ancestors },
        });
    }
    plan.policies
        .sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    plan.datapath.traffic = match taken.is_empty() {
        true => Default::default(),
        false => plan
            .owners
            .iter()
            .filter_map(|(service, key)| {
                let (settings, _) = taken.get(key.as_ref())?;
                Some((*service, settings.for_service(service.protocol)?))
            })
            .collect(),
    };
}

/// Adds the statuses of other policies (BackendHealthPolicies, whose checks run outside
/// the planner) to `plan`'s, keeping them by kind, namespace and name.
pub fn add_policies(plan: &mut Plan, more: Vec<PolicyEntry>) {
    if more.is_empty() {
        return;
    }
    plan.policies.extend(more);
    plan.policies
        .sort_by(|a, b| (&a.kind, &a.namespace, &a.name).cmp(&(&b.kind, &b.namespace, &b.name)));
}

/// A policy condition of `kind` (`Accepted`, `berth.dev/Healthy`).
pub fn policy_condition(
    kind: &'static str,
    ok: bool,
    reason: &'static str,
    message: String,
    now: &Time,
    generation: Option<i64>,
) -> Condition {
    Condition {
        kind: Str::const_new(kind),
        status: Str::const_new(if ok { "True" } else { "False" }),
        reason: Str::const_new(reason),
        message: message.into(),
        last_transition_time: *now,
        observed_generation: generation,
    }
}
