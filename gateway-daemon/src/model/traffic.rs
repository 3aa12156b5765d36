//! Berth's RouteTrafficPolicy CRD: per-route flow timeouts and session affinity
//! (issue 30), and the status both of Berth's policies report (GEP-713).

use serde::{Deserialize, Serialize};

use super::{Meta, PolicyTargetRef};

/// `berth.dev/v1alpha1` RouteTrafficPolicy.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RouteTrafficPolicy {
    /// Metadata.
    pub metadata: Meta,
    /// Spec.
    pub spec: RouteTrafficPolicySpec,
}

// The derive also generates `RouteTrafficPolicyResource`, the kube type behind our CRD.
/// RouteTrafficPolicy spec: how long the flows of its target routes keep their backend
/// without packets, and whether a client's new flows follow its earlier ones.
#[derive(
    Clone,
    Debug,
    Default,
    PartialEq,
    Eq,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
    kube::CustomResource,
)]
#[kube(
    group = "berth.dev",
    version = "v1alpha1",
    kind = "RouteTrafficPolicy",
    root = "RouteTrafficPolicyResource",
    status = "PolicyStatus",
    namespaced
)]
#[serde(rename_all = "camelCase")]
pub struct RouteTrafficPolicySpec {
    /// The routes, in the policy's namespace (GEP-713: `group:
    /// gateway.networking.k8s.io`, `kind: TCPRoute` or `UDPRoute`, `name`).
    pub target_refs: Vec<PolicyTargetRef>,
    /// A UDP flow without a packet either way this long is over: its next packet is a
    /// new flow (balanced again; in SNAT mode given a new node port). When absent: 30 s
    /// in SNAT mode, and in router mode until the conntrack table needs the room.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub udp_idle_timeout: Option<String>,
    /// The same for TCP flows (when absent: 10 minutes in SNAT mode; in router mode
    /// until the conntrack table needs the room, and 10 minutes for a flow on a backend
    /// that left its Service).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tcp_idle_timeout: Option<String>,
    /// Session affinity by client address (none when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_affinity: Option<SessionAffinity>,
}

/// Session affinity (Kubernetes' `sessionAffinity: ClientIP`): a client's new flows go
/// to the backend its earlier flows went to, while that backend takes new flows and
/// the client opened a flow within `timeout`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SessionAffinity {
    /// `ClientIP` (or `None`).
    #[serde(rename = "type")]
    pub kind: String,
    /// How long after a client's last new flow its backend is kept for it (`3h` when
    /// absent, as Kubernetes; at most `24h`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<String>,
}

/// A policy's status (GEP-713 `PolicyStatus`): one entry per target it names, each with
/// its conditions.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PolicyStatus {
    /// Per target.
    #[serde(default)]
    pub ancestors: Vec<PolicyAncestorStatus>,
}

/// A policy's status for one target (GEP-713 `PolicyAncestorStatus`; the ancestor is
/// the target itself).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PolicyAncestorStatus {
    /// The target.
    pub ancestor_ref: PolicyAncestorRef,
    /// Our controller name.
    pub controller_name: String,
    /// `Accepted` (and a BackendHealthPolicy's `berth.dev/Healthy`).
    pub conditions: Vec<super::Condition>,
}

impl PolicyAncestorStatus {
    /// Our entry for target `t` of a policy in namespace `ns`.
    pub fn ours(t: &PolicyTargetRef, ns: &str, conditions: Vec<super::Condition>) -> Self {
        PolicyAncestorStatus {
            ancestor_ref: PolicyAncestorRef {
                group: t.group.clone(),
                kind: t.kind.clone(),
                namespace: ns.to_string(),
                name: t.name.clone(),
            },
            controller_name: super::CONTROLLER_NAME.to_string(),
            conditions,
        }
    }
}

/// The target an entry of a policy's status is about.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PolicyAncestorRef {
    /// API group (`""` for a Service).
    pub group: String,
    /// Kind.
    pub kind: String,
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
}
