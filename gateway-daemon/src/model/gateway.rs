//! Gateway kinds: GatewayClass, Gateway and its listeners.

use serde::{Deserialize, Serialize};

use super::{LabelSelector, Meta};

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

impl Listener {
    /// The route kinds `allowedRoutes.kinds` names (none: the protocol's kind).
    pub fn allowed_kinds(&self) -> &[RouteGroupKind] {
        self.allowed_routes
            .as_ref()
            .map(|a| a.kinds.as_slice())
            .unwrap_or_default()
    }
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
