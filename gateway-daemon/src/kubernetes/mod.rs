//! Kubernetes mode (`berth run --kubernetes`): the same planner as standalone mode, fed
//! by reflectors, with PortClaims, statuses and events written through the API by the
//! elected allocator, and the datapath programmed by every node.
//!
//! One cycle: reflectors → `View` (the planner's `Snapshot`, stored claims, raw objects)
//! → `planner::plan_with` (with the memo of the last plan, as standalone mode) → as the
//! leader: claims (conditional writes; a race re-plans), Gateway and route statuses,
//! events → on every node: datapath and admin state (`publish::effects`, shared
//! with standalone mode).
//!
//! # API access (for RBAC)
//!
//! | group | resource | verbs | why |
//! |---|---|---|---|
//! | gateway.networking.k8s.io | gatewayclasses | list, watch | which Gateways are ours |
//! | gateway.networking.k8s.io | gatewayclasses/status | patch | server-side apply of `Accepted` on our classes |
//! | gateway.networking.k8s.io | gateways | list, watch | listeners, addresses, parametersRef |
//! | gateway.networking.k8s.io | gateways/status | patch | server-side apply of Gateway status |
//! | gateway.networking.k8s.io | tcproutes, udproutes | list, watch, get | routes; get re-reads on a status conflict |
//! | gateway.networking.k8s.io | tcproutes/status, udproutes/status | update | read-modify-write of `status.parents` |
//! | gateway.networking.k8s.io | referencegrants | list, watch | cross-namespace backendRefs |
//! | "" (core) | services, namespaces | list, watch | backends; `allowedRoutes` namespace selectors |
//! | discovery.k8s.io | endpointslices | list, watch | backend endpoints |
//! | berth.dev | gatewayconfigs | list, watch | port ranges |
//! | berth.dev | portclaims | list, watch, get, create, delete | allocations (create is the lock; get after a race) |
//! | berth.dev | portclaims/status | update, patch | Bound / Released phase |
//! | coordination.k8s.io | leases (own namespace) | get, create, update | allocator election |
//! | events.k8s.io | events | create, patch | assignment, refusal and release events on routes |
//!
//! Discovery (`GET /apis/gateway.networking.k8s.io/v1`) picks v1 or v1alpha2 routes and
//! v1 or v1beta1 ReferenceGrants; every authenticated client may read it.

pub mod claims;
mod driver;
pub mod events;
pub mod lease;
pub mod repair;
pub mod sources;
pub mod status;
pub use driver::{run, Options};

use std::{
    collections::BTreeSet,
    sync::Arc,
    time::{Duration, Instant, SystemTime},
};

use futures::{stream, StreamExt as _};
use kube::{runtime::events::Recorder, Client};
use tokio::sync::Notify;

use crate::{
    announce::Announcer,
    datapath::{Datapath, DatapathError},
    model::{PortClaim, RouteKey},
    planner::{self, Plan},
    publish::{self, Published, Shared},
};
use claims::{ClaimError, Recent};
use lease::{Elector, Leadership, LeaseConfig};
use sources::{Sources, Versions, View};
use status::StatusError;

/// A watch event waits this long for more before a plan starts.
pub const QUIET: Duration = Duration::from_millis(100);
/// A stream of watch events postpones a plan at most this long.
pub const DEBOUNCE_MAX: Duration = Duration::from_secs(1);
/// How many times one cycle re-plans after losing a claim race.
pub const MAX_RACES: usize = 10;
/// How many status writes run at once.
pub const STATUS_CONCURRENCY: usize = 8;

/// The HTTP status code of an API error.
pub(crate) fn api_code(e: &kube::Error) -> Option<u16> {
    match e {
        kube::Error::Api(s) => Some(s.code),
        _ => None,
    }
}

/// An API call about one object failed.
#[derive(Debug, thiserror::Error)]
#[error("{action} {kind} {namespace}/{name}")]
pub struct ApiError {
    /// What was attempted ("creating", "reading", ...).
    pub action: &'static str,
    /// Object kind.
    pub kind: String,
    /// Object namespace.
    pub namespace: String,
    /// Object name.
    pub name: String,
    /// The API error.
    #[source]
    pub source: kube::Error,
}

impl ApiError {
    /// A mapper from `kube::Error` for `map_err`.
    pub fn about(
        action: &'static str,
        kind: &str,
        namespace: &str,
        name: &str,
    ) -> impl FnOnce(kube::Error) -> Box<ApiError> {
        let (kind, namespace, name) = (kind.to_string(), namespace.to_string(), name.to_string());
        move |source| {
            Box::new(ApiError {
                action,
                kind,
                namespace,
                name,
                source,
            })
        }
    }
}

