//! Typed Gateway API, core and Berth objects: the planner's input.
//!
//! Only the fields Berth reads are modelled; unknown fields are ignored on input. The
//! serde names follow the Kubernetes JSON (camelCase), so these types read the same
//! YAML a cluster holds.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Our GatewayClass controller name.
pub const CONTROLLER_NAME: &str = "berth.dev/gateway-controller";
/// API group of Gateway API kinds.
pub const GATEWAY_GROUP: &str = "gateway.networking.k8s.io";
/// API group of our kinds.
pub const BERTH_GROUP: &str = "berth.dev";

/// Object metadata.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Meta {
    /// Name.
    pub name: String,
    /// Namespace; `default` when absent on a namespaced object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// UID, if the object came from an API server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    /// Generation (for `observedGeneration`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<i64>,
    /// RFC 3339 creation time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub creation_timestamp: Option<String>,
    /// Labels.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
}

impl Meta {
    /// The namespace, `default` when unset.
    pub fn ns(&self) -> &str {
        self.namespace.as_deref().unwrap_or("default")
    }
}

/// A label selector (`matchLabels` and `matchExpressions`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LabelSelector {
    /// Labels that must all be present with these values.
    #[serde(default)]
    pub match_labels: BTreeMap<String, String>,
    /// Expressions that must all hold.
    #[serde(default)]
    pub match_expressions: Vec<LabelSelectorRequirement>,
}

/// One `matchExpressions` entry.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LabelSelectorRequirement {
    /// Label key.
    pub key: String,
    /// `In`, `NotIn`, `Exists` or `DoesNotExist`.
    pub operator: String,
    /// Values for `In`/`NotIn`.
    #[serde(default)]
    pub values: Vec<String>,
}

impl LabelSelector {
    /// Whether `labels` satisfy the selector. An unknown operator matches nothing.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.match_labels
            .iter()
            .all(|(k, v)| labels.get(k) == Some(v))
            && self.match_expressions.iter().all(|e| {
                let value = labels.get(&e.key);
                match e.operator.as_str() {
                    "In" => value.is_some_and(|v| e.values.contains(v)),
                    "NotIn" => value.is_none_or(|v| !e.values.contains(v)),
                    "Exists" => value.is_some(),
                    "DoesNotExist" => value.is_none(),
                    _ => false,
                }
            })
    }
}

/// GatewayClass.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GatewayClass {
    /// Metadata.
    pub metadata: Meta,
    /// Spec.
    pub spec: GatewayClassSpec,
}

/// GatewayClass spec.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GatewayClassSpec {
    /// The controller that manages Gateways of this class.
    pub controller_name: String,
}

/// Gateway.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Gateway {
    /// Metadata.
    pub metadata: Meta,
    /// Spec.
    pub spec: GatewaySpec,
}

/// Gateway spec.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GatewaySpec {
    /// GatewayClass name.
    pub gateway_class_name: String,
    /// Listeners.
    #[serde(default)]
    pub listeners: Vec<Listener>,
    /// Requested addresses.
    #[serde(default)]
    pub addresses: Vec<GatewayAddress>,
    /// Infrastructure (for `parametersRef`).
    #[serde(default)]
    pub infrastructure: Option<Infrastructure>,
}

/// A requested Gateway address.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GatewayAddress {
    /// `IPAddress` (default) or `Hostname`.
    #[serde(default, rename = "type")]
    pub kind: Option<String>,
    /// The address.
    pub value: String,
}

/// Gateway infrastructure.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Infrastructure {
    /// Reference to implementation parameters (our GatewayConfig).
    #[serde(default)]
    pub parameters_ref: Option<LocalParametersRef>,
}

/// A reference to a parameters object in the Gateway's namespace.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LocalParametersRef {
    /// API group.
    pub group: String,
    /// Kind.
    pub kind: String,
    /// Name.
    pub name: String,
}

/// A Gateway listener.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Listener {
    /// Name, unique in the Gateway.
    pub name: String,
    /// Port (the first of the range when a GatewayConfig makes it a range).
    pub port: u16,
    /// Protocol (`TCP`, `UDP`, ...).
    pub protocol: String,
    /// Which routes may attach.
    #[serde(default)]
    pub allowed_routes: Option<AllowedRoutes>,
}

/// Listener `allowedRoutes`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AllowedRoutes {
    /// Namespaces routes may come from.
    #[serde(default)]
    pub namespaces: Option<RouteNamespaces>,
    /// Route kinds allowed (empty: the protocol's default kind).
    #[serde(default)]
    pub kinds: Vec<RouteGroupKind>,
}

