//! Flow lookup and backend selection: the conntrack hit path and weighted Maglev.

use core::mem::MaybeUninit;

use aya_ebpf::bindings::BPF_NOEXIST;
use gateway_common::{
    config, flow_hash, proto, snat_port_slot, Addr, Backend, Counter, Flow, FlowKey, ReplyIndex,
    Service, ServiceId, ServiceKey, BACKEND_LIVE, FLOW_AFFINITY, FLOW_REPLY_ENTRY, NAT_DST,
    NAT_MASQ, NAT_SRC, NEXT_HOP_REFRESH, REPLY_CANDIDATES, REPLY_INDEX_SNAT, SERVICE_REPLY_ENTRY,
    SERVICE_SNAT, SNAT_PORT_TRIES,
};

use crate::{
    affinity,
    family::Family,
    fwd::coarse_now,
    maps::{
        count, is_gateway_address, Pending, Roles, BACKENDS, CONFIG, FLOOD, MAGLEV, SNAT_PORTS,
    },
    origin::Origin,
    packet::{TCP_ACK, TCP_SYN},
};

/// What the conntrack says about a packet.
///
/// (Flows are returned through a caller-owned slot, and the entry as a pointer beside
/// this kind, rather than as enum payloads: an enum whose variants differ in size is
/// copied with undefined bytes, which LLVM may then read from registers the verifier
/// considers uninitialised.)
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Found {
    /// Not ours.
    Miss,
    /// A tracked flow: `Lookup::entry` is its entry in the map, updated in place
    /// (next-hop cache).
    Tracked,
    /// A router-mode reply: `Lookup::entry` is its flow's forward entry (found through
    /// the reply index; the reply's next hop is cached in its `next_hop`). The caller's
    /// slot holds the reply's translation as a `NAT_SRC` flow.
    Reply,
    /// The first packet of a flow: the new flow is in the caller's slot, to be recorded
    /// with `record` once forwarded (so the entry starts with its next hop cached).
    New,
    /// A router-mode reply whose flow had no entry, matched by Maglev (`reply_of`): its
    /// translation is in the caller's slot; its flow was recorded (unless the flood
    /// guard refused), without a next hop cached.
    Matched,
    /// A reply (or ICMP error) of a flow that did not come from where its backend is
    /// (`origin.rs`): to be dropped as `reply_spoofed`. Nothing was recorded.
    Spoofed,
}

/// Whether `reply_of` looks for an entry under the reply's own tuple (a SNAT flow's
/// reply or kernel-path entry, or a shared endpoint's reply entry), before a reply is
/// taken for one with no entry.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum OwnEntry {
    /// No: the caller looked already (`lookup_or_balance`, a packet to a gateway
    /// address too).
    Looked,
    /// An entry XDP may translate with (`direct`); XDP counts `reply_untracked`.
    Xdp,
    /// Any entry, as it is: the caller checks it (`find`: TC and ICMP errors).
    Any,
}

/// What `reply_of` does with a reply whose flow has no entry.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum NoEntry {
    /// Matches it by Maglev: if its service's table maps the flow's forward tuple to the
    /// backend the reply came from, translates it and records the flow (a packet of the
    /// flow, XDP or TC: whichever gateway behind ECMP it reaches carries it).
    Maglev,
    /// Leaves it untranslated (an ICMP error: only errors about flows with an entry are
    /// translated).
    Leave,
}

/// A lookup's answer: what was found and, for `Tracked` and `Reply`, the entry (null
/// otherwise).
pub struct Lookup<A: Addr = u32> {
    pub found: Found,
    pub entry: *mut Flow<A>,
}

impl<A: Addr> Lookup<A> {
    #[inline(always)]
    fn of(found: Found, entry: *mut Flow<A>) -> Self {
        Lookup { found, entry }
    }

    #[inline(always)]
    fn only(found: Found) -> Self {
        Lookup {
            found,
            entry: core::ptr::null_mut(),
        }
    }
}

