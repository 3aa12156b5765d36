//! The memo's index of backends: the routes that name each Service, and the Services
//! and EndpointSlices under each Service name. An incremental plan follows it from one
//! snapshot to the next by a pointer walk over the lists (an unchanged object is the
//! same allocation in both), so that finding the routes a changed Service or
//! EndpointSlice affects, and handing the routes planned only the Services and slices
//! they name, costs what the change costs, not what the world holds.
//!
//! It once rebuilt four string-keyed maps over every Service and EndpointSlice when any
//! of them changed: half of a change's cost at 100k routes.

use std::sync::Arc;

use crate::model::*;

use super::FastMap;

/// A Service's identity: (namespace, name).
pub(super) type ServiceKey = (Str, Str);

/// The routes naming each Service, and the Services and EndpointSlices of each.
#[derive(Debug, Default)]
pub(super) struct BackendIndex(FastMap<ServiceKey, Named>);

/// What the index holds under one Service name. (One map of the three lists: three
/// maps, each with its own copy of every name, took 40 MB at 100,000 routes,
/// heaptrack.)
#[derive(Debug, Default)]
struct Named {
    /// The routes whose backendRefs name the Service (a route once per backendRef).
    users: Vec<Arc<Route>>,
    /// The Services of the name, in snapshot order (two files may give one twice).
    services: Vec<Arc<Service>>,
    /// The EndpointSlices of the Service, in snapshot order (the order of a route's
    /// backends follows it).
    slices: Vec<Arc<EndpointSlice>>,
}

impl Named {
    fn is_empty(&self) -> bool {
        self.users.is_empty() && self.services.is_empty() && self.slices.is_empty()
    }
}

/// Adds `item` to `list`, with room for one item at first: most names have one route,
/// one Service and one slice, and a list grown by `push` takes room for four (24 bytes
/// more for each of three lists: ~7 MB at 100,000 routes by count).
fn push<T>(list: &mut Vec<Arc<T>>, item: &Arc<T>) {
    if list.capacity() == 0 {
        list.reserve_exact(1);
    }
    list.push(Arc::clone(item));
}

/// One of the lists of [`Named`].
type List<T> = fn(&mut Named) -> &mut Vec<Arc<T>>;

fn service_key(s: &Service) -> Option<ServiceKey> {
    Some((s.metadata.ns().into(), s.metadata.name.clone()))
}

fn slice_key(s: &EndpointSlice) -> Option<ServiceKey> {
    let name = s.metadata.labels.get("kubernetes.io/service-name")?;
    Some((s.metadata.ns().into(), name.clone()))
}

/// The Services `route`'s backendRefs name (as `backends::resolve_backends` looks
/// them up).
pub(super) fn named_by(route: &Route) -> impl Iterator<Item = ServiceKey> + '_ {
    let ns = route.metadata.ns();
    let refs = route.spec.rules.iter().flat_map(|rule| &rule.backend_refs);
    refs.map(move |b| {
        let namespace = b.namespace.as_deref().unwrap_or(ns);
        (namespace.into(), b.name.clone())
    })
}

impl BackendIndex {
    /// Indexes `snap`.
    pub fn of(snap: &Snapshot) -> Self {
        // About one name per Service: sized at once, not grown by rehashing.
        let map = FastMap::with_capacity_and_hasher(snap.services.len(), Default::default());
        let mut out = BackendIndex(map);
        for r in &snap.routes {
            out.add_user(r);
        }
        for s in &snap.services {
            if let Some(k) = service_key(s) {
                push(&mut out.0.entry(k).or_default().services, s);
            }
        }
        for s in &snap.endpoint_slices {
            if let Some(k) = slice_key(s) {
                push(&mut out.0.entry(k).or_default().slices, s);
            }
        }
        out
    }

    fn add_user(&mut self, route: &Arc<Route>) {
        for k in named_by(route) {
            push(&mut self.0.entry(k).or_default().users, route);
        }
    }

    /// Follows the routes from `gone` (of the last snapshot) to `came` (of this one).
    pub fn follow_routes(&mut self, gone: &[Arc<Route>], came: &[Arc<Route>]) {
        for r in gone {
            for k in named_by(r) {
                let Some(named) = self.0.get_mut(&k) else {
                    continue;
                };
                let list = &mut named.users;
                // The index may hold an equal route parsed again (a new allocation).
                if let Some(at) = list.iter().position(|x| Arc::ptr_eq(x, r) || x == r) {
                    list.swap_remove(at);
                }
                if named.is_empty() {
                    self.0.remove(&k);
                }
            }
        }
        for r in came {
            self.add_user(r);
        }
    }

    /// Follows the Services and EndpointSlices from `old` to `new`: the Services whose
    /// object or slices changed, or `None` when where an object goes in the order of
    /// its name's objects is not known (then a full plan indexes anew).
    pub fn follow(&mut self, old: &Snapshot, new: &Snapshot) -> Option<Vec<ServiceKey>> {
        let mut changed = Vec::new();
        follow(
            &mut self.0,
            |n| &mut n.services,
            &old.services,
            &new.services,
            service_key,
            &mut changed,
        )?;
        follow(
            &mut self.0,
            |n| &mut n.slices,
            &old.endpoint_slices,
            &new.endpoint_slices,
            slice_key,
            &mut changed,
        )?;
        changed.sort_unstable();
        changed.dedup();
        Some(changed)
    }

