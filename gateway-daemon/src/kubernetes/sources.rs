//! Reflectors for every kind the planner reads, and the `View` built from them: the
//! same `Snapshot` standalone mode builds from files, plus the stored claims and the
//! raw objects whose status we write.

use std::{collections::BTreeMap, sync::Arc, time::Instant};

use futures::StreamExt as _;
use kube::{
    api::{ApiResource, DynamicObject, GroupVersionKind},
    runtime::{
        reflector::{self, Store},
        watcher, WatchStreamExt as _,
    },
    Api, Client, ResourceExt as _,
};
use serde::de::DeserializeOwned;
use tokio::sync::Notify;

use crate::model::{self, PolicyKind, PortClaim, RouteKind, Snapshot, BERTH_GROUP, GATEWAY_GROUP};

/// A kind Berth watches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    /// gateway.networking.k8s.io GatewayClass.
    GatewayClass,
    /// gateway.networking.k8s.io Gateway.
    Gateway,
    /// gateway.networking.k8s.io TCPRoute.
    TcpRoute,
    /// gateway.networking.k8s.io UDPRoute.
    UdpRoute,
    /// gateway.networking.k8s.io ReferenceGrant.
    ReferenceGrant,
    /// core Service.
    Service,
    /// discovery.k8s.io EndpointSlice.
    EndpointSlice,
    /// core Namespace.
    Namespace,
    /// berth.dev GatewayConfig.
    GatewayConfig,
    /// berth.dev PortClaim.
    PortClaim,
    /// berth.dev BackendHealthPolicy.
    BackendHealthPolicy,
    /// berth.dev RouteTrafficPolicy.
    RouteTrafficPolicy,
}

impl Kind {
    /// Every kind, in the order they are started.
    pub const ALL: [Kind; 12] = [
        Kind::GatewayClass,
        Kind::Gateway,
        Kind::TcpRoute,
        Kind::UdpRoute,
        Kind::ReferenceGrant,
        Kind::Service,
        Kind::EndpointSlice,
        Kind::Namespace,
        Kind::GatewayConfig,
        Kind::PortClaim,
        Kind::BackendHealthPolicy,
        Kind::RouteTrafficPolicy,
    ];

    /// Group, kind name and plural.
    fn parts(self) -> (&'static str, &'static str, &'static str) {
        match self {
            Kind::GatewayClass => (GATEWAY_GROUP, "GatewayClass", "gatewayclasses"),
            Kind::Gateway => (GATEWAY_GROUP, "Gateway", "gateways"),
            Kind::TcpRoute => (GATEWAY_GROUP, "TCPRoute", "tcproutes"),
            Kind::UdpRoute => (GATEWAY_GROUP, "UDPRoute", "udproutes"),
            Kind::ReferenceGrant => (GATEWAY_GROUP, "ReferenceGrant", "referencegrants"),
            Kind::Service => ("", "Service", "services"),
            Kind::EndpointSlice => ("discovery.k8s.io", "EndpointSlice", "endpointslices"),
            Kind::Namespace => ("", "Namespace", "namespaces"),
            Kind::GatewayConfig => (BERTH_GROUP, "GatewayConfig", "gatewayconfigs"),
            Kind::PortClaim => (BERTH_GROUP, "PortClaim", "portclaims"),
            Kind::BackendHealthPolicy => {
                (BERTH_GROUP, "BackendHealthPolicy", "backendhealthpolicies")
            }
            Kind::RouteTrafficPolicy => (BERTH_GROUP, "RouteTrafficPolicy", "routetrafficpolicies"),
        }
    }

    /// The Kubernetes kind name.
    pub fn name(self) -> &'static str {
        self.parts().1
    }
}

/// The served version of each Gateway API kind whose version varies between clusters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Versions {
    /// TCPRoute: `v1` (Gateway API ≥ 1.6) or `v1alpha2`.
    pub tcp_route: String,
    /// UDPRoute: `v1` or `v1alpha2`.
    pub udp_route: String,
    /// ReferenceGrant: `v1` or `v1beta1`.
    pub reference_grant: String,
}

impl Default for Versions {
    fn default() -> Self {
        Versions {
            tcp_route: "v1".into(),
            udp_route: "v1".into(),
            reference_grant: "v1".into(),
        }
    }
}

impl Versions {
    /// The API resource of `kind`.
    pub fn resource(&self, kind: Kind) -> ApiResource {
        let (group, name, plural) = kind.parts();
        let version = match kind {
            Kind::TcpRoute => &self.tcp_route,
            Kind::UdpRoute => &self.udp_route,
            Kind::ReferenceGrant => &self.reference_grant,
            Kind::GatewayConfig
            | Kind::PortClaim
            | Kind::BackendHealthPolicy
            | Kind::RouteTrafficPolicy => "v1alpha1",
            _ => "v1",
        };
        ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, name), plural)
    }

    /// The API resource of a route kind.
    pub fn route(&self, kind: RouteKind) -> ApiResource {
        self.resource(match kind {
            RouteKind::Tcp => Kind::TcpRoute,
            RouteKind::Udp => Kind::UdpRoute,
        })
    }
}

