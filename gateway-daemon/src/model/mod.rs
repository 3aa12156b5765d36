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
mod condition;
mod core_kinds;
mod desired;
mod gateway;
mod health;
mod meta;
mod protocol;
mod route;
mod time;
mod traffic;

pub use berth::*;
pub use condition::Condition;
pub use core_kinds::*;
pub use desired::*;
pub use gateway::*;
pub use health::*;
pub use meta::*;
pub use protocol::Protocol;
pub use route::*;
pub use time::Time;
pub use traffic::*;

/// A name, namespace, protocol or address of an object: kept inline up to 24 bytes,
/// as nearly all are. At 100,000 routes the objects held millions of short strings,
/// each `String` an allocation of its own.
pub type Str = compact_str::CompactString;

/// A list read with room for its items only. (Read from a parser's events rather than
/// from a value, serde's lists know no length and one of a single item holds four:
/// 150 MB more at 100,000 routes.)
pub(crate) fn exact_list<'de, D, T>(d: D) -> Result<Vec<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: serde::Deserialize<'de>,
{
    struct Exact<T>(std::marker::PhantomData<T>);
    impl<'de, T: serde::Deserialize<'de>> serde::de::Visitor<'de> for Exact<T> {
        type Value = Vec<T>;

        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a sequence")
        }

        fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<T>, A::Error> {
            let Some(first) = seq.next_element()? else {
                return Ok(Vec::new());
            };
            let mut list = Vec::with_capacity(seq.size_hint().unwrap_or(0).saturating_add(1));
            list.push(first);
            while let Some(item) = seq.next_element()? {
                list.push(item);
            }
            list.shrink_to_fit();
            Ok(list)
        }
    }
    d.deserialize_seq(Exact(std::marker::PhantomData))
}

/// The lengths of the longest common head and tail of `a` and `b` (not overlapping),
/// by `same`.
pub fn common_ends<T>(a: &[T], b: &[T], same: impl Fn(&T, &T) -> bool) -> (usize, usize) {
    let head = a.iter().zip(b).take_while(|(x, y)| same(x, y)).count();
    let tail = a[head..]
        .iter()
        .rev()
        .zip(b[head..].iter().rev())
        .take_while(|(x, y)| same(x, y))
        .count();
    (head, tail)
}

/// Claims by namespace, then name, each shared: a persistent vector, so that the store,
/// a plan and what is published share all but the claims a change touched (a copy of
/// 100,000 claims, and its drop, cost milliseconds per change).
pub type ClaimList = imbl::Vector<std::sync::Arc<PortClaim>>;

/// The lengths of the longest common head and tail of `a` and `b` (not overlapping),
/// by `same` (reflexive), for persistent vectors. Leaves the two share (the same
/// memory: a vector made from the other by a few changes shares all but the leaves
/// they touched) are skipped whole; element by element, a walk over 100,000 claims
/// took ~0.3 ms, five times a change.
pub fn common_ends_of<T: Clone>(
    a: &imbl::Vector<T>,
    b: &imbl::Vector<T>,
    same: impl Fn(&T, &T) -> bool,
) -> (usize, usize) {
    if a.ptr_eq(b) {
        return (a.len(), 0);
    }
    let most = a.len().min(b.len());
    let shared = |x: &[T], y: &[T]| std::ptr::eq(x, y);
    // Whole shared leaves from the front, then element by element.
    let mut head = 0;
    for (x, y) in a.leaves().zip(b.leaves()) {
        if !shared(x, y) {
            break;
        }
        head += x.len();
    }
    head += a
        .focus()
        .narrow(head..)
        .into_iter()
        .zip(b.focus().narrow(head..))
        .take_while(|(x, y)| same(x, y))
        .count();
    // The same from the back, never into the head.
    let mut tail = 0;
    for (x, y) in a.leaves().rev().zip(b.leaves().rev()) {
        if !shared(x, y) || head + tail + x.len() > most {
            break;
        }
        tail += x.len();
    }
    tail += a
        .focus()
        .narrow(head..a.len() - tail)
        .into_iter()
        .rev()
        .zip(b.focus().narrow(head..b.len() - tail).into_iter().rev())
        .take_while(|(x, y)| same(x, y))
        .count();
    (head, tail)
}

/// Makes `copy` hold the allocations `to` holds, replacing only what lies between
/// their common head and tail of shared allocations (a change of one file touches its
/// objects' counts, not 100,000 of them).
pub fn follow_list<T>(copy: &mut Vec<std::sync::Arc<T>>, to: &[std::sync::Arc<T>]) {
    let (head, tail) = common_ends(copy, to, std::sync::Arc::ptr_eq);
    let end = copy.len() - tail;
    copy.splice(head..end, to[head..to.len() - tail].iter().cloned());
}