    /// The routes naming Service `key`.
    pub fn users(&self, key: &ServiceKey) -> &[Arc<Route>] {
        self.0.get(key).map_or(&[], |n| n.users.as_slice())
    }

    /// The Services and EndpointSlices `routes` name, in snapshot order for each name
    /// (what `backends::Index` needs to resolve their backends as over the whole snapshot).
    pub fn named_by_all(
        &self,
        routes: &[Arc<Route>],
    ) -> (Vec<Arc<Service>>, Vec<Arc<EndpointSlice>>) {
        let mut keys: Vec<ServiceKey> = routes.iter().flat_map(|r| named_by(r)).collect();
        keys.sort_unstable();
        keys.dedup();
        let (mut services, mut slices) = (Vec::new(), Vec::new());
        for named in keys.iter().filter_map(|k| self.0.get(k)) {
            services.extend(named.services.iter().cloned());
            slices.extend(named.slices.iter().cloned());
        }
        (services, slices)
    }
}

/// The objects of one name that left a list, and those that came in their place.
type Swap<'a, T> = (Vec<&'a Arc<T>>, Vec<Arc<T>>);

/// Follows `map` (objects by name, in list order) from list `old` to list `new`,
/// adding to `changed` the names whose objects changed; `None` when an object comes in
/// beside others of its name and its place among them is not known.
fn follow<T: PartialEq>(
    map: &mut FastMap<ServiceKey, Named>,
    field: List<T>,
    old: &[Arc<T>],
    new: &[Arc<T>],
    key: impl Fn(&T) -> Option<ServiceKey>,
    changed: &mut Vec<ServiceKey>,
) -> Option<()> {
    // Equal objects are the same: the Kubernetes source parses every object again for
    // each plan (`Arc`'s `==` compares pointers first).
    let (head, tail) = super::changes::common_ends(old, new, |a, b| a == b);
    let (gone, came) = (&old[head..old.len() - tail], &new[head..new.len() - tail]);
    if gone.len() == came.len() {
        // Objects changed in place (the usual case, also for changes far apart): each
        // new one takes its old one's place.
        for (a, b) in gone.iter().zip(came) {
            if a == b {
                continue;
            }
            let (ka, kb) = (key(a), key(b));
            match (ka, kb) {
                (Some(ka), Some(kb)) if ka == kb => {
                    let list = field(map.get_mut(&ka)?);
                    let at = list.iter().position(|x| x == a)?;
                    list[at] = Arc::clone(b);
                    changed.push(ka);
                }
                (ka, kb) => {
                    if let Some(ka) = ka {
                        remove(map, field, &ka, a)?;
                        changed.push(ka);
                    }
                    if let Some(kb) = kb {
                        insert(map, field, &kb, std::slice::from_ref(b))?;
                        changed.push(kb);
                    }
                }
            }
        }
        return Some(());
    }
    // Objects came or went: by name, those of the window left are one run of their
    // name's list (the list is in snapshot order), and those come take its place.
    let mut by: FastMap<ServiceKey, Swap<'_, T>> = FastMap::default();
    for a in gone {
        if let Some(k) = key(a) {
            by.entry(k).or_default().0.push(a);
        }
    }
    for b in came {
        if let Some(k) = key(b) {
            by.entry(k).or_default().1.push(Arc::clone(b));
        }
    }
    for (k, (left, come)) in by {
        let same = left.len() == come.len() && left.iter().zip(&come).all(|(a, b)| *a == b);
        if same {
            continue;
        }
        let named = map.entry(k.clone()).or_default();
        let list = field(named);
        let at = match left.first() {
            Some(first) => list.iter().position(|x| x == *first)?,
            None if list.is_empty() => 0,
            None => return None,
        };
        let run = list.get(at..at + left.len())?;
        if !run.iter().zip(&left).all(|(x, a)| x == *a) {
            return None;
        }
        list.splice(at..at + left.len(), come);
        if named.is_empty() {
            map.remove(&k);
        }
        changed.push(k);
    }
    Some(())
}

/// Removes object `a` from the list of `k`.
fn remove<T: PartialEq>(
    map: &mut FastMap<ServiceKey, Named>,
    field: List<T>,
    k: &ServiceKey,
    a: &Arc<T>,
) -> Option<()> {
    let named = map.get_mut(k)?;
    let list = field(named);
    let at = list.iter().position(|x| x == a)?;
    list.remove(at);
    if named.is_empty() {
        map.remove(k);
    }
    Some(())
}

/// Adds `items` as the list of `k`, which must have none (else their place among its
/// objects is not known).
fn insert<T>(
    map: &mut FastMap<ServiceKey, Named>,
    field: List<T>,
    k: &ServiceKey,
    items: &[Arc<T>],
) -> Option<()> {
    let list = field(map.entry(k.clone()).or_default());
    if !list.is_empty() {
        return None;
    }
    list.extend(items.iter().cloned());
    Some(())
}
