//! A status condition, as Kubernetes and Gateway API define it (camelCase JSON): the
//! planner's statuses and the policies' share it.

use serde::{Deserialize, Serialize};

/// A status condition.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    /// Condition type.
    #[serde(rename = "type")]
    #[schemars(with = "String")]
    pub kind: super::Str,
    /// `True`, `False` or `Unknown`.
    #[schemars(with = "String")]
    pub status: super::Str,
    /// Machine-readable reason.
    #[schemars(with = "String")]
    pub reason: super::Str,
    /// Human-readable message (most are one of a few constants, shared).
    #[schemars(with = "String")]
    pub message: super::Str,
    /// RFC 3339 time of the last change.
    #[schemars(with = "String")]
    pub last_transition_time: super::Time,
    /// Generation of the object this condition was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}
