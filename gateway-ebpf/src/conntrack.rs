//! Flow lookup and backend selection: the conntrack hit path and weighted Maglev.

use core::mem::MaybeUninit;

use aya_ebpf::bindings::BPF_NOEXIST;
use gateway_common::{
    flow_hash, snat_port_slot, Backend, Counter, Flow, FlowKey, NextHop, Service, ServiceKey,
    BACKEND_LIVE, MAGLEV_SIZE, NAT_DST, NAT_MASQ, NAT_SRC, SERVICE_SNAT, SNAT_PORT_TRIES,
};

use crate::maps::{count, BACKENDS, CONNTRACK, MAGLEV, SERVICES, SNAT_PORTS, SNAT_SOURCES};

/// What the conntrack says about a packet.
///
/// (New flows are returned through a caller-owned slot rather than in this enum: an
/// enum whose variants differ in size is copied with undefined bytes, which LLVM may
/// then read from registers the verifier considers uninitialised.)
pub enum Found {
    /// Not ours.
    Miss,
    /// A tracked flow: its entry in the map, updated in place (next-hop cache).
    Tracked(*mut Flow),
    /// The first packet of a flow: the new flow is in the caller's slot, to be recorded
    /// with `record` once forwarded (so the entry starts with its next hop cached).
    New,
}

