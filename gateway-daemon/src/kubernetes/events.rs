//! Events (`events.k8s.io/v1`) on routes: a port assigned, refused or released. They
//! follow what was written (claims committed, route statuses changed), so each
//! happens once, from the leader.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};

use super::{claims::Change, sources::Versions, status::Merged};
use crate::model::{RouteKey, Str, CONTROLLER_NAME};

/// One event to publish.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Notice {
    /// The route it is about.
    pub route: RouteKey,
    /// Its uid, if known.
    pub uid: Option<Str>,
    /// Warning (refusals) rather than Normal.
    pub warning: bool,
    /// Reason (`PortAssigned`, `PortReleased`, or the refusal's condition reason).
    pub reason: String,
    /// Message.
    pub note: String,
    /// Action (`Assign`, `Release`, `Refuse`).
    pub action: &'static str,
}

/// Events for committed claim changes.
pub fn from_changes(changes: &[Change]) -> Vec<Notice> {
    changes
        .iter()
        .filter_map(|change| {
            let (reason, action, c) = match change {
                Change::Created(c) => ("PortAssigned", "Assign", c),
                Change::Released(c) => ("PortReleased", "Release", c),
                Change::Deleted(_) => return None,
            };
            let s = &c.spec;
            let note = match change {
                Change::Created(_) => format!(
                    "assigned port {} ({}) of Gateway {}/{}, listener {}",
                    s.port,
                    s.protocol,
                    c.metadata.ns(),
                    s.gateway,
                    s.listener
                ),
                _ => format!(
                    "released port {} ({}) of Gateway {}/{}; it is free again after the cool-down",
                    s.port,
                    s.protocol,
                    c.metadata.ns(),
                    s.gateway
                ),
            };
            Some(Notice {
                // A claim naming another kind is no route of ours to tell.
                route: s.route.key()?,
                uid: s.route.uid.clone(),
                warning: false,
                reason: reason.into(),
                note,
                action,
            })
        })
        .collect()
}

/// Warning events for parents newly not accepted in a route's status change.
pub fn from_status(route: RouteKey, uid: Option<Str>, merged: &Merged) -> Vec<Notice> {
    let accepted = |p: &crate::planner::status::RouteParentStatus| {
        p.conditions
            .iter()
            .find(|c| c.kind == "Accepted")
            .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
    };
    merged
        .new
        .iter()
        .filter_map(|p| {
            let (status, reason, message) = accepted(p)?;
            if status != "False" {
                return None;
            }
            let before = merged
                .old
                .iter()
                .find(|o| o.parent_ref.name == p.parent_ref.name)
                .and_then(accepted);
            if before.is_some_and(|(s, r, _)| s == status && r == reason) {
                return None;
            }
            let gw_ns = p
                .parent_ref
                .namespace
                .as_deref()
                .unwrap_or(&route.namespace);
            Some(Notice {
                route: route.clone(),
                uid: uid.clone(),
                warning: true,
                reason: reason.to_string(),
                note: format!("Gateway {gw_ns}/{}: {message}", p.parent_ref.name),
                action: "Refuse",
            })
        })
        .collect()
}

/// The recorder for this daemon (`instance`: the node name).
pub fn recorder(client: kube::Client, instance: &str) -> Recorder {
    Recorder::new(
        client,
        Reporter {
            controller: CONTROLLER_NAME.to_string(),
            instance: Some(instance.to_string()),
        },
    )
}

/// Publishes a notice; failures are logged only (events are a courtesy).
pub async fn publish(recorder: &Recorder, versions: &Versions, notice: &Notice) {
    let route = &notice.route;
    let reference = ObjectReference {
        api_version: Some(versions.route(route.kind).api_version),
        kind: Some(route.kind.name().to_string()),
        namespace: Some(route.namespace.to_string()),
        name: Some(route.name.to_string()),
        uid: notice.uid.as_ref().map(ToString::to_string),
        ..ObjectReference::default()
    };
    let event = Event {
        type_: if notice.warning {
            EventType::Warning
        } else {
            EventType::Normal
        },
        reason: notice.reason.clone(),
        note: Some(notice.note.clone()),
        action: notice.action.to_string(),
        secondary: None,
    };
    if let Err(e) = recorder.publish(&event, &reference).await {
        tracing::warn!(
            route = format!("{} {}/{}", route.kind.name(), route.namespace, route.name),
            reason = notice.reason,
            error = %crate::error_chain(&e),
            "publishing an event"
        );
    }
}
