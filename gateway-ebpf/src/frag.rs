//! Fragments, of either family. Only the first fragment of a datagram carries the
//! transport header, so the ports it shows are remembered (`berth_frags`,
//! `berth_frags6`: keyed by source, destination, identification and protocol) and the
//! later fragments follow the flow the first one took. A later fragment to a gateway
//! address whose first fragment was not seen is dropped (`drop_fragment`), never sent
//! to a guessed backend.

use aya_ebpf::programs::XdpContext;
use gateway_common::{Counter, FlowKey, FragPorts};

use crate::{
    conntrack::{lookup_or_balance, Found, MIDFLOW},
    family::Family,
    maps::{count, is_gateway_address, Roles},
    origin::Origin,
    packet::Eth,
    translate, Packet, PASS,
};

/// Handles a later fragment (one that carries no ports) of datagram `id` (network
/// order): translates and forwards it along the flow its first fragment took. (`eth`
/// and `ip` are bounds-checked by the caller; `len` is the IP packet's length.)
#[inline(always)]
pub fn later<A: Family>(
    ctx: &XdpContext,
    eth: *mut Eth,
    ip: *mut A::Hdr,
    roles: Roles,
    id: u32,
    ip_proto: u8,
    len: usize,
) -> Result<u32, Counter> {
    // SAFETY: `ip` points at a bounds-checked header.
    let (src, dst) = unsafe { A::addrs(ip) };
    let Some(ports) = A::fragment_ports(src, dst, id, ip_proto) else {
        return if is_gateway_address(dst) {
            Err(Counter::DropFragment)
        } else {
            PASS
        };
    };
    let t = FlowKey {
        src,
        dst,
        sport: ports.sport,
        dport: ports.dport,
        proto: ip_proto,
        pad: [0; 3],
    };
    let Some(new) = A::scratch() else {
        return PASS;
    };
    // SAFETY: `eth` is bounds-checked by the caller.
    let origin = unsafe { Origin::xdp(ctx, eth) };
    let found = lookup_or_balance(&t, roles, MIDFLOW, &origin, new)?;
    if found.found == Found::Miss {
        return PASS;
    }
    count(Counter::FragmentTranslated);
    let pkt = Packet {
        eth,
        ip,
        l4: None,
        len,
    };
    // SAFETY: `eth` and `ip` are bounds-checked by the caller; `found` is from this run.
    Ok(unsafe { translate(ctx, &pkt, &t, found, new) })
}

/// Records the ports of a fragmented datagram (`id`, network order) seen in its first
/// fragment.
#[inline(always)]
pub fn remember<A: Family>(t: &FlowKey<A>, id: u32) {
    let ports = FragPorts {
        sport: t.sport,
        dport: t.dport,
    };
    A::remember_fragment(t.src, t.dst, id, t.proto, ports);
}
