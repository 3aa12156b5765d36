//! Backend selection for a new flow: weighted Maglev (or the backend session affinity
//! keeps), and in SNAT mode the node address and port the flow claims.

use core::mem::MaybeUninit;

use aya_ebpf::bindings::BPF_NOEXIST;
use gateway_common::{
    flow_hash, snat_port_slot, Backend, Counter, Flow, FlowKey, Service, BACKEND_LIVE,
    FLOW_AFFINITY, FLOW_REPLY_ENTRY, NAT_DST, NAT_SRC, SERVICE_REPLY_ENTRY, SERVICE_SNAT,
    SNAT_PORT_TRIES,
};

use super::entry::{insert, tuple};
use crate::{
    family::Family,
    maps::{count, BACKENDS, MAGLEV, SNAT_PORTS},
};

/// Picks a backend with the service's Maglev table (or takes `kept`, the backend session
/// affinity keeps for the client); the new flow is written to `out` (in place: an IPv6
/// flow is too large to pass around on the stack).
#[inline(always)]
pub(super) fn balance<A: Family>(
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
