//! The IPv6 packet walk, run by `berth_v6` (entered by tail call from the gateway
//! program, so it has a stack of its own). After the header and the extension headers
//! it is the IPv4 walk: roles, conntrack, NAT and forwarding are the same generic code
//! (`family.rs`).
//!
//! ICMPv6 goes on to `berth_icmp6` by tail call (`try_icmp`): errors (destination
//! unreachable, packet too big, time exceeded, parameter problem) about a flow are
//! translated by the code that translates ICMP errors (`icmp.rs`); neighbour discovery
//! and echo pass untouched. Fragments follow their first fragment as IPv4's do (`frag.rs`,
//! `berth_frags6`).

use aya_ebpf::programs::XdpContext;
use gateway_common::{
    proto::{self, ipv6_ext},
    Counter, FlowKey,
};

use crate::{
    conntrack::{lookup_or_balance, Found, MIDFLOW},
    family::Family,
    frag, icmp, malformed,
    maps::{count, is_gateway_address, opaque, Addr6, Roles, PROGRAMS, PROG_ICMP6, TUPLE6},
    nat::L4,
    origin::Origin,
    packet::{ptr_at, Eth, ExtHdr, FragHdr, Ipv6, ETH_LEN, IPV6_LEN},
    translate, Packet, PASS,
};

/// Extension headers walked before the transport header; a longer chain is not parsed.
const MAX_EXT_HEADERS: usize = 6;

/// Every offset the walk reaches is below this (6 headers of at most 2048 bytes after
/// 54): masking with it changes no value.
const OFF_MASK: usize = 0x3fff;

/// Handles one IPv6 frame, in stages: the header (`fields`, `end`; ICMPv6 goes on to
/// `berth_icmp6`, `to_icmp6`), the extension headers (`walk`), the transport protocol
/// (`transport`) and header (`L4::at`; a later fragment's ports, as its first fragment
/// remembered them), the tuple (`flow_key`), then the flow as IPv4's (`lookup_or_balance`,
/// `translate`).
#[inline(always)]
pub fn try_berth(ctx: &XdpContext) -> Result<u32, Counter> {
    let Some(eth) = ptr_at::<Eth>(ctx, 0) else {
        return PASS;
    };
    let Some(ip) = ptr_at::<Ipv6>(ctx, ETH_LEN) else {
        return PASS;
    };
    // SAFETY: `ip` comes from `ptr_at`.
    let (vtc, payload_len, first, src, dst) = unsafe { fields(ip) };
    if first == proto::ICMPV6 {
        // An ICMPv6 error about a flow is addressed to its client or backend, which have
        // no role: ICMPv6 is not filtered by roles (as ICMP in `try_berth`). One after
        // extension headers is left to the kernel.
        return to_icmp6(ctx);
    }
    // Looked up again, not handed over: docs/benchmarks.md, "Issue 33's end".
    let roles = Roles::of(src, dst);
    if roles.none() {
        return PASS;
    }
    let Some(end) = end(ctx, vtc, payload_len) else {
        return malformed(dst);
    };

    let Some(Chain {
        next,
        off,
        frag,
        frag_id,
    }) = walk(ctx, first)
    else {
        return malformed(dst);
    };
    let later = frag & 0xfff8 != 0;
    // ICMPv6 after extension headers is the kernel's (echo, neighbour discovery).
    if next == proto::ICMPV6 {
        return PASS;
    }
    let Some(udp) = transport(next, later) else {
        return malformed(dst);
    };
    if off > end {
        return malformed(dst);
    }
    // Offset (8-byte units) in the high 13 bits, more-fragments in the lowest: an
    // atomic fragment (offset 0, no more) is a whole packet. A later fragment carries
    // no transport header: it follows the flow its first fragment took, whose ports
    // were remembered (one path for both, so `translate` is inlined once).
    let first_fragment = !later && frag & 1 != 0;
    let l4 = if later {
        None
    } else {
        match L4::at(ctx, off, end, udp) {
            Some(l4) => Some(l4),
            None => return malformed(dst),
        }
    };
    // The transport protocol: a later fragment whose fragment header names an
    // extension header was remembered under TCP or UDP by its first fragment.
    let mut proto = next;
    let (sport, dport, flags) = match &l4 {
        Some(l4) => {
            let (sport, dport, check, flags) = l4.fields();
            // A zero UDP checksum is invalid in IPv6 (RFC 8200 8.1): never forwarded.
            if udp && check == 0 {
                return malformed(dst);
            }
            (sport, dport, flags)
        }
        None => {
            if proto != proto::UDP {
                proto = proto::TCP;
            }
            // One lookup site, tried at most twice (a second site's key would not fit
            // on the stack).
            let ports = loop {
                match Addr6::fragment_ports(src, dst, frag_id, proto) {
                    Some(p) => break Some(p),
                    None if proto == proto::TCP && next != proto::TCP => proto = proto::UDP,
                    None => break None,
                }
            };
            match ports {
                Some(p) => (p.sport, p.dport, MIDFLOW),
                None if is_gateway_address(dst) => return Err(Counter::DropFragment),
                None => return PASS,
            }
        }
    };
    let Some(t) = flow_key(src, dst, sport, dport, proto) else {
        return PASS;
    };
    let Some(new) = Family::scratch() else {
        return PASS;
    };
    // SAFETY: `eth` comes from `ptr_at`.
    let origin = unsafe { Origin::xdp(ctx, eth) };
    let found = lookup_or_balance(t, roles, flags, &origin, new)?;
    if found.found == Found::Miss {
        if first_fragment && is_gateway_address(dst) {
            frag::remember(t, frag_id);
        }
        return PASS;
    }
    if first_fragment {
        frag::remember(t, frag_id);
    }
    if later {
        count(Counter::FragmentTranslated);
    }
    let pkt: Packet<Addr6> = Packet {
        eth,
        ip,
        l4: l4.as_ref(),
        len: end - ETH_LEN,
    };
    // SAFETY: every pointer in `pkt` comes from `ptr_at`; `found` is this run's.
    Ok(unsafe { translate(ctx, &pkt, t, found, new) })
}

