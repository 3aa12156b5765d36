//! ICMP errors about NATed flows (destination unreachable, including "fragmentation
//! needed" for PMTU discovery, and time exceeded) are translated like the packet they
//! quote, so the sender of the quoted packet recognises it.

use aya_ebpf::{bindings::xdp_action, programs::XdpContext};
use gateway_common::{proto, Counter, FlowKey, NextHop, NAT_MASQ};

use crate::{
    conntrack::{add_kernel_path_entries, applies, find},
    csum::{replace2, replace4},
    fwd::{coarse_now, path, send, Path},
    maps::count,
    nat::{halves, Endpoint, Side},
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
    let Some(flow) = find(&key) else {
        return pass;
    };
    // A `NAT_MASQ` entry is the TC program's.
    if flow.kind == NAT_MASQ {
        return pass;
    }
    if !applies(&key, &flow) {
        count(Counter::CtStaleService);
        return pass;
    }
    // Errors are rare: they use their own next-hop lookup, not the flow's cache. As for
    // any packet of the flow (`translate` in main.rs), the destination half is applied
    // whichever way the error leaves, the source half only if XDP sends it itself.
    let (dst, src) = halves(&flow);
    if let Some(dst) = dst {
        translate(ip, icmp, inner, ports, Side::Dst, dst);
    }
    let mut hop = NextHop::default();
    match path::<u32>(ctx, ip, &mut hop, coarse_now()) {
        Path::Redirect => {
            if let Some(src) = src {
                translate(ip, icmp, inner, ports, Side::Src, src);
            }
            count(Counter::IcmpTranslated);
            send::<u32>(ctx, eth, ip, &hop)
        }
        Path::Kernel(reason) => {
            if dst.is_some() {
                count(Counter::IcmpTranslated);
            }
            if flow.is_snat() {
                add_kernel_path_entries(&key, &flow);
            }
            count(reason);
            xdp_action::XDP_PASS
        }
    }
}

/// Applies one half of a flow's translation (`side` of packets in the error's
/// direction) to an ICMP error: the quoted packet travelled the other way, so the half
/// that rewrites the error's destination rewrites the quote's source, and the other way
/// round; the outer address is rewritten too where it names the quoted endpoint.
///
/// # Safety
/// All pointers must point into the packet, bounds-checked.
#[inline(always)]
unsafe fn translate(
    ip: *mut Ipv4,
    icmp: *mut Icmp,
    inner: *mut Ipv4,
    ports: *mut Ports,
    side: Side,
    to: Endpoint,
) {
    let (inner_addr, inner_port, outer_addr) = if side == Side::Dst {
        (&mut (*inner).src, &mut (*ports).src, &mut (*ip).dst)
    } else {
        (&mut (*inner).dst, &mut (*ports).dst, &mut (*ip).src)
    };
    let old_addr = *inner_addr;
    let old_port = *inner_port;
    let old_inner_check = (*inner).check;
    *inner_addr = to.addr;
    *inner_port = to.port;
    (*inner).check = replace4(old_inner_check, old_addr, to.addr);

    // The ICMP checksum covers the quoted bytes (no pseudo-header). Quoted L4
    // checksums are left alone: receivers do not verify them.
    let mut check = replace4((*icmp).check, old_addr, to.addr);
    check = replace2(check, old_port, to.port);
    (*icmp).check = replace2(check, old_inner_check, (*inner).check);

    if *outer_addr == old_addr {
        *outer_addr = to.addr;
        (*ip).check = replace4((*ip).check, old_addr, to.addr);
    }
}
