//! The fourth stage: the status of every route with a parent of ours (shared with the
//! last plan when the route, the world and its decisions are unchanged), and the
//! backends of each route planned.

use std::{
    collections::BTreeMap,
    sync::{atomic::Ordering::Relaxed, Arc},
};

use crate::model::*;

use super::Reason;
use super::{
    attach::{Attach, Attachment, Attachments},
    backends::{resolve_backends, Index, Resolved},
    condition,
    gateway_status::serves,
    gateways::GatewayView,
    memo::{Memo, Remembered},
    overlaps,
    status::*,
    RouteEntry, RouteKey, ServedOn,
};

/// What the route stage reads.
pub(super) struct Context<'p, 'a> {
    pub snap: &'a Snapshot,
    pub attachments: &'p Attachments<'a>,
    /// The attachments to each fixed listener, by (Gateway, listener), oldest first.
    pub fixed_attached: &'p BTreeMap<(usize, usize), Vec<usize>>,
    pub claims: &'p [Option<Arc<PortClaim>>],
    pub gateways: &'p [GatewayView<'a>],
    /// What the memo remembers of each route, by route index.
    pub known: &'p [Option<&'a Remembered>],
    /// Whether every object but the routes is as in the last plan.
    pub world_same: bool,
    pub memo: &'a Memo,
    /// This plan's number.
    pub pass: u64,
    pub index: &'p Index<'a>,
    pub now_text: &'p Time,
}

/// The route statuses of a plan.
pub(super) struct Planned {
    /// One entry per route identity with a parent of ours, sorted by kind, namespace
    /// and name.
    pub entries: Vec<Arc<RouteEntry>>,
    /// Backends of the routes planned, by route index.
    pub backends: Vec<Option<Arc<Resolved>>>,
    /// The identity of the routes planned, by route index (remembered when the memo
    /// keeps): the plan's owners of datapath services share it.
    pub ids: Vec<Option<Arc<RouteKey>>>,
    /// Routes to remember from this plan (added to the memo once nothing borrows it).
    pub fresh: Vec<Remembered>,
    /// Routes remembered that this plan reused.
    pub reused: usize,
    /// Keys of routes given twice (not remembered).
    pub twice: Vec<RouteKey>,
}

/// Builds the status of every route with a parent of ours, oldest route first.
pub(super) fn route_statuses(cx: &Context) -> Planned {
    let snap = cx.snap;
    let mut out = Planned {
        // One entry per route with a parent of ours.
        entries: Vec::with_capacity(snap.routes.len()),
        backends: vec![None; snap.routes.len()],
        ids: vec![None; snap.routes.len()],
        fresh: Vec::new(),
        reused: 0,
        twice: Vec::new(),
    };
    for &ri in &cx.attachments.order {
        let at = cx.attachments.of[ri].clone();
        if at.is_empty() {
            continue;
        }
        // A route given twice has one entry with the parents of both: not remembered.
        let unique = !cx.attachments.given_twice[ri];
        if !unique {
            out.twice.push(RouteKey::of(&snap.routes[ri]));
        }
        if let Some(old) = cx.known[ri] {
            let same = unique
                && cx.world_same
                && old.decisions.len() == at.len()
                && at
                    .clone()
                    .zip(&old.decisions)
                    .all(|(ai, d)| cx.decision(ai) == *d);
            if same {
                old.pass.store(cx.pass, Relaxed);
                out.reused += 1;
                out.entries.push(Arc::clone(&old.entry));
                out.backends[ri] = Some(Arc::clone(&old.backends));
                out.ids[ri] = Some(Arc::clone(&old.id));
                continue;
            }
        }
        let (entry, resolved, remembered) = cx.plan_route(ri, unique);
        out.ids[ri] = remembered.as_ref().map(|r| Arc::clone(&r.id));
        out.fresh.extend(remembered);
        out.backends[ri] = Some(resolved);
        out.entries.push(entry);
    }
    merge_twice(&mut out.entries);
    out
}

