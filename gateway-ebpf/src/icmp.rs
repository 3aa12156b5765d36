//! ICMP errors about NATed flows (destination unreachable, including "fragmentation
//! needed" for PMTU discovery, and time exceeded) are translated like the packet they
//! quote, so the sender of the quoted packet recognises it.

use aya_ebpf::{bindings::xdp_action, programs::XdpContext};
use gateway_common::{proto, Counter, Flow, FlowKey, NextHop, NAT_DST};

use crate::{
    conntrack::applies,
    csum::{replace2, replace4},
    fwd::{path, send, Path},
    maps::{count, CONNTRACK},
    packet::{ptr_at, Eth, Icmp, Ipv4, Ports, IPV4_MIN_LEN},
};

/// ICMP type "destination unreachable" (fragmentation needed is its code 4).
pub const DEST_UNREACH: u8 = 3;
/// ICMP type "time exceeded".
pub const TIME_EXCEEDED: u8 = 11;

/// Handles an unfragmented ICMP packet whose ICMP header starts at `l4_off` and whose
/// IP packet ends at `end` (both from the start of the frame).
///
/// # Safety
/// `eth` and `ip` must point into the packet, bounds-checked.
#[inline(always)]
pub unsafe fn handle(
    ctx: &XdpContext,
    eth: *mut Eth,
    ip: *mut Ipv4,
    l4_off: usize,
    end: usize,
) -> u32 {
    let pass = xdp_action::XDP_PASS;
    let Some(icmp) = ptr_at::<Icmp>(ctx, l4_off) else {
        return pass;
    };
    if (*icmp).kind != DEST_UNREACH && (*icmp).kind != TIME_EXCEEDED {
        return pass;
    }
    let inner_off = l4_off + core::mem::size_of::<Icmp>();
    let Some(inner) = ptr_at::<Ipv4>(ctx, inner_off) else {
        return pass;
    };
    // Quoted packets with IP options are rare enough to leave to the kernel.
    if (*inner).vihl != 0x45 || ((*inner).proto != proto::TCP && (*inner).proto != proto::UDP) {
        return pass;
    }
    let Some(ports) = ptr_at::<Ports>(ctx, inner_off + IPV4_MIN_LEN) else {
        return pass;
    };
    // A quote past the IP total length (in the frame's padding) is not part of the
    // message, and the ICMP checksum does not cover it.
    if inner_off + IPV4_MIN_LEN + core::mem::size_of::<Ports>() > end {
        return pass;
    }
    // The quoted packet travelled opposite to this error: its reversed tuple is the
    // tuple of this error's direction.
    let key = FlowKey {
        src: (*inner).dst,
        dst: (*inner).src,
        sport: (*ports).dst,
        dport: (*ports).src,
        proto: (*inner).proto,
        pad: [0; 3],
    };
    let Some(flow) = CONNTRACK.get(key).copied() else {
        return pass;
    };
    if !applies(&key, &flow) {
        count(Counter::CtStaleService);
        return pass;
    }
    // Errors are rare: they use their own next-hop lookup, not the flow's cache.
    let mut hop = NextHop::default();
    if flow.kind == NAT_DST {
        // From the client's side, quoting a reply: translated whichever way it leaves
        // (its new destination is the backend, which the kernel forwards to).
        translate(ip, icmp, inner, ports, &flow);
        count(Counter::IcmpTranslated);
        return match path(ctx, ip, &mut hop) {
            Path::Redirect => send(ctx, eth, ip, &hop),
            Path::Kernel(reason) => {
                count(reason);
                xdp_action::XDP_PASS
            }
        };
    }
    // From the backend's side, quoting a forwarded packet: translated only if XDP sends
    // it; the kernel would drop it as a martian if its source became the (local)
    // gateway address, so it goes up as it is and the TC program translates it.
    match path(ctx, ip, &mut hop) {
        Path::Redirect => {
            translate(ip, icmp, inner, ports, &flow);
            count(Counter::IcmpTranslated);
            send(ctx, eth, ip, &hop)
        }
        Path::Kernel(reason) => {
            count(reason);
            xdp_action::XDP_PASS
        }
    }
}

/// Applies `flow`'s translation to the quoted packet and, where the outer header names
/// the quoted endpoint, to the outer header.
///
/// # Safety
/// All pointers must point into the packet, bounds-checked.
#[inline(always)]
unsafe fn translate(
    ip: *mut Ipv4,
    icmp: *mut Icmp,
    inner: *mut Ipv4,
    ports: *mut Ports,
    flow: &Flow,
) {
    // A NAT_DST flow (client → gateway) quotes a reply: restore its source to the
    // backend. A NAT_SRC flow (backend → client) quotes a forwarded packet: restore its
    // destination to the gateway address. The outer header gets the flow's own
    // translation when it names the quoted endpoint.
    let (inner_addr, inner_port, outer_addr) = if flow.kind == NAT_DST {
        (&mut (*inner).src, &mut (*ports).src, &mut (*ip).dst)
    } else {
        (&mut (*inner).dst, &mut (*ports).dst, &mut (*ip).src)
    };
    let old_addr = *inner_addr;
    let old_port = *inner_port;
    let old_inner_check = (*inner).check;
    *inner_addr = flow.nat_addr;
    *inner_port = flow.nat_port;
    (*inner).check = replace4(old_inner_check, old_addr, flow.nat_addr);

    // The ICMP checksum covers the quoted bytes (no pseudo-header). Quoted L4
    // checksums are left alone: receivers do not verify them.
    let mut check = replace4((*icmp).check, old_addr, flow.nat_addr);
    check = replace2(check, old_port, flow.nat_port);
    (*icmp).check = replace2(check, old_inner_check, (*inner).check);

    if *outer_addr == old_addr {
        *outer_addr = flow.nat_addr;
        (*ip).check = replace4((*ip).check, old_addr, flow.nat_addr);
    }
}
