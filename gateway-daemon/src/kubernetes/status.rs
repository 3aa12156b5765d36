//! Status writers. Gateway status is ours alone: server-side apply with our field
//! manager. A route's `status.parents` is one atomic list shared with every controller
//! the route names, so it is read, merged (our entries replaced, others' kept as they
//! are) and written back at the resourceVersion it was read at, again on a conflict.
//! A condition whose status did not change keeps its `lastTransitionTime`, and nothing
//! is written when nothing changed.

use kube::{
    api::{ApiResource, DynamicObject, Patch, PatchParams, PostParams, TypeMeta},
    Api, Client,
};
use serde_json::Value;

use super::{
    api_code,
    lease::{Leadership, NotLeader},
    sources::{Kind, Versions},
    ApiError,
};
use crate::{
    model::{ParentRef, PolicyKind, CONTROLLER_NAME},
    planner::{
        status::{GatewayStatus, RouteParentStatus},
        GatewayEntry,
    },
};

/// Our server-side apply field manager.
pub const FIELD_MANAGER: &str = CONTROLLER_NAME;

/// How often a route status write is retried on resourceVersion conflicts.
pub const MAX_ATTEMPTS: usize = 5;

/// Errors of status writes.
#[derive(Debug, thiserror::Error)]
pub enum StatusError {
    /// We do not hold the lease.
    #[error(transparent)]
    NotLeader(#[from] NotLeader),
    /// The API call failed.
    #[error(transparent)]
    Api(#[from] Box<ApiError>),
    /// Other writers kept changing the object.
    #[error("status.parents of {kind} {namespace}/{name}: still conflicting after {MAX_ATTEMPTS} attempts")]
    Conflicts {
        /// Object kind.
        kind: String,
        /// Object namespace.
        namespace: String,
        /// Object name.
        name: String,
    },
}

pub use crate::planner::status::carry_times;

fn current_status<T: serde::de::DeserializeOwned>(obj: &DynamicObject) -> Option<T> {
    serde_json::from_value(obj.data.get("status")?.clone()).ok()
}

/// The Gateway status to apply, or `None` when `current` already shows it.
pub fn gateway_status(
    entry: &GatewayEntry,
    current: Option<&DynamicObject>,
) -> Option<GatewayStatus> {
    let mut status = entry.status.clone();
    let Some(old) = current.and_then(current_status::<GatewayStatus>) else {
        return Some(status);
    };
    carry_times(&mut status.conditions, &old.conditions);
    for l in &mut status.listeners {
        if let Some(o) = old.listeners.iter().find(|o| o.name == l.name) {
            carry_times(&mut l.conditions, &o.conditions);
        }
    }
    (status != old).then_some(status)
}

/// Applies a Gateway's status (server-side apply, forced: the status is ours). Returns
/// whether anything was written.
pub async fn apply_gateway(
    client: &Client,
    leadership: &Leadership,
    entry: &GatewayEntry,
    current: Option<&DynamicObject>,
) -> Result<bool, StatusError> {
    let Some(status) = gateway_status(entry, current) else {
        return Ok(false);
    };
    let status = serde_json::to_value(status).unwrap_or_default();
    let (ns, name) = (entry.namespace.as_str(), entry.name.as_str());
    apply_status(client, leadership, Kind::Gateway, Some(ns), name, status).await?;
    Ok(true)
}

/// The status of one of Berth's policies to apply, or `None` when `current` already
/// shows it (conditions that did not change keep their times).
pub fn policy_status(
    entry: &crate::planner::traffic::PolicyEntry,
    current: Option<&DynamicObject>,
) -> Option<crate::model::PolicyStatus> {
    let mut status = entry.status.clone();
    let Some(old) = current.and_then(current_status::<crate::model::PolicyStatus>) else {
        return Some(status);
    };
    for a in &mut status.ancestors {
        if let Some(o) = old
            .ancestors
            .iter()
            .find(|o| o.ancestor_ref == a.ancestor_ref)
        {
            carry_times(&mut a.conditions, &o.conditions);
        }
    }
    (status != old).then_some(status)
}

/// Applies a policy's status (server-side apply, forced: a policy of Berth's group is
/// ours). Returns whether anything was written.
pub async fn apply_policy(
    client: &Client,
    leadership: &Leadership,
    entry: &crate::planner::traffic::PolicyEntry,
    current: Option<&DynamicObject>,
) -> Result<bool, StatusError> {
    let Some(status) = policy_status(entry, current) else {
        return Ok(false);
    };
    let kind = match entry.kind {
        PolicyKind::BackendHealthPolicy => Kind::BackendHealthPolicy,
        PolicyKind::RouteTrafficPolicy => Kind::RouteTrafficPolicy,
    };
    let status = serde_json::to_value(status).unwrap_or_default();
    let (ns, name) = (entry.namespace.as_str(), entry.name.as_str());
    apply_status(client, leadership, kind, Some(ns), name, status).await?;
    Ok(true)
}

/// Server-side applies `status` to an object of ours (forced: the status is ours).
async fn apply_status(
    client: &Client,
    leadership: &Leadership,
    kind: Kind,
    namespace: Option<&str>,
    name: &str,
    status: Value,
) -> Result<(), StatusError> {
    let ns = namespace.unwrap_or_default();
    leadership.ensure(|| format!("status of {} {ns}/{name}", kind.name()))?;
    let resource = Versions::default().resource(kind);
    let api: Api<DynamicObject> = match namespace {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &resource),
        None => Api::all_with(client.clone(), &resource),
    };
    let mut metadata = serde_json::json!({ "name": name });
    if let Some(ns) = namespace {
        metadata["namespace"] = ns.into();
    }
    let body = serde_json::json!({
        "apiVersion": resource.api_version,
        "kind": kind.name(),
        "metadata": metadata,
        "status": status,
    });
    let params = PatchParams::apply(FIELD_MANAGER).force();
    api.patch_status(name, &params, &Patch::Apply(body))
        .await
        .map_err(ApiError::about(
            "applying the status of",
            kind.name(),
            ns,
            name,
        ))?;
    Ok(())
}

/// The status of one of our GatewayClasses: Accepted. `None` when `current` shows it
/// already for the class's generation.
pub fn gateway_class_status(class: &DynamicObject, now: &str) -> Option<Value> {
    let generation = class.metadata.generation;
    let shown = class
        .data
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|cs| {
            cs.iter().any(|c| {
                c["type"] == "Accepted"
                    && c["status"] == "True"
                    && c["observedGeneration"].as_i64() == generation
            })
        });
    (!shown).then(|| {
        let mut accepted = serde_json::json!({
            "type": "Accepted", "status": "True", "reason": "Accepted",
            "message": "handled by Berth", "lastTransitionTime": now,
        });
        if let Some(g) = generation {
            accepted["observedGeneration"] = g.into();
        }
        serde_json::json!({ "conditions": [accepted] })
    })
}

