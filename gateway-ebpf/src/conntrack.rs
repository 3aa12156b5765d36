//! Flow lookup and backend selection: the conntrack hit path and weighted Maglev.

use gateway_common::{
    flow_hash, Counter, Flow, FlowKey, Service, ServiceKey, BACKEND_LIVE, MAGLEV_SIZE, NAT_DST,
    NAT_SRC,
};

use crate::maps::{count, BACKENDS, CONNTRACK, MAGLEV, SERVICES};

/// The flow a packet belongs to.
pub struct Hit {
    pub flow: Flow,
    /// The flow was created by this packet.
    pub new: bool,
}

/// Finds the flow of the packet with tuple `t`, or balances it to a backend when it is
/// the first packet to a service. `Ok(None)`: the packet is not ours.
#[inline(always)]
pub fn lookup_or_balance(t: &FlowKey) -> Result<Option<Hit>, Counter> {
    // SAFETY: the value is copied out at once.
    if let Some(flow) = unsafe { CONNTRACK.get(t) } {
        let flow = *flow;
        if flow.kind == NAT_SRC || backend_alive(&flow) {
            return Ok(Some(Hit { flow, new: false }));
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
    let Some(service) = (unsafe { SERVICES.get(&key) }).copied() else {
        return Ok(None);
    };
    balance(t, &service).map(|flow| Some(Hit { flow, new: true }))
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

/// Picks a backend with the service's Maglev table and records both directions.
#[inline(always)]
fn balance(t: &FlowKey, service: &Service) -> Result<Flow, Counter> {
    if service.active == 0 {
        return Err(Counter::DropNoBackend);
    }
    let hash = flow_hash(t.src, t.dst, t.sport, t.dport, t.proto);
    let slot = service.table * MAGLEV_SIZE + hash % MAGLEV_SIZE;
    let backend_id = *MAGLEV.get(slot).ok_or(Counter::DropNoBackend)?;
    let backend = BACKENDS.get(backend_id).ok_or(Counter::DropNoBackend)?;
    if backend.flags & BACKEND_LIVE == 0 {
        return Err(Counter::DropNoBackend);
    }
    let forward = Flow {
        nat_addr: backend.addr,
        nat_port: backend.port,
        kind: NAT_DST,
        pad: 0,
        backend: backend_id,
        service: service.id,
    };
    let reply_key = FlowKey {
        src: backend.addr,
        dst: t.src,
        sport: backend.port,
        dport: t.sport,
        proto: t.proto,
        pad: [0; 3],
    };
    let reply = Flow {
        nat_addr: t.dst,
        nat_port: t.dport,
        kind: NAT_SRC,
        pad: 0,
        backend: backend_id,
        service: service.id,
    };
    // The reply entry goes first so that a reply can never arrive before it exists.
    // Inserting into an LRU map only fails on allocation failure; the packet is still
    // forwarded and the next one retries.
    let _ = CONNTRACK.insert(&reply_key, &reply, 0);
    let _ = CONNTRACK.insert(t, &forward, 0);
    count(Counter::NewFlow);
    Ok(forward)
}