/// What the packet's own tuple finds in the conntrack.
enum Direct<A: Addr> {
    None,
    Hit(*mut Flow<A>),
    /// A forward entry whose backend is gone: the flow's service, to be balanced again.
    Stale(ServiceId),
}

/// Finds the flow of the packet with tuple `t`, or balances it to a backend (written
/// to `new`, left untouched otherwise) when it is the first packet to a service (or
/// the first since its entry stopped applying, see `applies`).
///
/// The packet's `roles` say which lookups can find something (a packet with neither
/// role is passed before it gets here). A TCP SYN (`syn`) to a router-mode service is a
/// new flow by definition and skips the conntrack lookup (a retransmitted SYN gets the
/// same backend from Maglev); a SNAT flow's SYN is looked up, so that a retransmission
/// keeps the node port its flow claimed. A TCP segment without SYN that gets here had
/// no entry (it began on another gateway behind the same ECMP route, or its entry was
/// evicted): Maglev gives it the backend every gateway gives it (`ct_miss_midflow`).
///
/// `flags` are a TCP segment's flags (byte 13 of its header; a later fragment's are
/// taken for a mid-flow segment's, `MIDFLOW`). A packet that would open a flow with
/// flags no TCP sends (`invalid_flags`), or from a gateway address, is dropped
/// (`drop_tcp_flags`, `drop_gateway_source`): only where a flow would be opened, so
/// tracked flows pay nothing. A reply (an entry of kind `NAT_SRC`) that did not come
/// from where its backend is (`origin`) is dropped (`reply_spoofed`).
#[inline(always)]
pub fn lookup_or_balance<A: Family>(
    t: &FlowKey<A>,
    roles: Roles,
    flags: u8,
    origin: &Origin,
    new: &mut MaybeUninit<Flow<A>>,
) -> Result<Lookup<A>, Counter> {
    let Roles {
        to_gateway,
        from_backend,
    } = roles;
    let syn = t.proto == proto::TCP && flags & (TCP_SYN | TCP_ACK) == TCP_SYN;
    // The service of a forward entry that no longer applies.
    let mut stale = None;
    let mut looked = false;
    if to_gateway && !syn {
        looked = true;
        match direct(t) {
            // A SNAT flow's reply entry is keyed by the node's address.
            Direct::Hit(flow) => return checked(Lookup::of(Found::Tracked, flow), t, origin),
            Direct::Stale(id) => stale = Some(id),
            Direct::None => {}
        }
    }
    if from_backend {
        let own = if looked {
            OwnEntry::Looked
        } else {
            OwnEntry::Xdp
        };
        if let Some(found) = reply_of(t, own, NoEntry::Maglev, origin, new) {
            if found.found == Found::Spoofed {
                return Err(Counter::ReplySpoofed);
            }
            return Ok(found);
        }
        looked = true;
    }
    if !to_gateway {
        return Ok(Lookup::only(Found::Miss));
    }
    let key = ServiceKey {
        addr: t.dst,
        port: t.dport,
        proto: t.proto,
        pad: 0,
    };
    // SAFETY: the value is copied out at once.
    let service = (unsafe { A::services().get(key) }).copied();
    let Some(service) = service else {
        if stale.is_some() {
            count(Counter::CtStaleService);
        }
        return Ok(Lookup::only(Found::Miss));
    };
    if !looked && service.flags & SERVICE_SNAT != 0 {
        match direct(t) {
            // A SYN reopens the tuple (or retransmits the first): a new connection,
            // which goes to a backend that takes new flows (its backend may have turned
            // not ready, or left and kept its connections only, since).
            Direct::Hit(flow) if syn && !takes_new_flows(flow) => stale = Some(service.id),
            Direct::Hit(flow) => return Ok(Lookup::of(Found::Tracked, flow)),
            Direct::Stale(id) => stale = Some(id),
            Direct::None => {}
        }
    }
    opens_flow(t, flags)?;
    if let Some(old) = stale {
        // The service the packet addresses is the flow's own (its key is the flow's
        // service key): same id, so only the backend went; else the service went.
        count(if service.id == old {
            Counter::BackendGone
        } else {
            Counter::CtStaleService
        });
    }
    // A new flow of a service with session affinity: its client's backend, if kept.
    let kept = match Service::affinity_secs(service.flags) {
        0 => None,
        secs => affinity::kept(service.id, t.src, secs, coarse_now()),
    };
    balance(t, &service, new, kept)?;
    if t.proto == proto::TCP && !syn {
        count(Counter::CtMissMidflow);
    }
    Ok(Lookup::only(Found::New))
}

