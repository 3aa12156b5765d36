//! The planner: objects and existing claims in, claims, statuses and the datapath's
//! desired state out. Pure (no I/O, no clock: the time is an input) and deterministic.
//!
//! Allocation: a bound claim never moves while its route attaches;
//! static requests are served before dynamic ones, each oldest route first; a dynamic
//! route gets the lowest free port not in cool-down; released claims block their port
//! until the cool-down ends (and their own route may take them back until then).

mod addresses;
mod attach;
mod backend_index;
mod backends;
mod bind;
pub mod capacity;
pub mod changes;
mod gateway_status;
mod gateways;
mod incremental;
#[cfg(test)]
mod incremental_tests;
mod ledger;
mod memo;
mod overlaps;
mod project;
mod range_use;
mod reason;
mod route_status;
mod scope;
mod splice;
pub mod status;
pub mod traffic;

use std::{
    ops::RangeInclusive,
    sync::Arc,
    time::{Duration, SystemTime},
};

use serde::{Deserialize, Serialize};

use crate::{
    datapath::{Capacity, Usage},
    model::*,
    model::{DesiredState, ServiceAddr},
};
use backends::Index;
use status::*;

pub use addresses::{DefaultAddresses, Families, Family, TwiceForOneFamily};
pub use capacity::Waiting;
pub use memo::Memo;
pub use range_use::NEARLY_FULL_PERCENT;
pub use reason::Reason;
pub use route_status::carry_parent_times;

/// Listener condition type: some of the listener's ports are among the host's
/// ephemeral ports (present only then; the ports assigned are reserved from them).
pub const EPHEMERAL_PORT_OVERLAP: &str = "berth.dev/EphemeralPortOverlap";

/// Listener condition type: at least `range_use::NEARLY_FULL_PERCENT` % of a range
/// listener's ports are bound or cooling down (present only then).
pub const RANGE_NEARLY_FULL: &str = "berth.dev/RangeNearlyFull";

/// Cool-down when a GatewayConfig does not set `releaseCooldown`.
pub const DEFAULT_RELEASE_COOLDOWN: Duration = Duration::from_secs(300);

/// The source ports SNAT flows are given when `--snat-ports` is not set (Linux's
/// default ephemeral range); the listeners' ports are taken out of them.
pub const DEFAULT_SNAT_PORTS: RangeInclusive<u16> = 32768..=60999;

/// What the daemon's options say about planning (`--address`, `--snat-ports`,
/// `--max-services`, `--max-backends`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settings {
    /// The addresses of Gateways whose `spec.addresses` has no address Berth serves.
    pub default_addresses: DefaultAddresses,
    /// The source ports SNAT flows may be given.
    pub snat_ports: RangeInclusive<u16>,
    /// The datapath's room for services and backends.
    pub capacity: Capacity,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            default_addresses: DefaultAddresses::default(),
            snat_ports: DEFAULT_SNAT_PORTS,
            capacity: Capacity::default(),
        }
    }
}

/// What the planner reads.
pub struct Input<'a> {
    /// All objects.
    pub snapshot: &'a Snapshot,
    /// Claims as stored (shared: the plan keeps unchanged claims as the same
    /// allocations, so that comparing them with the stored ones is cheap).
    pub claims: &'a ClaimList,
    /// The current time.
    pub now: SystemTime,
    /// The addresses of Gateways whose `spec.addresses` has no address Berth serves
    /// (`--address`, once per family at most).
    pub default_addresses: DefaultAddresses,
    /// The host's ephemeral ports (`net.ipv4.ip_local_port_range`), when known: a
    /// listener overlapping them says so in its status. `None` in `berth check`.
    pub ephemeral_ports: Option<RangeInclusive<u16>>,
    /// Whether new ports may be assigned. A daemon that does not hold the allocator
    /// role plans with `false`: a route without a claim is reported Pending, and the
    /// plan programs only claims that are stored.
    pub allocate: bool,
    /// The source ports SNAT flows may be given (`--snat-ports`); the plan's
    /// `datapath.snat_ports` is this minus every listener's ports.
    pub snat_ports: RangeInclusive<u16>,
    /// The datapath's room for services and backends (`--max-services`,
    /// `--max-backends`): routes are served oldest first, those that do not fit wait
    /// for room (`capacity`).
    pub capacity: Capacity,
}

