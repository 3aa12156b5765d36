//! Replies (backend → client) matched to their flow: through the reply index to the
//! flow's forward entry, under the reply's own tuple, or by Maglev for a flow without
//! an entry; a reply that did not come from its backend is found out (`checked`).
//! And `find`, the lookup of the paths that do not cache next hops.

use core::mem::MaybeUninit;

use gateway_common::{
    Addr, Counter, Flow, FlowKey, ReplyIndex, ServiceId, ServiceKey, FLOW_REPLY_ENTRY, NAT_DST,
    NAT_SRC, REPLY_CANDIDATES, REPLY_INDEX_SNAT, SERVICE_SNAT,
};

use super::{
    balance::balance,
    entry::{backend_serves, direct, insert, service_unchanged, tuple, Direct},
    flood::may_record,
    Found, Lookup, NoEntry, OwnEntry,
};
use crate::{
    family::Family,
    fwd::coarse_now,
    maps::{count, opaque, Pending, Roles},
    origin::Origin,
};

/// `found`, unless it is a reply (an entry of kind `NAT_SRC`, found under the packet's
/// tuple `t`) that did not come from where its backend is: then `reply_spoofed`.
#[inline(always)]
pub(super) fn checked<A: Family>(
    found: Lookup<A>,
    t: &FlowKey<A>,
    origin: &Origin,
) -> Result<Lookup<A>, Counter> {
    if found.found == Found::Tracked {
        // SAFETY: a valid map value pointer for the duration of this program run.
        let f = unsafe { &*found.entry };
        if f.kind == NAT_SRC && !origin.is_backend(f.backend, t.src) {
            return Err(Counter::ReplySpoofed);
        }
    }
    Ok(found)
}

/// A reply (backend → client): the forward entry of its flow, tried for each service
/// the reply index lists for the backend endpoint; its translation (source back to the
/// service's address and port) is written to `slot` as a `NAT_SRC` flow. The entry
/// under the reply's own tuple as `own` says (`Found::Tracked`): first where a SNAT
/// service uses the endpoint, else after the index. Without either, `no_entry` says
/// whether the reply is matched by Maglev (`maglev_match`); the entries come first, so
/// Maglev never takes a reply of a flow that has one (a SNAT flow's reply through the
/// kernel, whose endpoint also serves a router-mode service, was found so).
#[inline(always)]
pub(super) fn reply_of<A: Family>(
    t: &FlowKey<A>,
    own: OwnEntry,
    no_entry: NoEntry,
    origin: &Origin,
    slot: &mut MaybeUninit<Flow<A>>,
) -> Option<Lookup<A>> {
    let endpoint = ServiceKey {
        addr: t.src,
        port: t.sport,
        proto: t.proto,
        pad: 0,
    };
    // SAFETY: the value is only read during this run.
    let Some(index) = (unsafe { A::reply_index().get(endpoint) }) else {
        return own_reply(t, own, origin);
    };
    let snat = index.flags & REPLY_INDEX_SNAT != 0;
    if snat {
        if let Some(found) = own_reply(t, own, origin) {
            return Some(found);
        }
    }
    // The candidates whose forward tuple holds another flow (another backend's, or a
    // SNAT flow's): Maglev must not take it for this reply's.
    let mut taken = 0u32;
    for i in 0..REPLY_CANDIDATES as usize {
        if i as u32 >= index.count as u32 {
            break;
        }
        let svc = &index.services[i];
        let fwd = tuple((t.dst, t.dport), (svc.addr, svc.port), t.proto);
        let Some(flow) = A::conntrack().get_ptr_mut(fwd) else {
            continue;
        };
        // SAFETY: a valid map value pointer for the duration of this program run.
        let f = unsafe { &*flow };
        if f.kind != NAT_DST || f.is_snat() || f.nat_addr != t.src || f.nat_port != t.sport {
            taken |= 1 << i;
            continue;
        }
        if !(backend_serves(&fwd, f) || service_unchanged(&fwd, f)) {
            count(Counter::CtStaleService);
            // Not for Maglev either: its flow's service went. (`find` still looks
            // under the tuple itself, as before it matched replies by Maglev.)
            return if own == OwnEntry::Any {
                own_reply(t, own, origin)
            } else {
                None
            };
        }
        if !origin.is_backend(f.backend, t.src) {
            return Some(Lookup::only(Found::Spoofed));
        }
        slot.write(reply_flow(svc, f.backend, f.service));
        return Some(Lookup::of(Found::Reply, flow));
    }
    if !snat {
        if let Some(found) = own_reply(t, own, origin) {
            return Some(found);
        }
    }
    let found = match no_entry {
        // Through `opaque`: each of the first loop's outcomes left `taken` another
        // known value, and the verifier checked the Maglev loop once per value
        // (docs/benchmarks.md, "Issue 33's end").
        NoEntry::Maglev => maglev_match(t, index, opaque(u64::from(taken)) as u32, origin, slot),
        NoEntry::Leave => None,
    };
    if found.is_none() && own == OwnEntry::Xdp {
        count(Counter::ReplyUntracked);
    }
    found
}