/// A later fragment's flags: taken for a mid-flow segment's (its first fragment was
/// checked).
pub const MIDFLOW: u8 = TCP_ACK;

/// Whether a packet with tuple `t` and TCP flags `flags` (see `lookup_or_balance`) may
/// open a flow: a TCP segment with valid flags (`invalid_flags`), from an address that
/// is not a gateway address.
#[inline(always)]
fn opens_flow<A: Family>(t: &FlowKey<A>, flags: u8) -> Result<(), Counter> {
    if t.proto == proto::TCP && invalid_flags(flags) {
        return Err(Counter::DropTcpFlags);
    }
    // The filter first: an array lookup, where the address map is a hash.
    if Roles::may_be_gateway(t.src) && is_gateway_address(t.src) {
        return Err(Counter::DropGatewaySource);
    }
    Ok(())
}

/// TCP flag combinations no TCP sends, which scanners and fingerprinting tools do
/// (and which, balanced as a new flow, reached a backend): no flag among FIN, SYN,
/// RST, PSH, ACK, URG; SYN with FIN or RST; FIN, PSH and URG together (Xmas).
#[inline(always)]
pub fn invalid_flags(flags: u8) -> bool {
    const FIN: u8 = 0x01;
    const RST: u8 = 0x04;
    const PSH: u8 = 0x08;
    const URG: u8 = 0x20;
    flags & 0x3f == 0
        || flags & (TCP_SYN | FIN) == TCP_SYN | FIN
        || flags & (TCP_SYN | RST) == TCP_SYN | RST
        || flags & (FIN | PSH | URG) == FIN | PSH | URG
}