/// What the planner decides.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Plan {
    /// Every claim that should exist (bound, or released and cooling down), by name.
    pub claims: ClaimList,
    /// Status of every Gateway of our classes.
    pub gateways: Vec<GatewayEntry>,
    /// Status of every route with a parent of ours.
    pub routes: RouteList,
    /// The datapath's desired state.
    #[serde(skip)]
    pub datapath: DesiredState,
    /// The route whose backends serve each datapath service.
    #[serde(skip)]
    pub owners: Owners,
    /// Port usage of every range listener.
    #[serde(skip)]
    pub usage: Vec<ListenerUsage>,
    /// Bound claims this plan released although their route still attaches to their
    /// Gateway, and why (a port outside the listener's range, a second claim of the
    /// route on its listener): worth a warning, since a claim is released only here.
    #[serde(skip)]
    pub released: Vec<String>,
    /// Routes whose services are left out of `datapath` for want of room, oldest
    /// first (each says so in a `Programmed=False` condition, reason `DatapathFull`).
    #[serde(skip)]
    pub waiting: Vec<Waiting>,
    /// What the services of `datapath` take of the room.
    #[serde(skip)]
    pub used: Usage,
    /// Some claim is released and cooling down (plan again when its cool-down ends).
    #[serde(skip)]
    pub cooling: bool,
    /// Status of every RouteTrafficPolicy (`traffic`), by namespace and name.
    #[serde(skip)]
    pub policies: Vec<traffic::PolicyEntry>,
}

/// The route whose backends serve each datapath service (persistent, as the services
/// are: a plan shares all but what changed with the last one).
pub type Owners = imbl::OrdMap<ServiceAddr, Arc<RouteKey>>;

/// Route statuses by kind, namespace and name: a persistent vector, as the claims are.
pub type RouteList = imbl::Vector<Arc<RouteEntry>>;

/// How full a range listener is.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListenerUsage {
    /// Gateway namespace.
    pub namespace: String,
    /// Gateway name.
    pub gateway: String,
    /// Listener name.
    pub listener: String,
    /// The range's first port.
    #[serde(default)]
    pub first: u16,
    /// Ports in the range.
    pub size: u32,
    /// Ports held by bound claims.
    pub bound: u32,
    /// Ports released and cooling down.
    pub cooling: u32,
}

/// A Gateway's computed status.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GatewayEntry {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Status.
    pub status: GatewayStatus,
}

/// A route's computed status.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RouteEntry {
    /// `TCPRoute` or `UDPRoute`.
    pub kind: RouteKind,
    /// Namespace.
    pub namespace: Str,
    /// Name.
    pub name: Str,
    /// Status.
    pub status: RouteStatus,
    /// When the route was created (RFC 3339): its creation timestamp, or when Berth
    /// first saw it.
    #[serde(skip)]
    pub created: Option<Time>,
    /// The listeners each parent (in `status.parents` order) is served on, with their
    /// ports: `berth get routes` shows them. Upstream status has no place for them (a
    /// fixed listener's route has no port in its parentRef).
    #[serde(skip)]
    pub served_on: Vec<Vec<ServedOn>>,
}

/// A listener a route's parent is served on, and the port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServedOn {
    /// Listener name.
    pub listener: Str,
    /// The port assigned from its range, or its own port (a fixed listener).
    pub port: u16,
}

impl RouteEntry {
    /// Kind, namespace and name: the order of a plan's routes.
    pub fn key(&self) -> (RouteKind, &str, &str) {
        (self.kind, &self.namespace, &self.name)
    }
}

/// A hash map with a fast, non-cryptographic hasher: the planner's keys are names from
/// the objects it plans, and a plan is made often.
pub(crate) type FastMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

fn condition(
    kind: &'static str,
    ok: bool,
    reason: Reason,
    message: impl Into<Text>,
    now: &Time,
    generation: Option<i64>,
) -> Condition {
    Condition {
        kind: Text::const_new(kind),
        status: Text::const_new(if ok { "True" } else { "False" }),
        reason: Text::const_new(reason.as_str()),
        message: message.into(),
        last_transition_time: *now,
        observed_generation: generation,
    }
}

/// Plans claims, statuses and the datapath from `input`.
pub fn plan(input: &Input) -> Plan {
    plan_with(input, &mut Memo::for_one_plan())
}