/// Applies `Accepted` to one of our GatewayClasses (server-side apply, forced).
pub async fn apply_gateway_class(
    client: &Client,
    leadership: &Leadership,
    class: &DynamicObject,
    now: &str,
) -> Result<bool, StatusError> {
    let Some(status) = gateway_class_status(class, now) else {
        return Ok(false);
    };
    let name = class.metadata.name.clone().unwrap_or_default();
    apply_status(client, leadership, Kind::GatewayClass, None, &name, status).await?;
    Ok(true)
}

/// Whether two parentRefs name the same parent; the port is left out, since on a
/// range listener ours carries the assigned port.
fn same_parent(a: &ParentRef, b: &ParentRef) -> bool {
    (&a.group, &a.kind, &a.namespace, &a.name, &a.section_name)
        == (&b.group, &b.kind, &b.namespace, &b.name, &b.section_name)
}

/// A route's `status.parents` merged with ours.
#[derive(Clone, Debug, PartialEq)]
pub struct Merged {
    /// The list to write: other controllers' entries as they were, then ours.
    pub parents: Vec<Value>,
    /// Our entries before.
    pub old: Vec<RouteParentStatus>,
    /// Our entries after (with carried transition times).
    pub new: Vec<RouteParentStatus>,
}

impl Merged {
    /// Whether our entries change.
    pub fn changed(&self) -> bool {
        self.old != self.new
    }
}