/// Asks the API server which versions it serves: TCPRoute/UDPRoute v1 when listed
/// under `gateway.networking.k8s.io/v1`, else v1alpha2; ReferenceGrant likewise with
/// v1beta1. If discovery fails, v1 is assumed (and the watchers report what is wrong).
pub async fn discover(client: &Client) -> Versions {
    let listed = match client
        .list_api_group_resources(&format!("{GATEWAY_GROUP}/v1"))
        .await
    {
        Ok(list) => list.resources.into_iter().map(|r| r.name).collect(),
        Err(e) if super::api_code(&e) == Some(404) => Vec::new(),
        Err(e) => {
            tracing::warn!(error = %crate::error_chain(&e), "discovering {GATEWAY_GROUP}/v1; assuming v1 for every kind");
            return Versions::default();
        }
    };
    let pick = |plural: &str, old: &str| {
        if listed.iter().any(|r| r == plural) {
            "v1".to_string()
        } else {
            old.to_string()
        }
    };
    Versions {
        tcp_route: pick("tcproutes", "v1alpha2"),
        udp_route: pick("udproutes", "v1alpha2"),
        reference_grant: pick("referencegrants", "v1beta1"),
    }
}

/// The reflector stores of every kind; their watchers run as tasks.
pub struct Sources {
    stores: BTreeMap<Kind, Store<DynamicObject>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Sources {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl Sources {
    /// Starts one reflector per kind; `changed` is woken on every event.
    pub fn start(client: &Client, versions: &Versions, changed: &Arc<Notify>) -> Self {
        let mut sources = Sources {
            stores: BTreeMap::new(),
            tasks: Vec::new(),
        };
        for kind in Kind::ALL {
            let (store, task) = reflect(client.clone(), versions.resource(kind), changed.clone());
            sources.stores.insert(kind, store);
            sources.tasks.push(task);
        }
        sources
    }

    /// Waits until every reflector has listed its kind once. Planning before that would
    /// release claims whose routes are merely not listed yet.
    pub async fn ready(&self) {
        for (kind, store) in &self.stores {
            let started = Instant::now();
            if store.wait_until_ready().await.is_err() {
                tracing::error!(?kind, "reflector stopped before its first list");
            }
            tracing::debug!(?kind, waited = ?started.elapsed(), "listed");
        }
    }

    /// Every object held now.
    pub fn objects(&self) -> Vec<(Kind, Arc<DynamicObject>)> {
        self.stores
            .iter()
            .flat_map(|(&kind, store)| store.state().into_iter().map(move |o| (kind, o)))
            .collect()
    }
}

/// A reflector of one resource: its store, and the task that feeds it. Watch errors
/// are logged and retried with client-go's backoff; the store keeps its last contents
/// meanwhile and is replaced by the next complete list.
pub fn reflect(
    client: Client,
    resource: ApiResource,
    changed: Arc<Notify>,
) -> (Store<DynamicObject>, tokio::task::JoinHandle<()>) {
    let writer = reflector::store::Writer::new(resource.clone());
    let store = writer.as_reader();
    let api: Api<DynamicObject> = Api::all_with(client, &resource);
    let stream = watcher(api, watcher::Config::default())
        .default_backoff()
        .reflect(writer);
    let kind = resource.kind.clone();
    let task = tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        let mut failing = false;
        while let Some(event) = stream.next().await {
            match event {
                Ok(_) => {
                    if failing {
                        tracing::info!(kind, "watch recovered");
                        failing = false;
                    }
                    changed.notify_one();
                }
                // The API server no longer has the version the watch resumed from (it
                // compacted past it): the watcher lists again, as designed. Nothing is
                // wrong, so it is not a warning.
                Err(kube::runtime::watcher::Error::WatchError(status)) if status.code == 410 => {
                    tracing::info!(
                        kind,
                        reason = %status.reason,
                        message = %status.message,
                        "watch expired (410 Gone); listing again"
                    );
                }
                Err(e) => {
                    tracing::warn!(kind, error = %crate::error_chain(&e), "watch failed; retrying");
                    failing = true;
                }
            }
        }
    });
    (store, task)
}

/// Our claim key: namespace and name.
pub type Key = (String, String);

/// Claims as stored, with the resourceVersion each was read at.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Held {
    /// The claims, by namespace/name.
    pub claims: BTreeMap<Key, Stored>,
}

/// A claim as read from the API server, and the resourceVersion it was read at.
pub type Stored = (std::sync::Arc<PortClaim>, String);