/// `allowedRoutes.namespaces`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RouteNamespaces {
    /// `All`, `Same` (default) or `Selector`.
    #[serde(default)]
    pub from: Option<String>,
    /// Namespace selector for `Selector`.
    #[serde(default)]
    pub selector: Option<LabelSelector>,
}

/// A route group and kind.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RouteGroupKind {
    /// Group (default `gateway.networking.k8s.io`).
    #[serde(default)]
    pub group: Option<String>,
    /// Kind.
    pub kind: String,
}

/// TCPRoute or UDPRoute: the two share their shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum RouteKind {
    /// TCPRoute.
    #[serde(rename = "TCPRoute")]
    Tcp,
    /// UDPRoute.
    #[serde(rename = "UDPRoute")]
    Udp,
}

impl RouteKind {
    /// The Kubernetes kind name.
    pub const fn name(self) -> &'static str {
        match self {
            RouteKind::Tcp => "TCPRoute",
            RouteKind::Udp => "UDPRoute",
        }
    }

    /// The listener protocol this kind attaches to.
    pub const fn protocol(self) -> &'static str {
        match self {
            RouteKind::Tcp => "TCP",
            RouteKind::Udp => "UDP",
        }
    }
}

/// A TCPRoute or UDPRoute.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Route {
    /// Which of the two kinds.
    #[serde(skip, default = "default_kind")]
    pub kind: RouteKind,
    /// Metadata.
    pub metadata: Meta,
    /// Spec.
    pub spec: RouteSpec,
}

fn default_kind() -> RouteKind {
    RouteKind::Tcp
}

/// Route spec.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RouteSpec {
    /// Parents (Gateways) to attach to.
    #[serde(default)]
    pub parent_refs: Vec<ParentRef>,
    /// Rules (Berth forwards to the backends of all rules).
    #[serde(default)]
    pub rules: Vec<RouteRule>,
}

/// A route's parent reference.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ParentRef {
    /// Group (default `gateway.networking.k8s.io`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// Kind (default `Gateway`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// Namespace (default: the route's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Gateway name.
    pub name: String,
    /// Listener name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub section_name: Option<String>,
    /// Port: a listener's port, or a port requested from a range.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
}

/// A route rule.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RouteRule {
    /// Backends.
    #[serde(default)]
    pub backend_refs: Vec<BackendRef>,
}

/// A backend reference (a Service port).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BackendRef {
    /// Group (default core, `""`).
    #[serde(default)]
    pub group: Option<String>,
    /// Kind (default `Service`).
    #[serde(default)]
    pub kind: Option<String>,
    /// Name.
    pub name: String,
    /// Namespace (default: the route's).
    #[serde(default)]
    pub namespace: Option<String>,
    /// Service port.
    #[serde(default)]
    pub port: Option<u16>,
    /// Weight (default 1).
    #[serde(default)]
    pub weight: Option<u32>,
}

/// ReferenceGrant.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReferenceGrant {
    /// Metadata.
    pub metadata: Meta,
    /// Spec.
    pub spec: ReferenceGrantSpec,
}

/// ReferenceGrant spec.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReferenceGrantSpec {
    /// Who may refer.
    pub from: Vec<GrantFrom>,
    /// What may be referred to.
    pub to: Vec<GrantTo>,
}

/// ReferenceGrant `from`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GrantFrom {
    /// Group.
    pub group: String,
    /// Kind.
    pub kind: String,
    /// Namespace.
    pub namespace: String,
}

/// ReferenceGrant `to`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GrantTo {
    /// Group.
    pub group: String,
    /// Kind.
    pub kind: String,
    /// Name (all of the kind when absent).
    #[serde(default)]
    pub name: Option<String>,
}

/// Service (the parts Berth uses).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Service {
    /// Metadata.
    pub metadata: Meta,
    /// Spec.
    #[serde(default)]
    pub spec: ServiceSpec,
}

/// Service spec.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServiceSpec {
    /// Ports.
    #[serde(default)]
    pub ports: Vec<ServicePort>,
}

/// A Service port.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServicePort {
    /// Name.
    #[serde(default)]
    pub name: Option<String>,
    /// Port.
    pub port: u16,
    /// Protocol (default TCP).
    #[serde(default)]
    pub protocol: Option<String>,
    /// Target port number (a named target port is resolved through EndpointSlices).
    #[serde(default)]
    pub target_port: Option<serde_yaml::Value>,
}

/// EndpointSlice (discovery.k8s.io/v1).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EndpointSlice {
    /// Metadata (label `kubernetes.io/service-name` names the Service).
    pub metadata: Meta,
    /// `IPv4`, `IPv6` or `FQDN`.
    pub address_type: String,
    /// Endpoints.
    #[serde(default)]
    pub endpoints: Vec<Endpoint>,
    /// Ports.
    #[serde(default)]
    pub ports: Vec<EndpointPort>,
}