/// Replaces our entries of `current` (a route's `status.parents`) with `ours`.
pub fn merge_parents(current: &[Value], ours: &[RouteParentStatus]) -> Merged {
    let is_ours =
        |v: &Value| v.get("controllerName").and_then(Value::as_str) == Some(CONTROLLER_NAME);
    let old: Vec<RouteParentStatus> = current
        .iter()
        .filter(|v| is_ours(v))
        .filter_map(|v| serde_json::from_value(v.clone()).ok())
        .collect();
    let new: Vec<RouteParentStatus> = ours
        .iter()
        .map(|p| {
            let mut p = p.clone();
            if let Some(o) = old
                .iter()
                .find(|o| same_parent(&o.parent_ref, &p.parent_ref))
            {
                carry_times(&mut p.conditions, &o.conditions);
            }
            p
        })
        .collect();
    // An unreadable entry of ours counts as a change, so that it gets replaced.
    let unreadable = current.iter().filter(|v| is_ours(v)).count() != old.len();
    let mut parents: Vec<Value> = current.iter().filter(|v| !is_ours(v)).cloned().collect();
    parents.extend(new.iter().filter_map(|p| serde_json::to_value(p).ok()));
    Merged {
        parents,
        old: if unreadable { Vec::new() } else { old },
        new,
    }
}

/// Writes our entries of a route's `status.parents` (read-modify-write at the read
/// resourceVersion; on a conflict, read again and merge again). `cached` is the
/// reflector's copy, tried first. Returns our entries before and after when written;
/// `None` when nothing changed or the route is gone.
pub async fn write_route(
    client: &Client,
    leadership: &Leadership,
    resource: &ApiResource,
    namespace: &str,
    name: &str,
    ours: &[RouteParentStatus],
    cached: Option<&DynamicObject>,
) -> Result<Option<Merged>, StatusError> {
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, resource);
    let error = |action, source| {
        StatusError::from(ApiError::about(action, &resource.kind, namespace, name)(
            source,
        ))
    };
    let mut next = cached.cloned();
    for _ in 0..MAX_ATTEMPTS {
        let mut obj = match next.take() {
            Some(o) => o,
            None => match api.get_opt(name).await.map_err(|e| error("reading", e))? {
                Some(o) => o,
                None => return Ok(None),
            },
        };
        let current: Vec<Value> = obj
            .data
            .pointer("/status/parents")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let merged = merge_parents(&current, ours);
        if !merged.changed() {
            return Ok(None);
        }
        leadership.ensure(|| format!("status of {} {namespace}/{name}", resource.kind))?;
        obj.types = Some(TypeMeta {
            api_version: resource.api_version.clone(),
            kind: resource.kind.clone(),
        });
        match obj.data.get_mut("status").and_then(Value::as_object_mut) {
            Some(status) => {
                status.insert("parents".into(), Value::Array(merged.parents.clone()));
            }
            None => {
                obj.data["status"] = serde_json::json!({ "parents": merged.parents });
            }
        }
        match api.replace_status(name, &PostParams::default(), &obj).await {
            Ok(_) => return Ok(Some(merged)),
            Err(e) if api_code(&e) == Some(409) => continue,
            Err(e) if api_code(&e) == Some(404) => return Ok(None),
            Err(e) => return Err(error("replacing the status of", e)),
        }
    }
    Err(StatusError::Conflicts {
        kind: resource.kind.clone(),
        namespace: namespace.to_string(),
        name: name.to_string(),
    })
}