/// `found`, unless it is a reply (an entry of kind `NAT_SRC`, found under the packet's
/// tuple `t`) that did not come from where its backend is: then `reply_spoofed`.
#[inline(always)]
fn checked<A: Family>(
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

/// The entry under the packet's own tuple, if it applies.
#[inline(always)]
fn direct<A: Family>(t: &FlowKey<A>) -> Direct<A> {
    let Some(flow) = A::conntrack().get_ptr_mut(t) else {
        return Direct::None;
    };
    // SAFETY: a valid map value pointer for the duration of this program run.
    let f = unsafe { &*flow };
    // A `NAT_MASQ` entry is the TC program's (see its doc): XDP looks past it.
    if f.kind == NAT_MASQ {
        Direct::None
    } else if backend_serves(t, f) {
        if f.kind == NAT_DST && f.is_snat() && !holds_port(t, f) {
            // Balanced again: a new flow, with a port of its own.
            count(Counter::SnatPortLost);
            return Direct::None;
        }
        Direct::Hit(flow)
    } else if f.kind == NAT_DST {
        Direct::Stale(f.service)
    } else if service_unchanged(t, f) {
        Direct::Hit(flow)
    } else {
        count(Counter::CtStaleService);
        Direct::None
    }
}

/// Whether a SNAT flow still holds its node port, by its forward entry `f` found under
/// tuple `key` (client → gateway), or its `NAT_MASQ` entry (client → backend): its reply
/// entry (backend → node), which is the port's lock and translates the replies, is
/// there and is this flow's. The LRU evicts entries one at a time: a flow whose reply
/// entry went on leaving from a port it no longer held, its replies passed
/// untranslated, and a new flow could claim the port and get both flows' replies (the
/// fuzzer found it with a full table). An evicted reply entry is recorded again
/// (insert-if-absent, as a claim); a port another flow claimed since is lost.
#[inline(always)]
pub fn holds_port<A: Family>(key: &FlowKey<A>, f: &Flow<A>) -> bool {
    let Some(reply) = A::pending() else {
        return false;
    };
    // Fields one at a time: tuples of IPv6 addresses took `berth_v6` past its stack.
    let masq = f.kind == NAT_MASQ;
    let k = &mut reply.key;
    (k.proto, k.pad) = (key.proto, [0; 3]);
    if masq {
        (k.src, k.sport, k.dst, k.dport) = (key.dst, key.dport, f.nat_addr, f.nat_port);
    } else {
        (k.src, k.sport, k.dst, k.dport) = (f.nat_addr, f.nat_port, f.peer_addr, f.peer_port);
    }
    let (gateway, gateway_port) = if masq {
        (f.peer_addr, f.peer_port)
    } else {
        (key.dst, key.dport)
    };
    #[allow(
        clippy::needless_borrows_for_generic_args,
        reason = "by value, the key would be copied to the stack"
    )]
    if let Some(r) = A::conntrack().get_ptr(&reply.key) {
        // SAFETY: a valid map value pointer for the duration of this program run.
        let r = unsafe { &*r };
        return r.kind == NAT_SRC
            && r.peer_addr == key.src
            && r.peer_port == key.sport
            && r.nat_addr == gateway
            && r.nat_port == gateway_port;
    }
    reply.flow = Flow::entry(NAT_SRC, (gateway, gateway_port), f.backend, f.service)
        .with_peer((key.src, key.sport));
    insert(&reply.key, &reply.flow, BPF_NOEXIST as u64)
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
fn reply_of<A: Family>(
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
        NoEntry::Maglev => maglev_match(t, index, taken, origin, slot),
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

/// Notes a TCP segment with one of `TCP_STATE_FLAGS` (`tcp_flags`) in its flow's
/// forward entry (`Flow::note_tcp`), so that the daemon can tell when a connection to a
/// backend that left its service ended (issue 30). `flow` is the translation the packet
/// found (`found`): its forward entry (a forward packet's, or a new flow's before it is
/// recorded), a reply entry (the forward entry is looked up), or the slot of a reply
/// found through its forward entry. A reply matched by Maglev is left alone (rare: its
/// flow is over when idle).
#[inline(always)]
pub fn note_tcp<A: Family>(key: &FlowKey<A>, found: &Lookup<A>, flow: &mut Flow<A>, tcp_flags: u8) {
    let now = coarse_now();
    match found.found {
        // SAFETY: a valid map value pointer for the duration of this program run.
        Found::Reply => unsafe { (*found.entry).note_tcp(tcp_flags, true, now) },
        Found::Tracked | Found::New if flow.kind == NAT_DST => flow.note_tcp(tcp_flags, false, now),
        Found::Tracked if flow.kind == NAT_SRC => note_reply_tcp(key, flow, tcp_flags, now),
        _ => {}
    }
}

/// `note_tcp` for a reply with tuple `key` and translation `reply` (a `NAT_SRC`
/// entry's, or a copy of it): its flow's forward entry (client → gateway) is looked up
/// in this CPU's pending slot (an IPv6 key on the stack took `berth_v6` past its limit).
#[inline(always)]
pub fn note_reply_tcp<A: Family>(key: &FlowKey<A>, reply: &Flow<A>, tcp_flags: u8, now: u32) {
    let Some(slot) = A::pending() else {
        return;
    };
    let k = &mut slot.key;
    (k.proto, k.pad) = (key.proto, [0; 3]);
    if reply.is_snat() {
        (k.src, k.sport) = (reply.peer_addr, reply.peer_port);
    } else {
        (k.src, k.sport) = (key.dst, key.dport);
    }
    (k.dst, k.dport) = (reply.nat_addr, reply.nat_port);
    #[allow(
        clippy::needless_borrows_for_generic_args,
        reason = "by value, the key would be copied to the stack"
    )]
    if let Some(f) = A::conntrack().get_ptr_mut(&slot.key) {
        // SAFETY: a valid map value pointer for the duration of this program run.
        let f = unsafe { &mut *f };
        if f.kind == NAT_DST {
            f.note_tcp(tcp_flags, true, now);
        }
    }
}