impl Snapshot {
    /// Makes this copy hold what `to` holds (`follow_list` for each kind).
    pub fn follow(&mut self, to: &Snapshot) {
        // Destructured: a new kind of object is a compile error here.
        let Snapshot {
            gateway_classes,
            gateways,
            routes,
            reference_grants,
            services,
            endpoint_slices,
            namespaces,
            gateway_configs,
            backend_health_policies,
            route_traffic_policies,
        } = self;
        follow_list(gateway_classes, &to.gateway_classes);
        follow_list(gateways, &to.gateways);
        follow_list(routes, &to.routes);
        follow_list(reference_grants, &to.reference_grants);
        follow_list(services, &to.services);
        follow_list(endpoint_slices, &to.endpoint_slices);
        follow_list(namespaces, &to.namespaces);
        follow_list(gateway_configs, &to.gateway_configs);
        follow_list(backend_health_policies, &to.backend_health_policies);
        follow_list(route_traffic_policies, &to.route_traffic_policies);
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
    /// BackendHealthPolicies. Not the planner's: their checks' results reach it as the
    /// endpoints' readiness (`health`).
    pub backend_health_policies: Vec<std::sync::Arc<BackendHealthPolicy>>,
    /// RouteTrafficPolicies. Read after planning, into the datapath's per-service
    /// settings of the routes they target (`planner::traffic`).
    pub route_traffic_policies: Vec<std::sync::Arc<RouteTrafficPolicy>>,
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
    /// BackendHealthPolicy.
    BackendHealthPolicy(std::sync::Arc<BackendHealthPolicy>),
    /// RouteTrafficPolicy.
    RouteTrafficPolicy(std::sync::Arc<RouteTrafficPolicy>),
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
            Object::BackendHealthPolicy(o) => self.backend_health_policies.push(o),
            Object::RouteTrafficPolicy(o) => self.route_traffic_policies.push(o),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn common_ends_of_persistent_vectors_skip_shared_leaves_and_match_a_plain_walk() {
        let plain = |a: &imbl::Vector<Arc<u32>>, b: &imbl::Vector<Arc<u32>>| {
            let (a, b): (Vec<_>, Vec<_>) =
                (a.iter().cloned().collect(), b.iter().cloned().collect());
            common_ends(&a, &b, Arc::ptr_eq)
        };
        let base: imbl::Vector<Arc<u32>> = (0..5000).map(Arc::new).collect();
        let mut cases = vec![
            (base.clone(), base.clone()),
            (base.clone(), imbl::Vector::new()),
        ];
        for at in [0, 1, 63, 64, 65, 2500, 4999] {
            let mut inserted = base.clone();
            inserted.insert(at, Arc::new(9999));
            let mut removed = base.clone();
            removed.remove(at);
            let mut replaced = base.clone();
            replaced.set(at, Arc::new(at as u32));
            cases.extend([
                (base.clone(), inserted),
                (base.clone(), removed),
                (base.clone(), replaced),
            ]);
        }
        // Equal contents, no shared memory: element by element.
        cases.push((base.clone(), base.iter().cloned().collect()));
        let mut both = base.clone();
        both.remove(10);
        both.insert(4000, Arc::new(1));
        cases.push((base.clone(), both));
        for (a, b) in &cases {
            let want = plain(a, b);
            assert_eq!(common_ends_of(a, b, Arc::ptr_eq), want);
            assert_eq!(common_ends_of(b, a, Arc::ptr_eq), want);
            assert!(want.0 + want.1 <= a.len().min(b.len()) || a.ptr_eq(b));
        }
    }

    #[test]
    fn a_followed_copy_holds_the_new_allocations_and_keeps_the_shared_ones() {
        let old: Vec<Arc<u32>> = (0..6).map(Arc::new).collect();
        let mut copy = old.clone();
        // 2 replaced, 7 added after 3, 4 removed.
        let new: Vec<Arc<u32>> = vec![
            old[0].clone(),
            old[1].clone(),
            Arc::new(2),
            old[3].clone(),
            Arc::new(7),
            old[5].clone(),
        ];
        follow_list(&mut copy, &new);
        assert_eq!(copy.len(), new.len());
        assert!(copy.iter().zip(&new).all(|(a, b)| Arc::ptr_eq(a, b)));
        // The copy let go of what left: only the caller's `old` holds 2 and 4.
        assert_eq!(Arc::strong_count(&old[2]), 1);
        assert_eq!(Arc::strong_count(&old[4]), 1);
        // From empty, and to empty.
        let mut empty = Vec::new();
        follow_list(&mut empty, &new);
        assert!(empty.iter().zip(&new).all(|(a, b)| Arc::ptr_eq(a, b)));
        follow_list(&mut empty, &[]);
        assert!(empty.is_empty());
    }
}