/// `own_entry`, unless it is a reply entry (`NAT_SRC`) and the packet did not come
/// from where its backend is: then `Found::Spoofed`.
#[inline(always)]
fn own_reply<A: Family>(t: &FlowKey<A>, own: OwnEntry, origin: &Origin) -> Option<Lookup<A>> {
    let found = own_entry(t, own)?;
    Some(checked(found, t, origin).unwrap_or(Lookup::only(Found::Spoofed)))
}

/// The entry under the reply's own tuple `t`, as `own` says (see `reply_of`).
#[inline(always)]
fn own_entry<A: Family>(t: &FlowKey<A>, own: OwnEntry) -> Option<Lookup<A>> {
    match own {
        OwnEntry::Looked => None,
        OwnEntry::Xdp => tracked(t),
        OwnEntry::Any => A::conntrack()
            .get_ptr_mut(t)
            .map(|flow| Lookup::of(Found::Tracked, flow)),
    }
}

/// A reply with no entry, from an endpoint with reply index `index`: for each
/// router-mode candidate service (but the `taken` ones), its Maglev table is asked for
/// the flow's forward tuple (client → service). If it maps the tuple to the backend the
/// reply came from, the reply is its flow's (begun on another gateway behind the same
/// ECMP route, or its entry evicted): its translation is written to `slot`, and its
/// flow recorded (`record_matched`). Otherwise (the backend set changed since the flow
/// began, or the packet is not a reply through the gateway) it is not translated.
///
/// The forward tuple and flow are built in this CPU's pending slot (not the stack:
/// `berth_v6` has 8 bytes to spare).
#[inline(always)]
fn maglev_match<A: Family>(
    t: &FlowKey<A>,
    index: &ReplyIndex<A>,
    taken: u32,
    origin: &Origin,
    slot: &mut MaybeUninit<Flow<A>>,
) -> Option<Lookup<A>> {
    let pending = A::pending()?;
    for i in 0..REPLY_CANDIDATES as usize {
        if i as u32 >= index.count as u32 {
            break;
        }
        if taken & (1 << i) != 0 {
            continue;
        }
        // In the map (a copy of an IPv6 key would take `berth_v6` past its stack).
        let svc = &index.services[i];
        // SAFETY: the value is copied out at once. (Read in place instead, LLVM stopped
        // inlining the TC program's body and took `berth_v6` to 592 bytes of stack.)
        let service = match unsafe { A::services().get(svc) } {
            Some(service) if service.flags & SERVICE_SNAT == 0 => *service,
            _ => continue,
        };
        pending.key = tuple((t.dst, t.dport), (svc.addr, svc.port), t.proto);
        // SAFETY: `MaybeUninit<Flow>` has `Flow`'s layout; `balance` writes a whole flow.
        let out = unsafe { &mut *(&raw mut pending.flow).cast::<MaybeUninit<Flow<A>>>() };
        if balance(&pending.key, &service, out, None).is_err() {
            continue;
        }
        let flow = &mut pending.flow;
        if flow.nat_addr != t.src || flow.nat_port != t.sport {
            continue;
        }
        // Checked before the flow is recorded: a forgery records nothing.
        if !origin.is_backend(flow.backend, t.src) {
            return Some(Lookup::only(Found::Spoofed));
        }
        let reply = slot.write(reply_flow(svc, flow.backend, flow.service));
        count(Counter::CtMissReply);
        record_matched(t, reply, pending);
        return Some(Lookup::only(Found::Matched));
    }
    None
}