impl Held {
    /// The claims, for the planner.
    pub fn list(&self) -> crate::model::ClaimList {
        self.claims.values().map(|(c, _)| c.clone()).collect()
    }
}

/// What the planner and the status writer read: objects converted once, at the edge.
#[derive(Clone, Debug, Default)]
pub struct View {
    /// Every object the planner reads.
    pub snapshot: Snapshot,
    /// PortClaims as stored.
    pub held: Held,
    /// GatewayClasses as stored (for their current status), by name.
    pub classes: BTreeMap<String, Arc<DynamicObject>>,
    /// Gateways as stored (for their current status), by namespace/name.
    pub gateways: BTreeMap<Key, Arc<DynamicObject>>,
    /// Routes as stored (for their current status and resourceVersion).
    pub routes: BTreeMap<(RouteKind, String, String), Arc<DynamicObject>>,
    /// Berth's policies as stored (for their current status), by kind,
    /// namespace and name.
    pub policies: BTreeMap<(PolicyKind, String, String), Arc<DynamicObject>>,
    /// Objects that could not be read, each naming the object and field.
    pub errors: Vec<String>,
}

/// Reads a stored object as a model type; the error names the object and the field.
pub fn convert<T: DeserializeOwned>(kind: &str, obj: &DynamicObject) -> Result<T, String> {
    let name = format!(
        "{kind} {}{}",
        obj.namespace().map(|n| n + "/").unwrap_or_default(),
        obj.name_any()
    );
    let value = serde_json::to_value(obj).map_err(|e| format!("{name}: {e}"))?;
    serde_path_to_error::deserialize(value)
        .map_err(|e| format!("{name}: field {}: {}", e.path(), e.inner()))
}

impl View {
    /// A route of `kind` named `key`: kept as stored, and typed for the planner.
    fn route(
        &mut self,
        kind: RouteKind,
        (ns, name): (String, String),
        obj: &Arc<DynamicObject>,
    ) -> Result<model::Object, String> {
        self.routes.insert((kind, ns, name), obj.clone());
        convert::<model::Route>(kind.name(), obj).map(|mut r| {
            r.kind = kind;
            model::Object::Route(Arc::new(r))
        })
    }

    /// The view of a set of stored objects. Objects are ordered by namespace and name,
    /// so a view does not depend on the stores' order.
    pub fn new(objects: impl IntoIterator<Item = (Kind, Arc<DynamicObject>)>) -> View {
        let mut objects: Vec<_> = objects.into_iter().collect();
        objects.sort_by_cached_key(|(k, o)| (*k, o.namespace(), o.name_any()));
        let mut view = View::default();
        for (kind, obj) in objects {
            let ns = obj.namespace().unwrap_or_default();
            let name = obj.name_any();
            let object = match kind {
                Kind::GatewayClass => {
                    view.classes.insert(name, obj.clone());
                    convert(kind.name(), &obj).map(model::Object::GatewayClass)
                }
                Kind::Gateway => {
                    view.gateways.insert((ns, name), obj.clone());
                    convert(kind.name(), &obj).map(model::Object::Gateway)
                }
                Kind::TcpRoute => view.route(RouteKind::Tcp, (ns, name), &obj),
                Kind::UdpRoute => view.route(RouteKind::Udp, (ns, name), &obj),
                Kind::ReferenceGrant => {
                    convert(kind.name(), &obj).map(model::Object::ReferenceGrant)
                }
                Kind::Service => convert(kind.name(), &obj).map(model::Object::Service),
                Kind::EndpointSlice => convert(kind.name(), &obj).map(model::Object::EndpointSlice),
                Kind::Namespace => convert(kind.name(), &obj).map(model::Object::Namespace),
                Kind::GatewayConfig => convert(kind.name(), &obj).map(model::Object::GatewayConfig),
                Kind::BackendHealthPolicy => {
                    let key = (PolicyKind::BackendHealthPolicy, ns, name);
                    view.policies.insert(key, obj.clone());
                    convert(kind.name(), &obj).map(model::Object::BackendHealthPolicy)
                }
                Kind::RouteTrafficPolicy => {
                    let key = (PolicyKind::RouteTrafficPolicy, ns, name);
                    view.policies.insert(key, obj.clone());
                    convert(kind.name(), &obj).map(model::Object::RouteTrafficPolicy)
                }
                Kind::PortClaim => {
                    match convert::<PortClaim>(kind.name(), &obj) {
                        Ok(c) => {
                            let rv = obj.resource_version().unwrap_or_default();
                            view.held
                                .claims
                                .insert((ns, name), (std::sync::Arc::new(c), rv));
                        }
                        Err(e) => view.errors.push(e),
                    }
                    continue;
                }
            };
            match object {
                Ok(o) => view.snapshot.push(o),
                Err(e) => view.errors.push(e),
            }
        }
        view
    }
}