/// Notes that a forward entry forwarded a packet now (`Flow::seen`, rewritten about once
/// a second: the daemon counts active flows by it).
#[inline(always)]
pub fn seen<A: Addr>(flow: &mut Flow<A>, now: u32) {
    if now.wrapping_sub(flow.seen) > NEXT_HOP_REFRESH {
        flow.seen = now;
    }
}

/// The flood guard's window of coarse time `now` (`fwd::coarse_now`, 2^20 ns): units
/// of 2^30 ns, about a second.
#[inline(always)]
fn window_of(now: u32) -> u32 {
    now >> 10
}

/// Whether the flood guard lets this CPU record one more router-mode flow now
/// (`flood_allows`); counts `flood_untracked` if not.
#[inline(always)]
fn may_record(now: u32) -> bool {
    let allowed = flood_allows(now);
    if !allowed {
        count(Counter::FloodUntracked);
    }
    allowed
}

/// Whether this CPU may record one more new flow in this window
/// (`config::NEW_FLOW_LIMIT`).
#[inline(always)]
fn flood_allows(now: u32) -> bool {
    let limit = match CONFIG.get(config::NEW_FLOW_LIMIT) {
        Some(&limit) if limit != 0 => limit,
        _ => return true,
    };
    let Some(window) = FLOOD.get_ptr_mut(0) else {
        return true;
    };
    // SAFETY: per-CPU slot, only this CPU writes it while the program runs.
    let (window, now) = (unsafe { &mut *window }, window_of(now));
    if window.window != now {
        window.window = now;
        window.new_flows = 0;
    }
    window.new_flows += 1;
    window.new_flows <= limit
}

/// Whether a tracked entry (found under tuple `key`) still belongs to the service that
/// created it, so that it may translate the packet.
///
/// Service and backend ids are reused: without this check, a flow of a removed service
/// whose ids were given to an unrelated service with the same backend endpoint (two
/// routes to one Service) was forwarded again, and its replies left from the removed
/// service's address (the case Cilium's reverse-NAT index check exists for). Service
/// ids carry a generation, so a reused id differs from the entry's.
///
/// The cheap check first (one array lookup): the entry's backend slot still holds its
/// backend for the entry's service. Otherwise the service map decides: an entry of a
/// service still installed under the same id applies (a reply or ICMP error from a
/// backend just removed is still translated; forward packets of such a flow are
/// balanced again by `lookup_or_balance` instead).
#[inline(always)]
pub fn applies<A: Family>(key: &FlowKey<A>, flow: &Flow<A>) -> bool {
    backend_serves(key, flow) || service_unchanged(key, flow)
}

/// The entry's backend slot holds its backend (the endpoint the flow goes to, or the
/// one its replies come from), live and configured for the entry's service (weight 0
/// included).
#[inline(always)]
fn backend_serves<A: Family>(key: &FlowKey<A>, flow: &Flow<A>) -> bool {
    let ((addr, port), _) = ends(key, flow);
    match BACKENDS.get(flow.backend) {
        Some(b) => {
            b.flags & BACKEND_LIVE != 0
                && b.service == flow.service
                && A::backend_addr(flow.backend, b) == addr
                && b.port == port
        }
        None => false,
    }
}

/// Whether the backend of forward entry `flow` takes new flows (weight above 0).
#[inline(always)]
fn takes_new_flows<A: Addr>(flow: *mut Flow<A>) -> bool {
    // SAFETY: a valid map value pointer for the duration of this program run.
    let backend = unsafe { (*flow).backend };
    BACKENDS.get(backend).is_some_and(|b| b.weight > 0)
}

/// The service the entry was balanced by is installed under the same id.
#[inline(always)]
fn service_unchanged<A: Family>(key: &FlowKey<A>, flow: &Flow<A>) -> bool {
    let (_, (addr, port)) = ends(key, flow);
    let service = ServiceKey {
        addr,
        port,
        proto: key.proto,
        pad: 0,
    };
    // SAFETY: the value is only compared.
    unsafe { A::services().get(service) }.is_some_and(|s| s.id == flow.service)
}