/// Records the flow of a reply `t` that Maglev matched (translation `reply`), as
/// `record` records a new flow, but not counted as one: its forward entry
/// (`pending`'s key and flow, as `balance` made them) and, where its service needs one,
/// a reply entry under the reply's own tuple. Over the flood guard's limit nothing is
/// recorded: a SYN flood makes the backends send SYN-ACKs, which must not evict the
/// established flows either.
#[inline(always)]
fn record_matched<A: Family>(t: &FlowKey<A>, reply: &Flow<A>, pending: &mut Pending<A>) {
    let now = coarse_now();
    if !may_record(now) {
        return;
    }
    pending.flow.seen = now;
    insert(&pending.key, &pending.flow, 0);
    if pending.flow.flags & FLOW_REPLY_ENTRY != 0 {
        insert(t, reply, 0);
    }
}

/// The entry under the packet's own tuple, as a lookup answer, if it applies.
#[inline(always)]
fn tracked<A: Family>(t: &FlowKey<A>) -> Option<Lookup<A>> {
    match direct(t) {
        Direct::Hit(flow) => Some(Lookup::of(Found::Tracked, flow)),
        _ => None,
    }
}

/// The translation of a router-mode reply of service `svc`: its source becomes the
/// service's address and port.
#[inline(always)]
fn reply_flow<A: Addr>(svc: &ServiceKey<A>, backend: u32, service: ServiceId) -> Flow<A> {
    Flow::entry(NAT_SRC, (svc.addr, svc.port), backend, service)
}

/// The translation the conntrack holds for tuple `key` (a copy), for the paths that
/// do not cache next hops (ICMP errors, TC): a router reply's translation found through
/// its flow's forward entry (or, with `NoEntry::Maglev`, matched by Maglev and
/// recorded), or the entry under the tuple itself. Whether it still applies is the
/// caller's to check (`applies`).
///
/// A reply (an ICMP error about a forward packet) that did not come from where its
/// backend is (`origin`) is `Err(Spoofed)`, to be dropped.
#[inline(always)]
pub fn find<A: Family>(
    key: &FlowKey<A>,
    no_entry: NoEntry,
    origin: &Origin,
) -> Result<Option<Flow<A>>, Spoofed> {
    let mut slot = MaybeUninit::uninit();
    let found = if Roles::of(key.src, key.dst).from_backend {
        reply_of(key, OwnEntry::Any, no_entry, origin, &mut slot)
    } else {
        own_reply(key, OwnEntry::Any, origin)
    };
    let Some(found) = found else {
        return Ok(None);
    };
    match found.found {
        Found::Spoofed => Err(Spoofed),
        // SAFETY: a valid map value pointer for the duration of this program run,
        // copied out at once.
        Found::Tracked => Ok(Some(unsafe { *found.entry })),
        // SAFETY: `reply_of` wrote the slot when it found a reply's translation.
        _ => Ok(Some(unsafe { slot.assume_init() })),
    }
}

/// A packet `find` found to be a forged reply (`reply_spoofed`).
pub struct Spoofed;
