//! IPv4 fragments. Only the first fragment of a datagram carries the transport header,
//! so the ports it shows are remembered (`berth_frags`, keyed by source, destination,
//! IP id and protocol) and the later fragments follow the flow the first one took.
//! A later fragment to a gateway address whose first fragment was not seen is dropped
//! (`drop_fragment`), never sent to a guessed backend.

use aya_ebpf::programs::XdpContext;
use gateway_common::{Counter, FlowKey, FragKey, FragPorts};

use crate::{
    conntrack::{lookup_or_balance, Found},
    family::Family,
    maps::{count, is_gateway_address, Roles, FRAGMENTS},
    packet::{Eth, Ipv4},
    translate, Packet, PASS,
};

/// Handles a later fragment (one that carries no ports): translates and forwards it
/// along the flow its first fragment took. (`eth` and `ip` are bounds-checked by the
/// caller; `len` is the IP total length.)
#[inline(always)]
pub fn later(
    ctx: &XdpContext,
    eth: *mut Eth,
    ip: *mut Ipv4,
    roles: Roles,
    ip_proto: u8,
    len: usize,
) -> Result<u32, Counter> {
    // SAFETY: `ip` points at a bounds-checked IPv4 header.
    let (src, dst) = unsafe { ((*ip).src, (*ip).dst) };
    let key = key(ip, src, dst, ip_proto);
    // SAFETY: the value is copied out at once, before the map can change it.
    let Some(ports) = (unsafe { FRAGMENTS.get(key) }).copied() else {
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
    let Some(new) = Family::scratch() else {
        return PASS;
    };
    let found = lookup_or_balance(&t, roles, false, new)?;
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

/// Records the ports of a fragmented datagram seen in its first fragment.
#[inline(always)]
pub fn remember(ip: *mut Ipv4, t: &FlowKey) {
    let key = key(ip, t.src, t.dst, t.proto);
    let _ = FRAGMENTS.insert(
        key,
        FragPorts {
            sport: t.sport,
            dport: t.dport,
        },
        0,
    );
}

/// The datagram a fragment belongs to. (`ip` is bounds-checked by the caller.)
#[inline(always)]
fn key(ip: *mut Ipv4, src: u32, dst: u32, proto: u8) -> FragKey {
    FragKey {
        src,
        dst,
        // SAFETY: `ip` points at a bounds-checked IPv4 header.
        id: unsafe { (*ip).id },
        proto,
        pad: 0,
    }
}