/// The backend's and the service's (address, port) of an entry found under `key`, both
/// network order: a forward entry (`NAT_DST`) is keyed by the service address and
/// rewrites to the backend, a reply entry the other way round; a `NAT_MASQ` entry is
/// keyed by the backend and holds the service address as its peer.
#[inline(always)]
fn ends<A: Addr>(key: &FlowKey<A>, flow: &Flow<A>) -> ((A, u16), (A, u16)) {
    match flow.kind {
        NAT_DST => ((flow.nat_addr, flow.nat_port), (key.dst, key.dport)),
        NAT_MASQ => ((key.dst, key.dport), (flow.peer_addr, flow.peer_port)),
        _ => ((key.src, key.sport), (flow.nat_addr, flow.nat_port)),
    }
}

/// Picks a backend with the service's Maglev table (or takes `kept`, the backend session
/// affinity keeps for the client); the new flow is written to `out` (in place: an IPv6
/// flow is too large to pass around on the stack).
#[inline(always)]
fn balance<A: Family>(
    t: &FlowKey<A>,
    service: &Service,
    out: &mut MaybeUninit<Flow<A>>,
    kept: Option<u32>,
) -> Result<(), Counter> {
    // With session affinity, Maglev picks by the client's address alone: the source
    // port is masked out of the hash (`sticky`: 1 for such a service, else 0). Made
    // without a branch: a branch here, and one on the same condition below, doubled
    // the verifier's states for the rest of the path in every Maglev reply match and
    // took the program past its limit of 1M instructions.
    let sticky = sticky(service.flags);
    let sport = t.sport & (sticky as u16).wrapping_sub(1);
    let hash = flow_hash(t.src, t.dst, sport, t.dport, t.proto);
    // The region is one word (see `Service::table`). No table: no backend takes new
    // flows (and a zero size would make the modulo a panic).
    let table = service.table;
    let size = Service::table_size(table);
    if size == 0 {
        return Err(Counter::DropNoBackend);
    }
    let backend_id = match kept {
        Some(id) => id,
        None => {
            // The table is a region of the pool, whose lookup bounds-checks the index.
            // The slot is hidden from LLVM as when tables had a constant size (LLVM
            // turned that modulo into a multiply the verifier could not bound and
            // dropped the index check): so the hash is computed here, before the
            // lookup, not sunk past the helper call, where its inputs (an IPv6 tuple's
            // ten words) were spilled to the stack.
            let slot = core::hint::black_box(hash % size);
            let index = Service::table_start(table).wrapping_add(slot);
            *MAGLEV.get(index).ok_or(Counter::DropNoBackend)?
        }
    };
    let backend = BACKENDS.get(backend_id).ok_or(Counter::DropNoBackend)?;
    if backend.flags & BACKEND_LIVE == 0 {
        return Err(Counter::DropNoBackend);
    }
    let flow = out.write(Flow::entry(
        NAT_DST,
        (A::backend_addr(backend_id, backend), backend.port),
        backend_id,
        service.id,
    ));
    if service.flags & SERVICE_REPLY_ENTRY != 0 {
        flow.flags = FLOW_REPLY_ENTRY;
    }
    flow.flags |= (sticky as u8) * FLOW_AFFINITY;
    if service.flags & SERVICE_SNAT != 0 {
        // The port follows the whole tuple (a client's flows share the Maglev hash
        // under affinity, and would try the same ports); hashed again rather than
        // chosen by a branch (see above).
        let hash = flow_hash(t.src, t.dst, t.sport, t.dport, t.proto);
        let (addr, port) = claim_source(t, flow, backend, hash)?;
        flow.peer_addr = addr;
        flow.peer_port = port;
    }
    Ok(())
}