/// Finds the flow of the packet with tuple `t`, or balances it to a backend (written
/// to `new`, left untouched otherwise) when it is the first packet to a service (or
/// the first since its entry stopped applying, see `applies`).
#[inline(always)]
pub fn lookup_or_balance(t: &FlowKey, new: &mut MaybeUninit<Flow>) -> Result<Found, Counter> {
    // The service of a forward entry that no longer applies.
    let mut stale = None;
    if let Some(flow) = CONNTRACK.get_ptr_mut(t) {
        // SAFETY: a valid map value pointer for the duration of this program run.
        let f = unsafe { &*flow };
        // A `NAT_MASQ` entry is the TC program's (see its doc): XDP looks past it.
        if f.kind == NAT_MASQ {
        } else if backend_serves(t, f) {
            return Ok(Found::Tracked(flow));
        } else if f.kind == NAT_DST {
            stale = Some(f.service);
        } else if service_unchanged(t, f) {
            return Ok(Found::Tracked(flow));
        } else {
            count(Counter::CtStaleService);
        }
    }
    let key = ServiceKey {
        addr: t.dst,
        port: t.dport,
        proto: t.proto,
        pad: 0,
    };
    // SAFETY: the value is copied out at once.
    let service = (unsafe { SERVICES.get(key) }).copied();
    if let Some(old) = stale {
        // The service the packet addresses is the flow's own (its key is the flow's
        // service key): same id, so only the backend went; else the service went.
        count(match service {
            Some(s) if s.id == old => Counter::BackendGone,
            _ => Counter::CtStaleService,
        });
    }
    let Some(service) = service else {
        return Ok(Found::Miss);
    };
    new.write(balance(t, &service)?);
    Ok(Found::New)
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
pub fn applies(key: &FlowKey, flow: &Flow) -> bool {
    backend_serves(key, flow) || service_unchanged(key, flow)
}

/// The entry's backend slot holds its backend (the endpoint the flow goes to, or the
/// one its replies come from), live and configured for the entry's service (weight 0
/// included).
#[inline(always)]
fn backend_serves(key: &FlowKey, flow: &Flow) -> bool {
    let ((addr, port), _) = ends(key, flow);
    match BACKENDS.get(flow.backend) {
        Some(b) => {
            b.flags & BACKEND_LIVE != 0
                && b.service == flow.service
                && b.addr == addr
                && b.port == port
        }
        None => false,
    }
}

/// The service the entry was balanced by is installed under the same id.
#[inline(always)]
fn service_unchanged(key: &FlowKey, flow: &Flow) -> bool {
    let (_, (addr, port)) = ends(key, flow);
    let service = ServiceKey {
        addr,
        port,
        proto: key.proto,
        pad: 0,
    };
    // SAFETY: the value is only compared.
    unsafe { SERVICES.get(service) }.is_some_and(|s| s.id == flow.service)
}

/// The backend's and the service's (address, port) of an entry found under `key`, both
/// network order: a forward entry (`NAT_DST`) is keyed by the service address and
/// rewrites to the backend, a reply entry the other way round; a `NAT_MASQ` entry is
/// keyed by the backend and holds the service address as its peer.
#[inline(always)]
fn ends(key: &FlowKey, flow: &Flow) -> ((u32, u16), (u32, u16)) {
    match flow.kind {
        NAT_DST => ((flow.nat_addr, flow.nat_port), (key.dst, key.dport)),
        NAT_MASQ => ((key.dst, key.dport), (flow.peer_addr, flow.peer_port)),
        _ => ((key.src, key.sport), (flow.nat_addr, flow.nat_port)),
    }
}

/// Picks a backend with the service's Maglev table.
#[inline(always)]
fn balance(t: &FlowKey, service: &Service) -> Result<Flow, Counter> {
    if service.active == 0 {
        return Err(Counter::DropNoBackend);
    }
    let hash = flow_hash(t.src, t.dst, t.sport, t.dport, t.proto);
    let table = MAGLEV.get(service.table).ok_or(Counter::DropNoBackend)?;
    // LLVM turns the modulo into a multiply the verifier cannot bound, and then drops
    // the index check as redundant; hiding the value keeps the check for the verifier.
    let slot = core::hint::black_box(hash % MAGLEV_SIZE) as usize;
    let backend_id = *table.get(slot).ok_or(Counter::DropNoBackend)?;
    let backend = BACKENDS.get(backend_id).ok_or(Counter::DropNoBackend)?;
    if backend.flags & BACKEND_LIVE == 0 {
        return Err(Counter::DropNoBackend);
    }
    let mut flow = Flow {
        nat_addr: backend.addr,
        nat_port: backend.port,
        kind: NAT_DST,
        pad: 0,
        backend: backend_id,
        service: service.id,
        next_hop: NextHop::default(),
        peer_addr: 0,
        peer_port: 0,
        pad2: 0,
    };
    if service.flags & SERVICE_SNAT != 0 {
        let (addr, port) = claim_source(t, &flow, backend, hash)?;
        flow.peer_addr = addr;
        flow.peer_port = port;
    }
    Ok(flow)
}

/// SNAT mode: picks the node's address toward the backend and a source port for the
/// flow, and records the flow's reply entry under them (insert-if-absent: that is what
/// makes the port the flow's own). Tries `SNAT_PORT_TRIES` ports, each chosen by the
/// flow's hash from the daemon's port list.
#[inline(always)]
fn claim_source(
    t: &FlowKey,
    flow: &Flow,
    backend: &Backend,
    hash: u32,
) -> Result<(u32, u16), Counter> {
    let node = match SNAT_SOURCES.get(flow.backend) {
        Some(&addr) if addr != 0 => addr,
        _ => return Err(Counter::DropSnatNoSource),
    };
    let ports = match SNAT_PORTS.get(0) {
        Some(&n) if n != 0 => n,
        _ => return Err(Counter::DropSnatPortsExhausted),
    };
    let reply = Flow {
        nat_addr: t.dst,
        nat_port: t.dport,
        kind: NAT_SRC,
        pad: 0,
        backend: flow.backend,
        service: flow.service,
        next_hop: NextHop::default(),
        peer_addr: t.src,
        peer_port: t.sport,
        pad2: 0,
    };
    for attempt in 0..SNAT_PORT_TRIES {
        // Hidden from LLVM for the same reason as the Maglev slot in `balance`.
        let slot = core::hint::black_box(snat_port_slot(hash, attempt, ports));
        let Some(&port) = SNAT_PORTS.get(slot) else {
            break;
        };
        let reply_key = tuple((backend.addr, backend.port), (node, port as u16), t.proto);
        if CONNTRACK
            .insert(reply_key, reply, BPF_NOEXIST as u64)
            .is_ok()
        {
            count(Counter::SnatNewFlow);
            return Ok((node, port as u16));
        }
        count(Counter::SnatPortRetry);
    }
    Err(Counter::DropSnatPortsExhausted)
}

/// Records a new flow with tuple `key`: its forward entry, and in router mode its reply
/// entry (a SNAT flow's reply entry was recorded when its port was claimed).
#[inline(always)]
pub fn record(key: &FlowKey, flow: &Flow) {
    if !flow.is_snat() {
        let reply_key = tuple(
            (flow.nat_addr, flow.nat_port),
            (key.src, key.sport),
            key.proto,
        );
        let reply = Flow {
            nat_addr: key.dst,
            nat_port: key.dport,
            kind: NAT_SRC,
            pad: 0,
            backend: flow.backend,
            service: flow.service,
            next_hop: NextHop::default(),
            peer_addr: 0,
            peer_port: 0,
            pad2: 0,
        };
        // The reply entry goes first so that a reply can never arrive before it exists.
        // Inserting into an LRU map only fails on allocation failure; the packet is
        // still forwarded and the next one retries.
        let _ = CONNTRACK.insert(reply_key, reply, 0);
    }
    let _ = CONNTRACK.insert(key, flow, 0);
    count(Counter::NewFlow);
}

/// A SNAT flow's packet goes through the kernel: the kernel forwards it with only its
/// destination half translated (see `nat`), and the TC program translates the source
/// half on egress. It finds the flow by the tuple the packet leaves with, so that tuple
/// needs entries: (client → backend) rewrites the source to the node (`NAT_MASQ`),
/// (backend → client) to the gateway (`NAT_SRC`, as in router mode). Both are made the
/// first time either direction takes the kernel's path (the second also serves ICMP
/// errors the kernel sends about forward packets), found by `entry` (`flow` found under
/// `key`, forward or reply).
#[inline(always)]
pub fn add_kernel_path_entries(key: &FlowKey, flow: &Flow) {
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
    let entry = |kind, nat_addr, nat_port, peer_addr, peer_port| Flow {
        nat_addr,
        nat_port,
        kind,
        pad: 0,
        backend: flow.backend,
        service: flow.service,
        next_hop: NextHop::default(),
        peer_addr,
        peer_port,
        pad2: 0,
    };
    let masq = tuple((client, client_port), (backend, backend_port), key.proto);
    insert_absent(
        &masq,
        &entry(NAT_MASQ, node, node_port, gateway, gateway_port),
    );
    let reply = tuple((backend, backend_port), (client, client_port), key.proto);
    insert_absent(&reply, &entry(NAT_SRC, gateway, gateway_port, 0, 0));
}

/// The tuple of a packet from `src` to `dst` (addresses and ports network order).
#[inline(always)]
fn tuple(src: (u32, u16), dst: (u32, u16), proto: u8) -> FlowKey {
    FlowKey {
        src: src.0,
        dst: dst.0,
        sport: src.1,
        dport: dst.1,
        proto,
        pad: [0; 3],
    }
}

/// Inserts an entry unless its key is tracked already. Looked up first: an LRU insert
/// takes a free element (maybe evicting one) before it finds the key present.
#[inline(always)]
fn insert_absent(key: &FlowKey, flow: &Flow) {
    if CONNTRACK.get_ptr(key).is_none() {
        let _ = CONNTRACK.insert(key, flow, 0);
    }
}