/// An endpoint of a slice.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Endpoint {
    /// Addresses.
    pub addresses: Vec<String>,
    /// Conditions.
    #[serde(default)]
    pub conditions: EndpointConditions,
}

/// Endpoint conditions; absent means ready and serving.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EndpointConditions {
    /// Ready.
    #[serde(default)]
    pub ready: Option<bool>,
    /// Serving.
    #[serde(default)]
    pub serving: Option<bool>,
    /// Terminating.
    #[serde(default)]
    pub terminating: Option<bool>,
}

/// A port of a slice.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EndpointPort {
    /// Name (matches the Service port's name).
    #[serde(default)]
    pub name: Option<String>,
    /// Port.
    pub port: Option<u16>,
    /// Protocol.
    #[serde(default)]
    pub protocol: Option<String>,
}

/// Namespace (for `allowedRoutes` selectors).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Namespace {
    /// Metadata (labels).
    pub metadata: Meta,
}

/// `berth.dev/v1alpha1` GatewayConfig.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GatewayConfig {
    /// Metadata.
    pub metadata: Meta,
    /// Spec.
    pub spec: GatewayConfigSpec,
}

// The derive also generates `GatewayConfigResource`, the kube type behind our CRD.
/// GatewayConfig spec: turns a Gateway's TCP/UDP listeners into port ranges.
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
    kind = "GatewayConfig",
    root = "GatewayConfigResource",
    namespaced
)]
#[serde(rename_all = "camelCase")]
pub struct GatewayConfigSpec {
    /// Listeners turned into port ranges.
    #[serde(default)]
    pub listeners: Vec<ListenerRange>,
    /// How long a released port stays unassigned (`300s` when absent).
    #[serde(default)]
    pub release_cooldown: Option<String>,
}

/// One listener's range.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ListenerRange {
    /// The Gateway listener's name.
    pub name: String,
    /// Last port of the range (the listener's port is the first).
    pub end_port: u16,
    /// Most ports one namespace may hold in this range.
    #[serde(default)]
    pub max_ports_per_namespace: Option<u32>,
}

/// `berth.dev/v1alpha1` PortClaim: the durable record of one allocation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PortClaim {
    /// Metadata: in the Gateway's namespace, named `<gateway>-<tcp|udp>-<port>`.
    pub metadata: Meta,
    /// Spec.
    pub spec: PortClaimSpec,
    /// Status.
    #[serde(default)]
    pub status: Option<PortClaimStatus>,
}

// The derive also generates `PortClaimResource`, the kube type behind our CRD.
/// PortClaim spec: which route holds which port of which Gateway listener.
#[derive(
    Clone,
    Debug,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
    kube::CustomResource,
)]
#[kube(
    group = "berth.dev",
    version = "v1alpha1",
    kind = "PortClaim",
    root = "PortClaimResource",
    namespaced
)]
#[kube(status = "PortClaimStatus")]
#[kube(printcolumn = r#"{"name":"Gateway","type":"string","jsonPath":".spec.gateway"}"#)]
#[kube(printcolumn = r#"{"name":"Protocol","type":"string","jsonPath":".spec.protocol"}"#)]
#[kube(printcolumn = r#"{"name":"Port","type":"integer","jsonPath":".spec.port"}"#)]
#[kube(printcolumn = r#"{"name":"Route","type":"string","jsonPath":".spec.route.name"}"#)]
#[kube(printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#)]
#[serde(rename_all = "camelCase")]
pub struct PortClaimSpec {
    /// Gateway name (same namespace as the claim).
    pub gateway: String,
    /// Listener name.
    pub listener: String,
    /// `TCP` or `UDP`.
    pub protocol: String,
    /// The port.
    pub port: u16,
    /// The route holding the port.
    pub route: ClaimRoute,
}

/// The route a claim belongs to.
#[derive(
    Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "camelCase")]
pub struct ClaimRoute {
    /// Group.
    pub group: String,
    /// Kind (`TCPRoute` or `UDPRoute`).
    pub kind: String,
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// UID, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
}

impl PortClaimSpec {
    /// The spec of a claim on `port` of a Gateway's listener for `route`.
    pub fn new(
        gateway: &str,
        listener: &str,
        protocol: &str,
        port: u16,
        route: ClaimRoute,
    ) -> Self {
        PortClaimSpec {
            gateway: gateway.to_string(),
            listener: listener.to_string(),
            protocol: protocol.to_string(),
            port,
            route,
        }
    }
}

