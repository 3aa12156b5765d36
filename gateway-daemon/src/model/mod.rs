//! Typed Gateway API, core and Berth objects: the planner's input.
//!
//! Only the fields Berth reads are modelled; unknown fields are ignored on input. The
//! serde names follow the Kubernetes JSON (camelCase), so these types read the same
//! YAML a cluster holds.

/// Our GatewayClass controller name.
pub const CONTROLLER_NAME: &str = "berth.dev/gateway-controller";
/// API group of Gateway API kinds.
pub const GATEWAY_GROUP: &str = "gateway.networking.k8s.io";
/// API group of our kinds.
pub const BERTH_GROUP: &str = "berth.dev";

mod berth;
mod core_kinds;
mod gateway;
mod meta;
mod protocol;
mod route;

pub use berth::*;
pub use core_kinds::*;
pub use gateway::*;
pub use meta::*;
pub use protocol::Protocol;
pub use route::*;

/// An RFC 3339 time as text, shared: the times a plan writes into its conditions,
/// and the first-seen times of routes Berth first saw together, are one allocation
/// for all of them.
pub type Time = std::sync::Arc<str>;

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
