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
mod cycle;
mod driver;
pub mod events;
pub mod lease;
pub mod repair;
pub mod sources;
pub mod status;
pub use driver::{run, Options};

use std::{
    sync::Arc,
    time::{Duration, Instant, SystemTime},
};

use kube::{runtime::events::Recorder, Client};
use tokio::sync::Notify;

use crate::{
    announce::Announcer,
    datapath::{Datapath, DatapathError},
    planner::{self, Plan},
    publish::{self, Published, Shared},
    reconcile::{self, ReconcileError},
};
use claims::{ClaimError, Recent};
use lease::{Elector, Leadership, LeaseConfig};
use sources::{Sources, Versions, View};
use status::StatusError;

/// A watch event waits this long for more before a plan starts.
pub const QUIET: Duration = Duration::from_millis(100);
/// A stream of watch events postpones a plan at most this long.
pub const DEBOUNCE_MAX: Duration = Duration::from_secs(1);
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
    #[error(transparent)]
    Unsettled(#[from] crate::reconcile::Unsettled),
    /// Programming the datapath failed.
    #[error("programming the datapath")]
    Datapath(#[from] DatapathError),
}

/// The API and the role a cycle writes with.
pub(crate) struct Writer {
    client: Client,
    versions: Versions,
    leadership: Leadership,
    recorder: Recorder,
}

/// What a cycle needs besides the view.
pub struct Controller {
    writer: Writer,
    recent: Recent,
    /// The planning settings (`--address`, `--snat-ports`, `--max-services`, ...).
    settings: planner::Settings,
    /// The last plan's statuses, reused where their inputs did not change.
    memo: planner::Memo,
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
            writer: Writer {
                recorder: events::recorder(client.clone(), identity),
                client,
                versions,
                leadership,
            },
            recent: Recent::default(),
            settings: planner::Settings {
                default_addresses,
                ..Default::default()
            },
            memo: planner::Memo::default(),
        }
    }

    /// Gives SNAT flows the source ports `ports` (`--snat-ports`) instead of the
    /// default ones.
    pub fn with_snat_ports(mut self, ports: std::ops::RangeInclusive<u16>) -> Self {
        self.settings.snat_ports = ports;
        self
    }

    /// Plans for a datapath of room `capacity` (`--max-services`, `--max-backends`)
    /// instead of the default.
    pub fn with_capacity(mut self, capacity: crate::datapath::Capacity) -> Self {
        self.settings.capacity = capacity;
        self
    }

    /// One cycle over `view` (`reconcile::reconcile_once`): plan; as the leader, commit
    /// claims (planning again after a race), then write statuses and publish events.
    /// Returns the plan to program: a follower plans without assigning ports, so its
    /// plan holds stored claims only.
    pub async fn reconcile(
        &mut self,
        view: &View,
        now: SystemTime,
        health: Vec<crate::planner::traffic::PolicyEntry>,
    ) -> Result<Plan, CycleError> {
        let cycle = reconcile::Cycle {
            snapshot: &view.snapshot,
            now,
            settings: &self.settings,
            ephemeral_ports: None,
            health,
        };
        let mut claims = cycle::ApiClaims::new(&self.writer, &mut self.recent, view);
        let mut statuses = cycle::ApiStatuses {
            writer: &self.writer,
            view,
            now,
        };
        reconcile::reconcile_once(cycle, &mut self.memo, &mut claims, &mut statuses)
            .await
            .map_err(|e| match e {
                ReconcileError::Claims(e) => CycleError::Claims(e),
                ReconcileError::Status(e) => CycleError::Status(e),
                ReconcileError::Unsettled(e) => e.into(),
            })
    }
}
