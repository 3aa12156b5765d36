//! Route kinds: TCPRoute, UDPRoute and the ReferenceGrants that let them cross namespaces.

use serde::{Deserialize, Serialize};

use super::{exact_list, Meta, Protocol, Str};

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

    /// The kind named `name` (`TCPRoute` or `UDPRoute`).
    pub fn of_name(name: &str) -> Option<Self> {
        [RouteKind::Tcp, RouteKind::Udp]
            .into_iter()
            .find(|k| k.name() == name)
    }

    /// The listener protocol this kind attaches to.
    pub const fn protocol(self) -> Protocol {
        match self {
            RouteKind::Tcp => Protocol::Tcp,
            RouteKind::Udp => Protocol::Udp,
        }
    }
}

/// A TCPRoute or UDPRoute.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Route {
    /// Which of the two kinds.
    #[serde(skip, default = "default_kind")]
    pub kind: RouteKind,
    /// Metadata.
    pub metadata: Meta,
    /// Spec.
    pub spec: RouteSpec,
    /// When Berth first saw a route without `metadata.creationTimestamp` (manifests
    /// usually have none): set once, from the store's first-seen times, on the
    /// allocation its file shares (setting it on a copy kept two of every route, 51 MB
    /// at 100,000 routes).
    #[serde(skip)]
    pub first_seen: std::sync::OnceLock<super::Time>,
}

/// A route's identity inside the daemon: kind, namespace and name (ordered so, as
/// statuses and the state document list routes). Names up to 24 bytes are inline:
/// a key is made and compared without an allocation.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct RouteKey {
    /// TCPRoute or UDPRoute.
    pub kind: RouteKind,
    /// Namespace.
    pub namespace: Str,
    /// Name.
    pub name: Str,
}

impl RouteKey {
    /// The key of `route`.
    pub fn of(route: &Route) -> Self {
        RouteKey {
            kind: route.kind,
            namespace: route.metadata.ns().into(),
            name: route.metadata.name.clone(),
        }
    }
}

impl RouteKey {
    /// The key written as `Kind/namespace/name` (as `Display` writes it).
    pub fn parse(text: &str) -> Option<Self> {
        let mut parts = text.splitn(3, '/');
        let (kind, namespace, name) = (parts.next()?, parts.next()?, parts.next()?);
        if namespace.is_empty() || name.is_empty() {
            return None;
        }
        Some(RouteKey {
            kind: RouteKind::of_name(kind)?,
            namespace: namespace.into(),
            name: name.into(),
        })
    }
}

impl std::fmt::Display for RouteKey {
    /// `Kind/namespace/name`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}/{}", self.kind.name(), self.namespace, self.name)
    }
}

/// Routes are equal as objects: the first-seen time is what Berth knows of them.
impl PartialEq for Route {
    fn eq(&self, other: &Self) -> bool {
        (self.kind, &self.metadata, &self.spec) == (other.kind, &other.metadata, &other.spec)
    }
}

impl Eq for Route {}

impl Route {
    /// Its creation time (RFC 3339): `metadata.creationTimestamp`, else when Berth
    /// first saw it.
    pub fn created(&self) -> Option<&super::Time> {
        self.metadata
            .creation_timestamp
            .as_ref()
            .or_else(|| self.first_seen.get())
    }
}

fn default_kind() -> RouteKind {
    RouteKind::Tcp
}

/// Route spec.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RouteSpec {
    /// Parents (Gateways) to attach to.
    #[serde(default, deserialize_with = "exact_list")]
    pub parent_refs: Vec<ParentRef>,
    /// Rules (Berth forwards to the backends of all rules).
    #[serde(default, deserialize_with = "exact_list")]
    pub rules: Vec<RouteRule>,
}

/// A route's parent reference.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ParentRef {
    /// Group (default `gateway.networking.k8s.io`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<Str>,
    /// Kind (default `Gateway`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<Str>,
    /// Namespace (default: the route's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<Str>,
    /// Gateway name.
    pub name: Str,
    /// Listener name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub section_name: Option<Str>,
    /// Port: a listener's port, or a port requested from a range.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
}

/// A route rule.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RouteRule {
    /// Backends.
    #[serde(default, deserialize_with = "exact_list")]
    pub backend_refs: Vec<BackendRef>,
}

/// A backend reference (a Service port).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BackendRef {
    /// Group (default core, `""`).
    #[serde(default)]
    pub group: Option<Str>,
    /// Kind (default `Service`).
    #[serde(default)]
    pub kind: Option<Str>,
    /// Name.
    pub name: Str,
    /// Namespace (default: the route's).
    #[serde(default)]
    pub namespace: Option<Str>,
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