/// Plans like `plan`, reusing from `memo` what did not change since the last plan
/// made with it: when only routes, Services, EndpointSlices, claims and the time
/// changed, only the routes a change can affect are planned again (see `incremental`).
pub fn plan_with(input: &Input, memo: &mut Memo) -> Plan {
    memo.settle();
    // The memo's copy of the last plan's snapshot follows this one (made once, then
    // changed where the snapshot changed).
    let mut copy = std::mem::take(&mut memo.snapshot);
    if let Some(mut plan) = incremental::plan(input, &copy, memo) {
        memo.incremental_plans += 1;
        copy.follow(input.snapshot);
        memo.snapshot = copy;
        let now = Time::at(input.now);
        traffic::apply(input.snapshot, &mut plan, &now);
        range_use::mark_nearly_full(&mut plan, &now);
        return plan;
    }
    let mut run = run(input, input.snapshot, memo, None, None);
    let now = Time::at(input.now);
    traffic::apply(input.snapshot, &mut run.plan, &now);
    range_use::mark_nearly_full(&mut run.plan, &now);
    if memo.keep {
        copy.follow(input.snapshot);
        memo.snapshot = copy;
        memo.pending = Some(incremental::Pending::of(
            input,
            &run.plan,
            run.on,
            run.contested,
        ));
    }
    run.plan
}

/// A plan, and what the next incremental plan needs of it.
struct Run {
    plan: Plan,
    /// The routes waiting on, or attached to, each listener (when the memo keeps).
    on: scope::OnListeners,
    /// Whether two routes contended for a datapath service.
    contested: bool,
}

/// Runs every stage on `input`; with a `scope`, for the routes in it only (`input`
/// holds those routes and their claims, `others` the claims of every other route, and
/// `world` the whole snapshot).
fn run(
    input: &Input,
    world: &Snapshot,
    memo: &mut Memo,
    scope: Option<&mut scope::Scope>,
    others: Option<&ledger::ClaimIndex>,
) -> Run {
    let snap = input.snapshot;
    let now_text = Time::at(input.now);
    let gateways = gateways::ours(input);
    let (world_same, pass) = memo.begin(world, input);
    let known = memo.recall(&snap.routes);
    let mut attachments = attach::attach_routes(snap, &known, world_same, &gateways);
    let bind::Bound { claims, released } = bind::bind(input, &gateways, &mut attachments, others);
    let fixed_attached = attachments.fixed_attached();
    let index = Index::new(snap);
    let mut routes = route_status::route_statuses(&route_status::Context {
        snap,
        attachments: &attachments,
        fixed_attached: &fixed_attached,
        claims: &claims,
        gateways: &gateways.views,
        known: &known,
        world_same,
        memo,
        pass,
        index: &index,
        now_text: &now_text,
    });
    let projected = project::project(
        &project::Context {
            snap,
            gateways: &gateways,
            attachments: &attachments,
            fixed_attached: &fixed_attached,
            claims: &claims,
            known: &known,
            ids: &routes.ids,
            index: &index,
            snat_ports: &input.snat_ports,
            capacity: &input.capacity,
        },
        &mut routes.backends,
    );
    let waiting = capacity::mark_waiting(
        &mut routes.entries,
        &projected.left,
        snap,
        &gateways.views,
        &input.capacity,
        &now_text,
    );
    let gateway_entries = gateway_status::gateway_statuses(&gateway_status::Context {
        input,
        gateways: &gateways,
        attachments: &attachments,
        fixed_attached: &fixed_attached,
        claims: &claims,
        others,
        now_text: &now_text,
    });
    let mut claims: Vec<Arc<PortClaim>> = claims.into_iter().flatten().collect();
    bind::sort_claims(&mut claims);
    let usage = gateway_status::listener_usage(&gateways.views, &claims, others);
    let on = match memo.keep {
        true => scope::OnListeners::of(&attachments, &snap.routes),
        false => scope::OnListeners::default(),
    };
    drop(attachments);
    drop(known);
    memo.remember(routes.fresh, routes.reused, pass, scope, &routes.twice);
    let cooling = claims.iter().any(|c| c.is_released());
    Run {
        plan: Plan {
            cooling,
            claims: claims.into(),
            gateways: gateway_entries,
            routes: routes.entries.into(),
            datapath: projected.datapath,
            owners: projected.owners,
            usage,
            released,
            waiting,
            used: projected.used,
            policies: Vec::new(),
        },
        on,
        contested: projected.contested,
    }
}

#[cfg(test)]
mod allowed_routes_tests;
#[cfg(test)]
mod capacity_tests;
#[cfg(test)]
mod family_tests;
#[cfg(test)]
mod overlap_tests;
#[cfg(test)]
mod quota_tests;
#[cfg(test)]
mod release_tests;
#[cfg(test)]
mod snat_tests;
#[cfg(test)]
mod test_support;
#[cfg(test)]
mod traffic_tests;
