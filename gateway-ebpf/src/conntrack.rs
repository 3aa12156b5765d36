//! Flow lookup and backend selection: the conntrack hit path and weighted Maglev.

use core::mem::MaybeUninit;

use gateway_common::{
    flow_hash, Counter, Flow, FlowKey, NextHop, Service, ServiceKey, BACKEND_LIVE, MAGLEV_SIZE,
    NAT_DST, NAT_SRC,
};

use crate::maps::{count, BACKENDS, CONNTRACK, MAGLEV, SERVICES};

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
/// to `new`, left untouched otherwise) when it is the first packet to a service.
#[inline(always)]
pub fn lookup_or_balance(t: &FlowKey, new: &mut MaybeUninit<Flow>) -> Result<Found, Counter> {
    if let Some(flow) = CONNTRACK.get_ptr_mut(t) {
        // SAFETY: a valid map value pointer for the duration of this program run.
        let f = unsafe { &*flow };
        if f.kind == NAT_SRC || backend_alive(f) {
            return Ok(Found::Tracked(flow));
        }
        count(Counter::BackendGone);
    }
    let key = ServiceKey {
        addr: t.dst,
        port: t.dport,
        proto: t.proto,
        pad: 0,
    };
    // SAFETY: the value is copied out at once.
    let Some(service) = (unsafe { SERVICES.get(key) }).copied() else {
        return Ok(Found::Miss);
    };
    new.write(balance(t, &service)?);
    Ok(Found::New)
}

/// A tracked flow keeps its backend while that backend is still configured for the
/// same service (weight 0 included); if it was removed, the flow is balanced again.
#[inline(always)]
fn backend_alive(flow: &Flow) -> bool {
    match BACKENDS.get(flow.backend) {
        Some(b) => {
            b.flags & BACKEND_LIVE != 0
                && b.service == flow.service
                && b.addr == flow.nat_addr
                && b.port == flow.nat_port
        }
        None => false,
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
    Ok(Flow {
        nat_addr: backend.addr,
        nat_port: backend.port,
        kind: NAT_DST,
        pad: 0,
        backend: backend_id,
        service: service.id,
        next_hop: NextHop::default(),
    })
}

/// Records both directions of a new flow with tuple `key`.
#[inline(always)]
pub fn record(key: &FlowKey, flow: &Flow) {
    let reply_key = FlowKey {
        src: flow.nat_addr,
        dst: key.src,
        sport: flow.nat_port,
        dport: key.sport,
        proto: key.proto,
        pad: [0; 3],
    };
    let reply = Flow {
        nat_addr: key.dst,
        nat_port: key.dport,
        kind: NAT_SRC,
        pad: 0,
        backend: flow.backend,
        service: flow.service,
        next_hop: NextHop::default(),
    };
    // The reply entry goes first so that a reply can never arrive before it exists.
    // Inserting into an LRU map only fails on allocation failure; the packet is still
    // forwarded and the next one retries.
    let _ = CONNTRACK.insert(reply_key, reply, 0);
    let _ = CONNTRACK.insert(key, flow, 0);
    count(Counter::NewFlow);
}
