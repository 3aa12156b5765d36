//! Core kinds: Service, EndpointSlice and Namespace (the parts Berth reads).

use serde::{Deserialize, Serialize};

use super::{exact_list, Meta, Str};

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
    #[serde(default, deserialize_with = "exact_list")]
    pub ports: Vec<ServicePort>,
}

/// A Service port.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServicePort {
    /// Name.
    #[serde(default)]
    pub name: Option<Str>,
    /// Port.
    pub port: u16,
    /// Protocol (default TCP).
    #[serde(default)]
    pub protocol: Option<Str>,
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
    pub address_type: Str,
    /// Endpoints.
    #[serde(default, deserialize_with = "exact_list")]
    pub endpoints: Vec<Endpoint>,
    /// Ports.
    #[serde(default, deserialize_with = "exact_list")]
    pub ports: Vec<EndpointPort>,
}

/// An endpoint of a slice.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Endpoint {
    /// Addresses.
    #[serde(deserialize_with = "exact_list")]
    pub addresses: Vec<Str>,
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
    pub name: Option<Str>,
    /// Port.
    pub port: Option<u16>,
    /// Protocol.
    #[serde(default)]
    pub protocol: Option<Str>,
}

/// Namespace (for `allowedRoutes` selectors).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Namespace {
    /// Metadata (labels).
    pub metadata: Meta,
}
