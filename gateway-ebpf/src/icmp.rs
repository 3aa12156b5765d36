//! ICMP and ICMPv6 errors about NATed flows (destination unreachable, including
//! "fragmentation needed" and IPv6's "packet too big" for PMTU discovery, time
//! exceeded, and parameter problem, whose pointer into the quote the translation does
//! not move) are translated like the packet they quote, so the sender of the quoted
//! packet recognises it. One generic body serves both families (`Family`): IPv4 keeps
//! the quoted header's checksum right; IPv6 keeps the quoted transport checksum right
//! and the ICMPv6 checksum, which also covers the outer addresses.

use aya_ebpf::{bindings::xdp_action, programs::XdpContext};
use gateway_common::{proto, Counter, NextHop, NAT_MASQ};

use crate::{
    conntrack::{add_kernel_path_entries, applies, find, tuple, NoEntry, Spoofed},
    csum::replace2,
    family::Family,
    fwd::{coarse_now, path, send, Path},
    maps::{count, is_gateway_address},
    nat::{halves, Endpoint, Side},
    origin::Origin,
    packet::{ptr_at, Eth, FragHdr, Icmp, Ports, TCP_CHECK_OFF, UDP_CHECK_OFF},
};

/// Handles an unfragmented ICMP (ICMPv6) packet whose ICMP header starts at `l4_off`
/// and whose IP packet ends at `end` (both from the start of the frame).
///
/// # Safety
/// `eth` and `ip` must point into the packet, bounds-checked.
#[inline(always)]
pub unsafe fn handle<A: Family>(
    ctx: &XdpContext,
    eth: *mut Eth,
    ip: *mut A::Hdr,
    l4_off: usize,
    end: usize,
) -> u32 {
    let pass = xdp_action::XDP_PASS;
    let Some(icmp) = ptr_at::<Icmp>(ctx, l4_off) else {
        return pass;
    };
    if !A::icmp_error((*icmp).kind) {
        return pass;
    }
    let inner_off = l4_off + core::mem::size_of::<Icmp>();
    let Some(inner) = ptr_at::<A::Hdr>(ctx, inner_off) else {
        return untranslated::<A>(ip);
    };
    let after = inner_off + core::mem::size_of::<A::Hdr>();
    let frag_at = |off| ptr_at::<FragHdr>(ctx, off).map(|f| *f);
    let Some((inner_proto, ports_off)) = quoted_transport::<A>(inner, after, frag_at) else {
        return untranslated::<A>(ip);
    };
    // Two offsets are possible; LLVM would specialise the bounds checks below per offset
    // and merge them, which the verifier cannot follow. Hidden, the offset is one value
    // whose every use is checked.
    let ports_off = core::hint::black_box(ports_off);
    let Some(ports) = ptr_at::<Ports>(ctx, ports_off) else {
        return untranslated::<A>(ip);
    };
    // A quote past the IP total length (in the frame's padding) is not part of the
    // message, and the ICMP checksum does not cover it.
    if ports_off + core::mem::size_of::<Ports>() > end {
        return untranslated::<A>(ip);
    }
    let l4_check = if A::QUOTE_L4_CHECK {
        let off = ports_off + quoted_check_off(inner_proto);
        match ptr_at::<u16>(ctx, off) {
            Some(check) if off + 2 <= end => Some(check),
            _ => None,
        }
    } else {
        None
    };
    // The quoted packet travelled opposite to this error: its reversed tuple is the
    // tuple of this error's direction.
    let (inner_src, inner_dst) = A::addrs(inner);
    let key = tuple(
        (inner_dst, (*ports).dst),
        (inner_src, (*ports).src),
        inner_proto,
    );
    // An error about a packet sent to a backend must come from where the backend is.
    let flow = match find(&key, NoEntry::Leave, &Origin::xdp(ctx, eth)) {
        Ok(Some(flow)) => flow,
        Ok(None) => return untranslated::<A>(ip),
        Err(Spoofed) => {
            count(Counter::ReplySpoofed);
            return xdp_action::XDP_DROP;
        }
    };

    // A `NAT_MASQ` entry is the TC program's.
    if flow.kind == NAT_MASQ {
        return pass;
    }
    if !applies(&key, &flow) {
        count(Counter::CtStaleService);
        return pass;
    }
    let quote = Quote {
        ip,
        icmp,
        inner,
        ports,
        l4_check,
    };
    // Errors are rare: they use their own next-hop lookup, not the flow's cache. As for
    // any packet of the flow (`translate` in main.rs), the destination half is applied
    // whichever way the error leaves, the source half only if XDP sends it itself.
    let (dst, src) = halves(&flow);
    if let Some(dst) = dst {
        translate(&quote, Side::Dst, dst);
    }
    let mut hop = NextHop::default();
    match path::<A>(ctx, ip, &mut hop, coarse_now()) {
        Path::Redirect => {
            if let Some(src) = src {
                translate(&quote, Side::Src, src);
            }
            count(Counter::IcmpTranslated);
            send::<A>(ctx, eth, ip, &hop)
        }
        other => {
            let reason = other.kernel_reason();
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

/// An ICMP error XDP leaves to the kernel untranslated: counted (`icmp_untranslated`)
/// if it was addressed to a gateway address, so about Berth's traffic, which only Berth
/// could have translated. (An error about a forward packet is addressed to its client
/// or node address, which the host cannot tell from others: not counted.)
///
/// # Safety
/// `ip` must point to a whole header, bounds-checked.
#[inline(always)]
unsafe fn untranslated<A: Family>(ip: *const A::Hdr) -> u32 {
    if is_gateway_address(A::addrs(ip).1) {
        count(Counter::IcmpUntranslated);
    }
    xdp_action::XDP_PASS
}

/// The transport protocol of the packet an ICMP error quotes, and the offset of its TCP
/// or UDP header: right after the quoted network header, which ends at `after`; or
/// (IPv6) after a fragment header, if the quote is of a first fragment. A router that
/// cannot forward a fragment of a large datagram (a DNS answer over IPv6) quotes it so,
/// and the fragment's sender must get the packet too big to send smaller fragments.
/// `frag_at(off)` reads a fragment header at `off`, bounds-checked.
///
/// # Safety
/// `inner` must point to a whole header, bounds-checked.
#[inline(always)]
pub unsafe fn quoted_transport<A: Family>(
    inner: *const A::Hdr,
    after: usize,
    frag_at: impl FnOnce(usize) -> Option<FragHdr>,
) -> Option<(u8, usize)> {
    if let Some(p) = A::quoted_proto(inner) {
        return Some((p, after));
    }
    if !A::quotes_fragment(inner) {
        return None;
    }
    let f = frag_at(after)?;
    // Offset 0 (more fragments or not): the transport header is in this fragment.
    let first = u16::from_be(f.frag) & 0xfff8 == 0;
    let p = f.next_hdr;
    (first && (p == proto::TCP || p == proto::UDP))
        .then_some((p, after + core::mem::size_of::<FragHdr>()))
}

/// The offset of the transport checksum in a quoted TCP or UDP header.
#[inline(always)]
pub fn quoted_check_off(proto: u8) -> usize {
    if proto == proto::UDP {
        UDP_CHECK_OFF
    } else {
        TCP_CHECK_OFF
    }
}

/// The parts of an ICMP error a translation rewrites: in the packet (XDP) or copies
/// of it (TC).
pub struct Quote<A: Family> {
    /// The outer network header.
    pub ip: *mut A::Hdr,
    /// The ICMP header.
    pub icmp: *mut Icmp,
    /// The quoted network header.
    pub inner: *mut A::Hdr,
    /// The quoted ports.
    pub ports: *mut Ports,
    /// The quoted transport checksum, where it is kept right (`Family::QUOTE_L4_CHECK`)
    /// and quoted.
    pub l4_check: Option<*mut u16>,
}

/// Applies one half of a flow's translation (`side` of packets in the error's
/// direction) to an ICMP error: the quoted packet travelled the other way, so the half
/// that rewrites the error's destination rewrites the quote's source, and the other way
/// round; the outer address is rewritten too where it names the quoted endpoint.
///
/// # Safety
/// All pointers in `q` must point to whole, valid values (bounds-checked, if in the
/// packet).
#[inline(always)]
pub unsafe fn translate<A: Family>(q: &Quote<A>, side: Side, to: Endpoint<A>) {
    let (inner_side, port) = if side == Side::Dst {
        (Side::Src, &mut (*q.ports).src)
    } else {
        (Side::Dst, &mut (*q.ports).dst)
    };
    let old_hdr_check = A::hdr_check(q.inner);
    let old_addr = A::set_addr(q.inner, inner_side, to.addr);
    let old_port = *port;
    *port = to.port;

    // The ICMP checksum covers the quoted bytes (ICMPv6's the pseudo-header too).
    let mut check = A::csum_addr((*q.icmp).check, old_addr, to.addr);
    check = replace2(check, old_port, to.port);
    check = replace2(check, old_hdr_check, A::hdr_check(q.inner));
    if let Some(l4_check) = q.l4_check {
        let old = *l4_check;
        let new = replace2(A::csum_addr(old, old_addr, to.addr), old_port, to.port);
        *l4_check = new;
        check = replace2(check, old, new);
    }

    let (outer_src, outer_dst) = A::addrs(q.ip);
    let outer = if side == Side::Dst {
        outer_dst
    } else {
        outer_src
    };
    if outer == old_addr {
        A::set_addr(q.ip, side, to.addr);
        if A::ICMP_PSEUDO {
            check = A::csum_addr(check, old_addr, to.addr);
        }
    }
    (*q.icmp).check = check;
}