/// The IPv6 header's version-class-label word, payload length (host order), next
/// header, source and destination.
///
/// # Safety
/// `ip` must point into the packet, bounds-checked.
#[inline(always)]
unsafe fn fields(ip: *const Ipv6) -> (u32, usize, u8, Addr6, Addr6) {
    (
        (*ip).vtc_flow,
        u16::from_be((*ip).payload_len) as usize,
        (*ip).next_hdr,
        (*ip).src,
        (*ip).dst,
    )
}

/// Goes on to `berth_icmp6` by tail call; returns only if that failed.
#[inline(always)]
fn to_icmp6(ctx: &XdpContext) -> Result<u32, Counter> {
    // SAFETY: a tail call into the ICMPv6 program; returns only if it failed.
    unsafe { PROGRAMS.tail_call(ctx, PROG_ICMP6) };
    count(Counter::Ipv6NoProgram);
    PASS
}

/// Where the extension-header walk (`walk`) ends: the next header (the transport
/// protocol, or what ended the walk), its offset, and the fragment header's
/// offset-and-flags word (host order) and identification (both 0 without one).
struct Chain {
    next: u8,
    off: usize,
    frag: u16,
    frag_id: u32,
}

/// Walks the extension headers after the IPv6 header (`first`: its next header), at
/// most `MAX_EXT_HEADERS`; `None` if one is cut short (malformed).
#[inline(always)]
fn walk(ctx: &XdpContext, first: u8) -> Option<Chain> {
    let mut next = first;
    let mut off = ETH_LEN + IPV6_LEN;
    // The fragment header's offset-and-flags word (host order) and identification.
    let (mut frag, mut frag_id) = (0u16, 0u32);
    for _ in 0..MAX_EXT_HEADERS {
        match next {
            ipv6_ext::HOP_BY_HOP | ipv6_ext::ROUTING | ipv6_ext::DEST_OPTS | ipv6_ext::AUTH => {
                let h = ptr_at::<ExtHdr>(ctx, off)?;
                // SAFETY: `h` comes from `ptr_at`.
                let (n, len) = unsafe { ((*h).next_hdr, (*h).len as usize) };
                // AH counts 4-byte units after the first 8, the others 8-byte units.
                let size = if next == ipv6_ext::AUTH {
                    (len + 2) * 4
                } else {
                    (len + 1) * 8
                };
                off = (off + size) & OFF_MASK;
                next = n;
            }
            ipv6_ext::FRAGMENT => {
                let f = ptr_at::<FragHdr>(ctx, off)?;
                // SAFETY: `f` comes from `ptr_at`.
                let (n, word, id) = unsafe { ((*f).next_hdr, u16::from_be((*f).frag), (*f).id) };
                next = n;
                off = (off + core::mem::size_of::<FragHdr>()) & OFF_MASK;
                frag = word;
                frag_id = id;
                // A later fragment: what follows is the datagram's continuation, not
                // a header. (Walked on, the later fragments of a datagram with options
                // after its fragment header were read as headers and dropped.)
                if word & 0xfff8 != 0 {
                    break;
                }
            }
            _ => break,
        }
    }
    // Every chain of extension headers ends here with other bounds on `off` (and with
    // or without a fragment header); the verifier would check the rest of the program
    // once per chain (past its limit). Through a map slot the values are only known by
    // their width, the same for every chain, so the rest is checked once.
    let packed = opaque((off as u64) | (u64::from(frag) << 16) | (u64::from(frag_id) << 32));
    Some(Chain {
        next,
        off: (packed as usize) & OFF_MASK,
        frag: (packed >> 16) as u16,
        frag_id: (packed >> 32) as u32,
    })
}