/// 1 if `Service::flags` `flags` give the service session affinity, else 0, computed
/// without a branch (see `balance`): `m | -m` has its top bit set exactly when `m` is
/// not zero (`m` < 2^31), and the negation is hidden from LLVM, which would fold the
/// expression back into a comparison (a branch in BPF).
#[inline(always)]
fn sticky(flags: u32) -> u32 {
    let m = Service::affinity_secs(flags);
    (m | core::hint::black_box(m.wrapping_neg())) >> 31
}

/// SNAT mode: picks the node's address toward the backend and a source port for the
/// flow, and records the flow's reply entry under them (insert-if-absent: that is what
/// makes the port the flow's own). Tries `SNAT_PORT_TRIES` ports, each chosen by the
/// flow's hash from the daemon's port list.
#[inline(always)]
fn claim_source<A: Family>(
    t: &FlowKey<A>,
    flow: &Flow<A>,
    backend: &Backend,
    hash: u32,
) -> Result<(A, u16), Counter> {
    let Some(node) = A::snat_source(flow.backend) else {
        return Err(Counter::DropSnatNoSource);
    };
    let ports = match SNAT_PORTS.get(0) {
        Some(&n) if n != 0 => n,
        _ => return Err(Counter::DropSnatPortsExhausted),
    };
    // The reply entry is built in the pending slot; each try changes its key.
    let Some(reply) = A::pending() else {
        return Err(Counter::DropSnatPortsExhausted);
    };
    reply.flow = Flow::entry(NAT_SRC, (t.dst, t.dport), flow.backend, flow.service)
        .with_peer((t.src, t.sport));
    for attempt in 0..SNAT_PORT_TRIES {
        // Hidden from LLVM for the same reason as the Maglev slot in `balance`.
        let slot = core::hint::black_box(snat_port_slot(hash, attempt, ports));
        let Some(&port) = SNAT_PORTS.get(slot) else {
            break;
        };
        reply.key = tuple(
            (A::backend_addr(flow.backend, backend), backend.port),
            (node, port as u16),
            t.proto,
        );
        if insert(&reply.key, &reply.flow, BPF_NOEXIST as u64) {
            count(Counter::SnatNewFlow);
            return Ok((node, port as u16));
        }
        count(Counter::SnatPortRetry);
    }
    Err(Counter::DropSnatPortsExhausted)
}

/// Records a new flow with tuple `key`: its forward entry, and a reply entry where the
/// reply index cannot find its replies (`FLOW_REPLY_ENTRY`; a SNAT flow's reply entry
/// was recorded when its port was claimed). Over the flood guard's limit a router-mode
/// flow is not recorded (`flood_untracked`): Maglev keeps its packets on their backend.
/// `now` is the coarse clock the packet was forwarded at (`fwd::coarse_now`).
#[inline(always)]
pub fn record<A: Family>(key: &FlowKey<A>, flow: &Flow<A>, now: u32) {
    count(Counter::NewFlow);
    if !flow.is_snat() && !may_record(now) {
        return;
    }
    if flow.flags & FLOW_AFFINITY != 0 {
        affinity::note(flow.service, key.src, flow.backend, now);
    }
    if flow.flags & FLOW_REPLY_ENTRY != 0 {
        // The reply entry goes first so that a reply can never arrive before it exists.
        // Inserting into an LRU map only fails on allocation failure; the packet is
        // still forwarded and the next one retries.
        insert_staged(
            tuple(
                (flow.nat_addr, flow.nat_port),
                (key.src, key.sport),
                key.proto,
            ),
            Flow::entry(NAT_SRC, (key.dst, key.dport), flow.backend, flow.service),
            false,
        );
    }
    insert(key, flow, 0);
}

/// Inserts an entry (`flags`: `BPF_NOEXIST` or 0 to replace), counting it as created;
/// whether it was.
#[inline(always)]
fn insert<A: Family>(key: &FlowKey<A>, flow: &Flow<A>, flags: u64) -> bool {
    let created = A::conntrack().insert(key, flow, flags).is_ok();
    if created {
        count(Counter::CtCreated);
    }
    created
}

