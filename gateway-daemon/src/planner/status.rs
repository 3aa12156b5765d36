//! Status shapes exactly as Gateway API defines them (camelCase JSON).

use serde::{Deserialize, Serialize};

use crate::model::{ParentRef, RouteGroupKind};

/// Text that is mostly one of a few constants (condition types, statuses, reasons):
/// those are not copied for every condition of every route of every plan
/// (`Text::const_new`), and a short message (`assigned port 30001`) is inline.
pub type Text = crate::model::Str;

pub use crate::model::Condition;

/// Keeps the `lastTransitionTime` of conditions whose type and status are unchanged:
/// the time says when a condition last changed, not when it was last computed.
/// Returns whether any time changed.
pub fn carry_times(new: &mut [Condition], old: &[Condition]) -> bool {
    let mut changed = false;
    for c in new {
        if let Some(o) = old
            .iter()
            .find(|o| o.kind == c.kind && o.status == c.status)
        {
            if c.last_transition_time != o.last_transition_time {
                c.last_transition_time = o.last_transition_time;
                changed = true;
            }
        }
    }
    changed
}

/// Gateway status.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GatewayStatus {
    /// Addresses the Gateway serves.
    #[serde(default)]
    pub addresses: Vec<GatewayStatusAddress>,
    /// Gateway conditions.
    pub conditions: Vec<Condition>,
    /// One entry per listener (a range listener is one entry, not one per port).
    pub listeners: Vec<ListenerStatus>,
}

/// A Gateway status address.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GatewayStatusAddress {
    /// `IPAddress`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The address.
    pub value: String,
}

/// A listener's status.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ListenerStatus {
    /// Listener name.
    pub name: String,
    /// Route kinds the listener supports.
    pub supported_kinds: Vec<RouteGroupKind>,
    /// Attached routes (for a range: its bound claims).
    pub attached_routes: i32,
    /// Listener conditions.
    pub conditions: Vec<Condition>,
}

/// A route's status.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RouteStatus {
    /// One entry per parent (ours only).
    pub parents: Vec<RouteParentStatus>,
}

/// A route's status for one parent.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RouteParentStatus {
    /// The parent reference; for a range listener `port` is the assigned port.
    pub parent_ref: ParentRef,
    /// Our controller name.
    pub controller_name: Text,
    /// Accepted and ResolvedRefs.
    pub conditions: Vec<Condition>,
}