/// Errors of one cycle.
#[derive(Debug, thiserror::Error)]
pub enum CycleError {
    /// Writing claims failed.
    #[error("writing claims")]
    Claims(#[from] ClaimError),
    /// Writing a status failed.
    #[error("writing status")]
    Status(#[from] StatusError),
    /// Claims kept changing under us.
    #[error("claims kept changing while planning ({MAX_RACES} races in one cycle)")]
    Unsettled,
    /// Programming the datapath failed.
    #[error("programming the datapath")]
    Datapath(#[from] DatapathError),
}

/// What a cycle needs besides the view.
pub struct Controller {
    client: Client,
    versions: Versions,
    leadership: Leadership,
    recent: Recent,
    recorder: Recorder,
    default_addresses: planner::DefaultAddresses,
    /// The last plan's statuses, reused where their inputs did not change.
    memo: planner::Memo,
    /// The source ports SNAT flows may be given.
    snat_ports: std::ops::RangeInclusive<u16>,
    /// The datapath's room for services and backends.
    capacity: crate::datapath::Capacity,
}

impl Controller {
    /// A controller writing through `client` while `leadership` says so.
    pub fn new(
        client: Client,
        versions: Versions,
        leadership: Leadership,
        identity: &str,
        default_addresses: planner::DefaultAddresses,
    ) -> Self {
        Controller {
            recorder: events::recorder(client.clone(), identity),
            client,
            versions,
            leadership,
            recent: Recent::default(),
            default_addresses,
            memo: planner::Memo::default(),
            snat_ports: planner::DEFAULT_SNAT_PORTS,
            capacity: Default::default(),
        }
    }

    /// Gives SNAT flows the source ports `ports` (`--snat-ports`) instead of the
    /// default ones.
    pub fn with_snat_ports(mut self, ports: std::ops::RangeInclusive<u16>) -> Self {
        self.snat_ports = ports;
        self
    }

    /// Plans for a datapath of room `capacity` (`--max-services`, `--max-backends`)
    /// instead of the default.
    pub fn with_capacity(mut self, capacity: crate::datapath::Capacity) -> Self {
        self.capacity = capacity;
        self
    }

    /// One cycle over `view`: plan; as the leader, commit claims (planning again after
    /// a race), then write statuses and publish events. Returns the plan to program:
    /// a follower plans without assigning ports, so its plan holds stored claims only.
    pub async fn reconcile(
        &mut self,
        view: &View,
        now: SystemTime,
        health: Vec<crate::planner::traffic::PolicyEntry>,
    ) -> Result<Plan, CycleError> {
        let hints = repair::hints(view);
        for _ in 0..MAX_RACES {
            let mut held = view.held.clone();
            self.recent.overlay(&mut held);
            let leader = self.leadership.is_leader();
            let mut input = held.list();
            if leader {
                // Ports the repair pass offers back are proposals only the leader makes.
                input.extend(
                    hints
                        .iter()
                        .filter(|h| !held.claims.contains_key(&claim_key(h)))
                        .map(|h| Arc::new(h.clone())),
                );
            }
            let mut plan = planner::plan_with(
                &planner::Input {
                    snapshot: &view.snapshot,
                    claims: &input,
                    now,
                    default_addresses: self.default_addresses,
                    ephemeral_ports: None,
                    snat_ports: self.snat_ports.clone(),
                    capacity: self.capacity,
                    allocate: leader,
                },
                &mut self.memo,
            );
            planner::traffic::add_policies(&mut plan, health.clone());
            if !leader {
                return Ok(plan);
            }
            let mut done = Vec::new();
            let result = claims::commit(
                &self.client,
                &self.leadership,
                &held,
                &plan.claims,
                &mut self.recent,
                &mut done,
            )
            .await;
            for n in events::from_changes(&done) {
                events::publish(&self.recorder, &self.versions, &n).await;
            }
            match result {
                Ok(()) => {
                    for why in &plan.released {
                        tracing::warn!("{why}");
                    }
                    self.write_statuses(view, &plan, now).await?;
                    return Ok(plan);
                }
                Err(ClaimError::Raced { namespace, name }) => {
                    tracing::info!(
                        claim = format!("{namespace}/{name}"),
                        "lost a claim race; planning again"
                    );
                }
                // Plan again as a follower.
                Err(ClaimError::NotLeader(e)) => tracing::info!("{e}"),
                Err(e) => return Err(e.into()),
            }
        }
        Err(CycleError::Unsettled)
    }

    /// GatewayClass and Gateway statuses, then route statuses (several at once); every status is tried,
    /// the first error is returned.
    async fn write_statuses(
        &self,
        view: &View,
        plan: &Plan,
        now: SystemTime,
    ) -> Result<(), StatusError> {
        let mut first_error = None;
        let now_text = humantime::format_rfc3339_seconds(now).to_string();
        let ours = view
            .snapshot
            .gateway_classes
            .iter()
            .filter(|c| c.spec.controller_name == crate::model::CONTROLLER_NAME)
            .filter_map(|c| view.classes.get(c.metadata.name.as_str()));
        for class in ours {
            let r = status::apply_gateway_class(&self.client, &self.leadership, class, &now_text);
            keep_first(&mut first_error, r.await)?;
        }
        for g in &plan.gateways {
            let current = view.gateways.get(&(g.namespace.clone(), g.name.clone()));
            let r = status::apply_gateway(&self.client, &self.leadership, g, current.map(|o| &**o));
            keep_first(&mut first_error, r.await)?;
        }
        for p in &plan.policies {
            let key = |kind: &'static str| (kind, p.namespace.to_string(), p.name.to_string());
            let current = ["BackendHealthPolicy", "RouteTrafficPolicy"]
                .into_iter()
                .find(|k| *k == p.kind.as_str())
                .and_then(|k| view.policies.get(&key(k)));
            let r = status::apply_policy(&self.client, &self.leadership, p, current.map(|o| &**o));
            keep_first(&mut first_error, r.await)?;
        }
        // Every route of the plan, and every route that still shows entries of ours.
        let mut targets: Vec<(crate::model::RouteKind, String, String, Vec<_>)> = plan
            .routes
            .iter()
            .map(|r| {
                (
                    r.kind,
                    r.namespace.to_string(),
                    r.name.to_string(),
                    r.status.parents.clone(),
                )
            })
            .collect();
        let planned: BTreeSet<_> = targets
            .iter()
            .map(|(k, ns, n, _)| (*k, ns.clone(), n.clone()))
            .collect();
        for (key, obj) in &view.routes {
            let shows_ours = obj
                .data
                .pointer("/status/parents")
                .and_then(serde_json::Value::as_array)
                .is_some_and(|ps| {
                    ps.iter().any(|p| {
                        p.get("controllerName").and_then(serde_json::Value::as_str)
                            == Some(crate::model::CONTROLLER_NAME)
                    })
                });
            if shows_ours && !planned.contains(key) {
                targets.push((key.0, key.1.clone(), key.2.clone(), Vec::new()));
            }
        }
        let writes = targets.into_iter().map(|(kind, ns, name, ours)| {
            let resource = self.versions.route(kind);
            let cached = view.routes.get(&(kind, ns.clone(), name.clone())).cloned();
            async move {
                let result = status::write_route(
                    &self.client,
                    &self.leadership,
                    &resource,
                    &ns,
                    &name,
                    &ours,
                    cached.as_deref(),
                )
                .await;
                (kind, ns, name, cached, result)
            }
        });
        let mut results = stream::iter(writes).buffer_unordered(STATUS_CONCURRENCY);
        while let Some((kind, ns, name, cached, result)) = results.next().await {
            let Some(Some(merged)) = keep_first(&mut first_error, result)? else {
                continue;
            };
            let uid = cached.and_then(|o| o.metadata.uid.clone());
            let route = RouteKey {
                kind,
                namespace: ns.as_str().into(),
                name: name.as_str().into(),
            };
            for n in events::from_status(route, uid.map(Into::into), &merged) {
                events::publish(&self.recorder, &self.versions, &n).await;
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}

/// Passes a status write's result on, except that a failure other than lost
/// leadership is logged and kept (the first one) so that the other writes go on.
fn keep_first<T>(
    first: &mut Option<StatusError>,
    result: Result<T, StatusError>,
) -> Result<Option<T>, StatusError> {
    match result {
        Ok(v) => Ok(Some(v)),
        Err(e @ StatusError::NotLeader(_)) => Err(e),
        Err(e) => {
            tracing::warn!(error = %crate::error_chain(&e), "status not written");
            first.get_or_insert(e);
            Ok(None)
        }
    }
}

fn claim_key(c: &PortClaim) -> sources::Key {
    (c.metadata.ns().to_string(), c.metadata.name.to_string())
}