impl Context<'_, '_> {
    /// What a status says beyond the route and the other objects, for attachment `ai`.
    fn decision(&self, ai: usize) -> Decision {
        let a: &Attachment = &self.attachments.list[ai];
        let shadowed = match &*a.attach {
            Attach::Listeners { fixed, .. } => fixed
                .iter()
                .copied()
                .filter(|&li| {
                    self.fixed_attached.get(&(a.gw, li)).and_then(|l| l.first()) != Some(&ai)
                })
                .collect(),
            _ => Vec::new(),
        };
        Decision {
            port: a
                .claim
                .and_then(|ci| self.claims[ci].as_ref())
                .map(|c| c.spec.port),
            failure: a.failure.clone(),
            shadowed,
        }
    }

    /// The listeners attachment `ai` is served on: the range listener of its claim, and
    /// each fixed listener whose port no older Gateway took (where the route may still
    /// be shadowed by an older one).
    fn served_on(&self, ai: usize, d: &Decision) -> Vec<ServedOn> {
        let a = &self.attachments.list[ai];
        let gw = &self.gateways[a.gw];
        let mut out = Vec::new();
        let claim = a.claim.and_then(|ci| self.claims[ci].as_ref());
        if let (Some(c), Some(port)) = (claim, d.port) {
            out.push(ServedOn {
                listener: c.spec.listener.as_str().into(),
                port,
            });
        }
        if let Attach::Listeners { fixed, .. } = &*a.attach {
            out.extend(
                fixed
                    .iter()
                    .map(|&li| &gw.listeners[li])
                    .filter(|l| l.yielded.is_empty())
                    .map(|l| ServedOn {
                        listener: l.spec.name.as_str().into(),
                        port: l.spec.port,
                    }),
            );
        }
        // Kept with the route's status until it changes: no spare room.
        out.shrink_to_fit();
        out
    }

    /// Builds the status of route `ri` anew, with its backends, and what to remember
    /// of it (when `unique` and the memo keeps).
    fn plan_route(
        &self,
        ri: usize,
        unique: bool,
    ) -> (Arc<RouteEntry>, Arc<Resolved>, Option<Remembered>) {
        let snap = self.snap;
        let at = self.attachments.of[ri].clone();
        let route = &snap.routes[ri];
        let m = &route.metadata;
        let resolved = Arc::new(resolve_backends(route, snap, self.index));
        let decisions: Vec<Decision> = at.clone().map(|ai| self.decision(ai)).collect();
        let mut parents: Vec<RouteParentStatus> = at
            .clone()
            .zip(&decisions)
            .map(|(ai, d)| {
                let a = &self.attachments.list[ai];
                let gw = &self.gateways[a.gw];
                let name = (gw.spec.metadata.ns(), gw.spec.metadata.name.as_str());
                let refs = resolved.status(name, gw.addresses.families());
                parent_status(a, self.gateways, d, refs, self.now_text)
            })
            .collect();
        // The same route as planned last time, or an earlier version of it.
        let earlier = self.known[ri].or_else(|| self.memo.earlier(route));
        if let Some(old) = earlier {
            carry_parent_times(&mut parents, &old.entry.status.parents);
        }
        let served_on = at
            .clone()
            .zip(&decisions)
            .map(|(ai, d)| self.served_on(ai, d))
            .collect();
        let entry = Arc::new(RouteEntry {
            kind: route.kind,
            namespace: m.ns().into(),
            name: m.name.clone(),
            status: RouteStatus { parents },
            created: route.created().cloned(),
            served_on,
        });
        let remembered = (unique && self.memo.keep).then(|| Remembered {
            id: Arc::new(RouteKey::of(route)),
            route: Arc::clone(route),
            created: self.attachments.created[ri],
            attaches: at
                .clone()
                .map(|ai| {
                    let a = &self.attachments.list[ai];
                    (a.parent_index, a.gw, a.attach.as_ref().clone())
                })
                .collect(),
            decisions,
            entry: Arc::clone(&entry),
            backends: Arc::clone(&resolved),
            pass: self.pass.into(),
        });
        (entry, resolved, remembered)
    }
}

/// Sorts route entries by kind, namespace and name; the same route twice in the
/// snapshot has one entry with the parents of both.
fn merge_twice(routes: &mut Vec<Arc<RouteEntry>>) {
    routes.sort_by(|a, b| a.key().cmp(&b.key()));
    routes.dedup_by(|later, first| {
        let same = (later.kind == first.kind)
            && later.namespace == first.namespace
            && later.name == first.name;
        if same {
            let later = Arc::make_mut(later);
            let parents = std::mem::take(&mut later.status.parents);
            let served_on = std::mem::take(&mut later.served_on);
            let first = Arc::make_mut(first);
            first.status.parents.extend(parents);
            first.served_on.extend(served_on);
        }
        same
    });
}

