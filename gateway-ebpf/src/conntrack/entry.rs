//! The conntrack's entries: the one under a packet's own tuple (`direct`), whether an
//! entry still applies (`applies`), and recording a flow's entries (`record`, and a
//! SNAT flow's entries for the kernel's path).

use aya_ebpf::bindings::BPF_NOEXIST;
use gateway_common::{
    Addr, Counter, Flow, FlowKey, ServiceId, ServiceKey, BACKEND_LIVE, FLOW_AFFINITY,
    FLOW_REPLY_ENTRY, NAT_DST, NAT_MASQ, NAT_SRC,
};

use super::flood::may_record;
use crate::{
    affinity,
    family::Family,
    maps::{count, BACKENDS},
};

/// What the packet's own tuple finds in the conntrack.
pub(super) enum Direct<A: Addr> {
    None,
    Hit(*mut Flow<A>),
    /// A forward entry whose backend is gone: the flow's service, to be balanced again.
    Stale(ServiceId),
}

/// The entry under the packet's own tuple, if it applies.
#[inline(always)]
pub(super) fn direct<A: Family>(t: &FlowKey<A>) -> Direct<A> {
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
pub(super) fn backend_serves<A: Family>(key: &FlowKey<A>, flow: &Flow<A>) -> bool {
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
pub(super) fn takes_new_flows<A: Addr>(flow: *mut Flow<A>) -> bool {
    // SAFETY: a valid map value pointer for the duration of this program run.
    let backend = unsafe { (*flow).backend };
    BACKENDS.get(backend).is_some_and(|b| b.weight > 0)
}

/// The service the entry was balanced by is installed under the same id.
#[inline(always)]
pub(super) fn service_unchanged<A: Family>(key: &FlowKey<A>, flow: &Flow<A>) -> bool {
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
pub(super) fn insert<A: Family>(key: &FlowKey<A>, flow: &Flow<A>, flags: u64) -> bool {
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
