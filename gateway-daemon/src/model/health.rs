//! Berth's BackendHealthPolicy CRD: active checks of a Service's endpoints (issue 30).

use serde::{Deserialize, Serialize};

use super::{Meta, PolicyStatus};

/// `berth.dev/v1alpha1` BackendHealthPolicy.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BackendHealthPolicy {
    /// Metadata.
    pub metadata: Meta,
    /// Spec.
    pub spec: BackendHealthPolicySpec,
}

// The derive also generates `BackendHealthPolicyResource`, the kube type behind our CRD.
/// BackendHealthPolicy spec: which Services' endpoints are checked, and how. In
/// Kubernetes mode a check adds to the endpoints' own readiness; in standalone mode it
/// is their readiness.
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
    kind = "BackendHealthPolicy",
    root = "BackendHealthPolicyResource",
    status = "PolicyStatus",
    namespaced
)]
#[serde(rename_all = "camelCase")]
pub struct BackendHealthPolicySpec {
    /// The Services whose endpoints are checked, in the policy's namespace (GEP-713:
    /// `group: ""`, `kind: Service`, `name`).
    pub target_refs: Vec<PolicyTargetRef>,
    /// The check.
    pub check: HealthCheck,
    /// Between two checks of an endpoint (`5s` when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval: Option<String>,
    /// A check not answered this long fails (`1s` when absent; less than `interval`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<String>,
    /// Checks passed in a row that make an unhealthy endpoint healthy (2 when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub healthy_threshold: Option<u32>,
    /// Checks failed in a row that make a healthy endpoint unhealthy (3 when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unhealthy_threshold: Option<u32>,
}

/// A policy's target (GEP-713 `LocalPolicyTargetReference`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PolicyTargetRef {
    /// API group: `""` (core) for a Service, `gateway.networking.k8s.io` for a route.
    #[serde(default)]
    pub group: String,
    /// Kind: `Service`, `TCPRoute` or `UDPRoute`.
    pub kind: String,
    /// Name, in the policy's namespace.
    pub name: String,
}

/// How an endpoint is checked.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HealthCheck {
    /// `TCP` (a connection is accepted), `UDP` (a request is answered) or `HTTP` (a GET
    /// is answered with an expected status).
    #[serde(rename = "type")]
    pub kind: String,
    /// The port checked; when absent, the endpoint's port (its EndpointSlice must then
    /// have one port of the check's protocol).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    /// `UDP`: the request and the answer expected.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub udp: Option<UdpCheck>,
    /// `HTTP`: the path and the statuses that pass.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http: Option<HttpCheck>,
}

/// A UDP check: a datagram sent, an answer expected.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UdpCheck {
    /// The request's bytes, in hex (e.g. a DNS query).
    pub send_hex: String,
    /// The bytes the answer begins with, in hex (any answer passes when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expect_hex: Option<String>,
}

/// An HTTP check: a GET, a status expected.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HttpCheck {
    /// The path asked (`/` when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// The statuses that pass (200-399 when empty).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub expected_statuses: Vec<u16>,
}