/// The transport protocol after the extension headers (`next`; `later`: of a later
/// fragment): whether it is UDP (else TCP); `None` if it is none the program can find
/// (ICMPv6 is passed before, anything else is malformed).
#[inline(always)]
fn transport(next: u8, later: bool) -> Option<bool> {
    match next {
        proto::TCP => Some(false),
        proto::UDP => Some(true),
        // Headers of the fragmentable part (RFC 8200 4.5: destination options,
        // AH, routing) are in the first fragment only; a later fragment's transport
        // protocol is its first fragment's (`try_berth`).
        ipv6_ext::DEST_OPTS | ipv6_ext::AUTH | ipv6_ext::ROUTING if later => Some(false),
        ipv6_ext::HOP_BY_HOP
        | ipv6_ext::ROUTING
        | ipv6_ext::DEST_OPTS
        | ipv6_ext::AUTH
        | ipv6_ext::FRAGMENT => None,
        // No transport header the program can find (ESP, no next header, another
        // protocol): not for a service (docs/ipv6.md).
        _ => None,
    }
}

/// The packet's tuple, written to this CPU's slot (`TUPLE6`).
#[inline(always)]
fn flow_key(
    src: Addr6,
    dst: Addr6,
    sport: u16,
    dport: u16,
    proto: u8,
) -> Option<&'static FlowKey<Addr6>> {
    let t = TUPLE6.get_ptr_mut(0)?;
    // SAFETY: per-CPU slot, used only by this CPU while the program runs.
    let t = unsafe { &mut *t };
    (t.src, t.dst, t.sport, t.dport, t.proto, t.pad) = (src, dst, sport, dport, proto, [0; 3]);
    Some(t)
}

/// Handles an ICMPv6 frame (`berth_icmp6`): an error about a flow is translated like
/// the packet it quotes; everything else (neighbour discovery, echo) passes untouched.
#[inline(always)]
pub fn try_icmp(ctx: &XdpContext) -> Result<u32, Counter> {
    let (Some(eth), Some(ip)) = (ptr_at::<Eth>(ctx, 0), ptr_at::<Ipv6>(ctx, ETH_LEN)) else {
        return PASS;
    };
    // SAFETY: `ip` comes from `ptr_at`.
    let (vtc, payload_len) = unsafe { ((*ip).vtc_flow, u16::from_be((*ip).payload_len) as usize) };
    let Some(end) = end(ctx, vtc, payload_len) else {
        return PASS;
    };
    // SAFETY: `eth` and `ip` come from `ptr_at`.
    Ok(unsafe { icmp::handle::<Addr6>(ctx, eth, ip, ETH_LEN + IPV6_LEN, end) })
}

/// Where the IPv6 packet ends (from the start of the frame), if its header can be
/// parsed: the version is the high nibble of the first byte (the low byte of the word
/// as read); a payload length of 0 (a jumbogram) or past the frame is not parsed.
#[inline(always)]
fn end(ctx: &XdpContext, vtc: u32, payload_len: usize) -> Option<usize> {
    let end = ETH_LEN + IPV6_LEN + payload_len;
    (vtc & 0xf0 == 0x60 && payload_len != 0 && end <= ctx.data_end() - ctx.data()).then_some(end)
}