impl ClaimRoute {
    /// A Gateway API route (`TCPRoute` or `UDPRoute`) by kind, namespace and name.
    pub fn new(kind: &str, namespace: &str, name: &str, uid: Option<String>) -> Self {
        ClaimRoute {
            group: GATEWAY_GROUP.to_string(),
            kind: kind.to_string(),
            namespace: namespace.to_string(),
            name: name.to_string(),
            uid,
        }
    }
}

/// PortClaim status.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PortClaimStatus {
    /// `Bound` or `Released`.
    pub phase: ClaimPhase,
    /// When the claim was released (RFC 3339), for the cool-down.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub released_at: Option<String>,
}

/// Phase of a claim.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub enum ClaimPhase {
    /// Held by its route.
    Bound,
    /// Its route let go; the port is free after the cool-down.
    Released,
}

impl PortClaim {
    /// A bound claim for `port` of a Gateway listener, named by `claim_name`.
    pub fn bound(gateway_ns: &str, spec: PortClaimSpec) -> Self {
        PortClaim {
            metadata: Meta {
                name: claim_name(&spec.gateway, &spec.protocol, spec.port),
                namespace: Some(gateway_ns.to_string()),
                ..Meta::default()
            },
            spec,
            status: Some(PortClaimStatus {
                phase: ClaimPhase::Bound,
                released_at: None,
            }),
        }
    }

    /// Whether the claim is bound (a claim without a status is).
    pub fn is_bound(&self) -> bool {
        self.status
            .as_ref()
            .is_none_or(|s| s.phase == ClaimPhase::Bound)
    }

    /// Whether the claim is released (cooling down).
    pub fn is_released(&self) -> bool {
        self.status
            .as_ref()
            .is_some_and(|s| s.phase == ClaimPhase::Released)
    }
}

/// The name of the claim for a port: creating it is the lock.
pub fn claim_name(gateway: &str, protocol: &str, port: u16) -> String {
    format!("{gateway}-{}-{port}", protocol.to_ascii_lowercase())
}

/// Appends a route's key, `Kind/namespace/name` (first-seen times and the planner's
/// memo are keyed by it), to `out`.
pub fn route_key(out: &mut String, kind: &str, ns: &str, name: &str) {
    for (i, part) in [kind, ns, name].into_iter().enumerate() {
        if i > 0 {
            out.push('/');
        }
        out.push_str(part);
    }
}

/// Every object the planner reads, as one consistent view.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// GatewayClasses.
    pub gateway_classes: Vec<std::sync::Arc<GatewayClass>>,
    /// Gateways.
    pub gateways: Vec<std::sync::Arc<Gateway>>,
    /// TCPRoutes and UDPRoutes, in source order (file name, then position): routes
    /// without a creation time are ordered by it. Shared: a route that did not change
    /// is the same allocation from one snapshot to the next, so that comparing it with
    /// what was planned before is a pointer comparison.
    pub routes: Vec<std::sync::Arc<Route>>,
    /// ReferenceGrants.
    pub reference_grants: Vec<std::sync::Arc<ReferenceGrant>>,
    /// Services.
    pub services: Vec<std::sync::Arc<Service>>,
    /// EndpointSlices.
    pub endpoint_slices: Vec<std::sync::Arc<EndpointSlice>>,
    /// Namespaces (for label selectors; a namespace without an object has no labels).
    pub namespaces: Vec<std::sync::Arc<Namespace>>,
    /// GatewayConfigs.
    pub gateway_configs: Vec<std::sync::Arc<GatewayConfig>>,
}

/// One parsed object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Object {
    /// GatewayClass.
    GatewayClass(std::sync::Arc<GatewayClass>),
    /// Gateway.
    Gateway(std::sync::Arc<Gateway>),
    /// TCPRoute or UDPRoute.
    Route(std::sync::Arc<Route>),
    /// ReferenceGrant.
    ReferenceGrant(std::sync::Arc<ReferenceGrant>),
    /// Service.
    Service(std::sync::Arc<Service>),
    /// EndpointSlice.
    EndpointSlice(std::sync::Arc<EndpointSlice>),
    /// Namespace.
    Namespace(std::sync::Arc<Namespace>),
    /// GatewayConfig.
    GatewayConfig(std::sync::Arc<GatewayConfig>),
}

impl Snapshot {
    /// Adds an object.
    pub fn push(&mut self, object: Object) {
        match object {
            Object::GatewayClass(o) => self.gateway_classes.push(o),
            Object::Gateway(o) => self.gateways.push(o),
            Object::Route(o) => self.routes.push(o),
            Object::ReferenceGrant(o) => self.reference_grants.push(o),
            Object::Service(o) => self.services.push(o),
            Object::EndpointSlice(o) => self.endpoint_slices.push(o),
            Object::Namespace(o) => self.namespaces.push(o),
            Object::GatewayConfig(o) => self.gateway_configs.push(o),
        }
    }
}