/// What a route's status for one parent says beyond the route and the other objects.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Decision {
    /// The port assigned.
    port: Option<u16>,
    /// Why a range attachment got no port.
    failure: Option<(Reason, String)>,
    /// Fixed listeners where an older route gets the traffic.
    shadowed: Vec<usize>,
}
/// A route's status for the parent of attachment `a`.
fn parent_status(
    a: &Attachment,
    gateways: &[GatewayView],
    decision: &Decision,
    (refs_ok, refs_reason, refs_message): (bool, Reason, Text),
    now_text: &Time,
) -> RouteParentStatus {
    let gw = &gateways[a.gw];
    let generation = a.route.metadata.generation;
    let mut parent_ref = a.parent.clone();
    let accepted = match &*a.attach {
        Attach::Refused { reason, message } => condition(
            "Accepted",
            false,
            *reason,
            message.clone(),
            now_text,
            generation,
        ),
        Attach::Frozen { message } => condition(
            "Accepted",
            false,
            Reason::Pending,
            message.clone(),
            now_text,
            generation,
        ),
        Attach::Listeners { fixed, ranges, .. } => {
            let names = |ls: &[usize]| {
                ls.iter()
                    .map(|&i| gw.listeners[i].spec.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            // Fixed listeners whose port an older Gateway serves give the route no port,
            // as a range without a free port does.
            let (open, taken): (Vec<usize>, Vec<usize>) = fixed
                .iter()
                .partition(|&&li| gw.listeners[li].yielded.is_empty());
            let mut parts = Vec::new();
            let mut failure = None;
            if let Some(port) = decision.port {
                parts.push(format!("assigned port {port}"));
                parent_ref.port = Some(port);
            } else if !ranges.is_empty() {
                let (r, m) = decision
                    .failure
                    .clone()
                    .unwrap_or((Reason::PortRangeExhausted, "no port".to_string()));
                failure = Some(r);
                parts.push(m);
            }
            if !open.is_empty() {
                parts.push(format!("attached to listener {}", names(&open)));
                // GEP-2644: every route is accepted; only the oldest gets traffic.
                let shadowed: Vec<usize> = decision
                    .shadowed
                    .iter()
                    .copied()
                    .filter(|li| open.contains(li))
                    .collect();
                if !shadowed.is_empty() {
                    parts.push(format!(
                        "an older route gets the traffic of listener {}",
                        names(&shadowed)
                    ));
                }
            }
            for &li in &taken {
                failure.get_or_insert(Reason::PortUnavailable);
                parts.push(overlaps::taken_message(&gw.listeners[li]));
            }
            let ok = serves(gw, fixed, decision.port.is_some());
            let reason = match ok {
                true => Reason::Accepted,
                false => failure.unwrap_or(Reason::PortUnavailable),
            };
            let message = match parts.len() {
                1 => parts.pop().unwrap_or_default(),
                _ => parts.join("; "),
            };
            condition("Accepted", ok, reason, message, now_text, generation)
        }
    };
    let resolved = condition(
        "ResolvedRefs",
        refs_ok,
        refs_reason,
        refs_message,
        now_text,
        generation,
    );
    RouteParentStatus {
        parent_ref,
        controller_name: Text::const_new(CONTROLLER_NAME),
        conditions: vec![accepted, resolved],
    }
}

/// Keeps the condition times of `old` parents in `new` ones of the same parent;
/// returns whether that changed any.
pub fn carry_parent_times(new: &mut [RouteParentStatus], old: &[RouteParentStatus]) -> bool {
    let mut changed = false;
    for p in new {
        let same_parent = |op: &&RouteParentStatus| {
            op.parent_ref.name == p.parent_ref.name
                && op.parent_ref.namespace == p.parent_ref.namespace
                && op.parent_ref.section_name == p.parent_ref.section_name
        };
        if let Some(op) = old.iter().find(same_parent) {
            changed |= carry_times(&mut p.conditions, &op.conditions);
        }
    }
    changed
}