/// Inserts entry `flow` under `key`, both built in this CPU's pending slot rather than
/// on the stack (an IPv6 entry and key are 120 bytes); with `unless_same`, not if the
/// key holds this translation already. Looked up first: an LRU insert takes a free
/// element (maybe evicting one) before it finds the key present.
#[inline(always)]
fn insert_staged<A: Family>(key: FlowKey<A>, flow: Flow<A>, unless_same: bool) {
    let Some(slot) = A::pending() else {
        return;
    };
    slot.key = key;
    slot.flow = flow;
    if unless_same {
        #[allow(
            clippy::needless_borrows_for_generic_args,
            reason = "by value, the key would be copied to the stack"
        )]
        if let Some(old) = A::conntrack().get_ptr(&slot.key) {
            // SAFETY: a valid map value pointer for the duration of this program run.
            if same_translation(unsafe { &*old }, &slot.flow) {
                return;
            }
        }
    }
    insert(&slot.key, &slot.flow, 0);
}

/// Whether two entries translate a packet alike: kind, both endpoints, and the ids
/// `applies` checks.
#[inline(always)]
fn same_translation<A: Addr>(a: &Flow<A>, b: &Flow<A>) -> bool {
    a.kind == b.kind
        && a.nat_addr == b.nat_addr
        && a.nat_port == b.nat_port
        && a.peer_addr == b.peer_addr
        && a.peer_port == b.peer_port
        && a.backend == b.backend
        && a.service == b.service
}

/// A SNAT flow's packet goes through the kernel: the kernel forwards it with only its
/// destination half translated (see `nat`), and the TC program translates the source
/// half on egress. It finds the flow by the tuple the packet leaves with, so that tuple
/// needs entries: (client → backend) rewrites the source to the node (`NAT_MASQ`),
/// (backend → client) to the gateway (`NAT_SRC`, as in router mode). Both are made the
/// first time either direction takes the kernel's path (the second also serves ICMP
/// errors the kernel sends about forward packets), found by `entry` (`flow` found under
/// `key`, forward or reply). An entry of an earlier flow of the same tuple is replaced:
/// the tuple's flow was balanced again (its entries evicted, or its port lost, see
/// `holds_port`) maybe while XDP sent its packets itself, and the old `NAT_MASQ` entry
/// gave them the node port of the old claim, since another flow's (found by the fuzzer).
#[inline(always)]
pub fn add_kernel_path_entries<A: Family>(key: &FlowKey<A>, flow: &Flow<A>) {
    let (
        (client, client_port),
        (gateway, gateway_port),
        (backend, backend_port),
        (node, node_port),
    ) = if flow.kind == NAT_DST {
        (
            (key.src, key.sport),
            (key.dst, key.dport),
            (flow.nat_addr, flow.nat_port),
            (flow.peer_addr, flow.peer_port),
        )
    } else {
        (
            (flow.peer_addr, flow.peer_port),
            (flow.nat_addr, flow.nat_port),
            (key.src, key.sport),
            (key.dst, key.dport),
        )
    };
    let entry = |kind, nat_addr, nat_port, peer_addr, peer_port| {
        Flow::entry(kind, (nat_addr, nat_port), flow.backend, flow.service)
            .with_peer((peer_addr, peer_port))
    };
    insert_staged(
        tuple((client, client_port), (backend, backend_port), key.proto),
        entry(NAT_MASQ, node, node_port, gateway, gateway_port),
        true,
    );
    insert_staged(
        tuple((backend, backend_port), (client, client_port), key.proto),
        entry(NAT_SRC, gateway, gateway_port, A::default(), 0),
        true,
    );
}

/// The tuple of a packet from `src` to `dst` (addresses and ports network order).
#[inline(always)]
pub fn tuple<A: Addr>(src: (A, u16), dst: (A, u16), proto: u8) -> FlowKey<A> {
    FlowKey {
        src: src.0,
        dst: dst.0,
        sport: src.1,
        dport: dst.1,
        proto,
        pad: [0; 3],
    }
}
