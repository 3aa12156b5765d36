//! The egress half of reverse NAT: replies (and ICMP errors about forwarded packets)
//! that the kernel forwarded untranslated are translated as they leave an
//! `--interface`. They reach the kernel that way when they arrived on an interface
//! without Berth's XDP program (a pod veth, a bridge port, a tunnel), or when XDP could
//! not send them itself and passed them up untouched; and the ICMP errors the gateway's
//! own kernel sends about a translated packet (fragmentation needed, TTL exceeded)
//! quote the backend's address, which only this program sees.
//!
//! A reply whose flow has no entry (begun on another gateway behind the same ECMP route)
//! is matched by Maglev and its flow recorded, as in XDP (`conntrack::NoEntry::Maglev`);
//! an ICMP error only about a flow with an entry (`NoEntry::Leave`).
//!
//! Packets are read and written with the skb helpers: `bpf_l4_csum_replace` keeps
//! checksums right also for `CHECKSUM_PARTIAL` packets (checksum offload, GSO), where
//! only the pseudo-header part of the checksum field may change. Replies XDP translated
//! itself never come here: XDP sends them by redirect, which bypasses egress TC, and
//! their tuple (gateway → client) has no `NAT_SRC` entry anyway.
//!
//! Both families run one generic body (`Family`); IPv6 in `berth_tc_v6`, entered by
//! tail call (its own stack). An IPv6 address is given to the checksum helpers a
//! 32-bit word at a time; ICMP errors are translated by `icmp::translate` on copies of
//! their headers, written back whole (ICMP is never checksum-offloaded).

use aya_ebpf::{
    bindings::{BPF_F_MARK_MANGLED_0, BPF_F_PSEUDO_HDR},
    programs::TcContext,
};
use gateway_common::{
    proto::{self, ipv6_ext},
    Counter, Flow, FlowKey, NAT_MASQ, NAT_SRC, TCP_STATE_FLAGS,
};

use crate::{
    conntrack::{applies, find, holds_port, note_reply_tcp, tuple, NoEntry, Spoofed},
    family::Family,
    frag,
    fwd::coarse_now,
    icmp::{quoted_check_off, quoted_transport, translate, Quote},
    maps::{account, account_kernel, count, Addr6, Direction, PROG_TC_ICMP6, PROG_V6, TC_PROGRAMS},
    nat::{Endpoint, Side},
    origin::Origin,
    packet::{
        FragHdr, Icmp, Ipv4, Ipv6, Ports, ETH_LEN, ETH_P_IP, ETH_P_IPV6, IPV4_MIN_LEN, IPV6_LEN,
        IP_MF, IP_OFFSET, TCP_CHECK_OFF, UDP_CHECK_OFF,
    },
};

/// Why a packet was not translated.
pub enum Stop {
    /// A helper failed or the packet is too short: leave it as it is.
    Untouched,
    /// A forged reply (or ICMP error) of a flow (`reply_spoofed`, counted): drop it.
    Drop,
}

use Stop::Untouched;

/// Translates the packet if it is a reply of a tracked flow, or an ICMP error quoting a
/// translated forward packet. IPv6 frames go on to `berth_tc_v6` by tail call
/// (`maps::TC_PROGRAMS`): its own stack, as the XDP program's IPv6 half.
#[inline(always)]
pub fn egress(ctx: &TcContext) -> Result<(), Stop> {
    let ether_type: u16 = ctx.load(12).map_err(|_| Untouched)?;
    if ether_type != ETH_P_IP {
        if ether_type == ETH_P_IPV6 {
            // SAFETY: a tail call into the IPv6 program; returns only if it failed.
            unsafe { TC_PROGRAMS.tail_call(ctx, PROG_V6) };
            count(Counter::Ipv6NoProgram);
        }
        return Ok(());
    }
    let ip: Ipv4 = ctx.load(ETH_LEN).map_err(|_| Untouched)?;
    if ip.vihl >> 4 != 4 || ((ip.vihl & 0x0f) as usize) * 4 < IPV4_MIN_LEN {
        return Ok(());
    }
    let l4_off = ETH_LEN + ((ip.vihl & 0x0f) as usize) * 4;
    let frag = u16::from_be(ip.frag);
    let len = u16::from_be(ip.tot_len);
    match ip.proto {
        proto::TCP | proto::UDP => {}
        proto::ICMP if frag & (IP_MF | IP_OFFSET) == 0 => {
            return icmp_error::<u32>(ctx, l4_off, ETH_LEN + len as usize)
        }
        _ => return Ok(()),
    }
    // A later fragment carries no ports: its first fragment left them.
    let later = frag & IP_OFFSET != 0;
    let first_of_more = frag & IP_MF != 0 && !later;
    let id = u32::from(ip.id);
    let datagram = (ip.src, ip.dst, ip.proto, id);
    translate_packet(ctx, datagram, (later, first_of_more), l4_off, len)
}

/// The IPv6 half of `egress` (run by `berth_tc_v6`): the same translations, and
/// fragments as IPv4's (a fragment header right after the IPv6 header, as a host's
/// stack sends it: the first fragment's ports are remembered in `berth_frags6`, later
/// fragments follow). A packet with other extension headers passes untouched.
#[inline(always)]
pub fn egress6(ctx: &TcContext) -> Result<(), Stop> {
    let ip: Ipv6 = ctx.load(ETH_LEN).map_err(|_| Untouched)?;
    if ip.vtc_flow & 0xf0 != 0x60 {
        return Ok(());
    }
    let mut l4_off = ETH_LEN + IPV6_LEN;
    let len = u16::from_be(ip.payload_len).wrapping_add(IPV6_LEN as u16);
    let mut next = ip.next_hdr;
    // The fragment header's offset-and-flags word (host order) and identification.
    let (mut frag, mut id) = (0u16, 0u32);
    if next == ipv6_ext::FRAGMENT {
        let f: FragHdr = ctx.load(l4_off).map_err(|_| Untouched)?;
        (next, frag, id) = (f.next_hdr, u16::from_be(f.frag), f.id);
        l4_off += core::mem::size_of::<FragHdr>();
    }
    match next {
        proto::TCP | proto::UDP => {}
        proto::ICMPV6 if frag == 0 => {
            // SAFETY: a tail call into the ICMPv6 part; returns only if it failed.
            unsafe { TC_PROGRAMS.tail_call(ctx, PROG_TC_ICMP6) };
            count(Counter::Ipv6NoProgram);
            return Ok(());
        }
        _ => return Ok(()),
    }
    // A later fragment carries no ports: its first fragment left them.
    let later = frag & 0xfff8 != 0;
    let first_of_more = frag & 1 != 0 && !later;
    translate_packet(
        ctx,
        (ip.src, ip.dst, next, id),
        (later, first_of_more),
        l4_off,
        len,
    )
}

/// Applies the source half of its flow, if it has one, to a TCP or UDP packet of
/// datagram (source, destination, protocol, identification) whose transport header
/// is at `l4_off` (`later`: a later fragment, whose first fragment's ports are looked
/// up; `first_of_more`: a first fragment, whose ports are remembered) and whose IP
/// length is `len`.
#[inline(always)]
fn translate_packet<A: Family>(
    ctx: &TcContext,
    (src, dst, proto, id): (A, A, u8, u32),
    (later, first_of_more): (bool, bool),
    l4_off: usize,
    len: u16,
) -> Result<(), Stop> {
    let ports = if later {
        match A::fragment_ports(src, dst, id, proto) {
            Some(p) => Ports {
                src: p.sport,
                dst: p.dport,
            },
            None => return Ok(()),
        }
    } else {
        ctx.load::<Ports>(l4_off).map_err(|_| Untouched)?
    };
    let key = tuple((src, ports.src), (dst, ports.dst), proto);
    let Some(flow) = flow_of(ctx, &key, NoEntry::Maglev)? else {
        return Ok(());
    };
    if first_of_more {
        frag::remember(&key, id);
    }
    // A reply's TCP state (the forward packets' XDP noted).
    if !later && proto == proto::TCP && flow.kind == NAT_SRC {
        let flags: u8 = ctx.load(l4_off + TCP_FLAGS_OFF).map_err(|_| Untouched)?;
        if flags & TCP_STATE_FLAGS != 0 {
            note_reply_tcp(&key, &flow, flags, coarse_now());
        }
    }
    translate_source(ctx, &key, &flow, l4_off, !later, len)
}

/// Offset of the flags byte in a TCP header.
const TCP_FLAGS_OFF: usize = 13;

/// The ICMPv6 part of `egress6` (run by `berth_tc_icmp6`): an ICMPv6 error right
/// after the IPv6 header (a fragmented one is not parsed, as for IPv4).
#[inline(always)]
pub fn icmp6(ctx: &TcContext) -> Result<(), Stop> {
    let ip: Ipv6 = ctx.load(ETH_LEN).map_err(|_| Untouched)?;
    if ip.next_hdr != proto::ICMPV6 {
        return Ok(());
    }
    let len = usize::from(u16::from_be(ip.payload_len)) + IPV6_LEN;
    icmp_error::<Addr6>(ctx, ETH_LEN + IPV6_LEN, ETH_LEN + len)
}

/// ICMPv6 type "redirect" (RFC 4861 8).
const ICMPV6_REDIRECT: u8 = 137;

/// Whether the frame is an ICMPv6 redirect, which the host sends when it forwards a
/// packet back out of the interface it came in on: to a backend of a one-armed gateway
/// it says "reach the client directly", and the replies would then bypass the NAT.
/// (Redirects are link-local: every one leaving here is the host's own.) Counted.
#[inline(always)]
pub fn is_redirect(ctx: &TcContext) -> bool {
    let icmp: Result<Icmp, _> = ctx.load(ETH_LEN + IPV6_LEN);
    let redirect = icmp.is_ok_and(|i| i.kind == ICMPV6_REDIRECT);
    if redirect {
        count(Counter::TcRedirectDropped);
    }
    redirect
}

/// The flow whose source half this program applies to a packet with tuple `key`, if
/// it still applies; a reply whose flow has no entry as `no_entry` says (`find`). A
/// reply that the kernel received elsewhere than where its backend is (the interface
/// toward it, `origin.rs`) is `Stop::Drop` (`reply_spoofed`): here its MAC is gone.
#[inline(always)]
fn flow_of<A: Family>(
    ctx: &TcContext,
    key: &FlowKey<A>,
    no_entry: NoEntry,
) -> Result<Option<Flow<A>>, Stop> {
    let Some(flow) = find(key, no_entry, &Origin::tc(ctx)).map_err(|Spoofed| {
        count(Counter::ReplySpoofed);
        Stop::Drop
    })?
    else {
        return Ok(None);
    };
    if !rewrites_source_on_egress(&flow) {
        return Ok(None);
    }
    if !applies(key, &flow) {
        count(Counter::CtStaleService);
        return Ok(None);
    }
    // A `NAT_MASQ` entry left by a flow that lost its node port (or by an earlier flow
    // of the tuple): the port may be another flow's now (found by the fuzzer).
    if flow.kind == NAT_MASQ && !holds_port(key, &flow) {
        count(Counter::TcUntranslated);
        return Ok(None);
    }
    Ok(Some(flow))
}

/// Applies `flow`'s source half to a packet with tuple `key` whose transport header
/// (`with_l4`: present, not a later fragment) is at `l4_off` and whose IP length is
/// `len`, and counts it.
#[inline(always)]
fn translate_source<A: Family>(
    ctx: &TcContext,
    key: &FlowKey<A>,
    flow: &Flow<A>,
    l4_off: usize,
    with_l4: bool,
    len: u16,
) -> Result<(), Stop> {
    let udp = key.proto == proto::UDP;
    let check = if udp { UDP_CHECK_OFF } else { TCP_CHECK_OFF };
    snat(
        ctx,
        key.src,
        with_l4.then_some(l4_off + check),
        l4_off,
        flow,
        udp,
    )
    .inspect_err(|_| count(Counter::TcUntranslated))?;
    if flow.kind == NAT_MASQ {
        // A forward packet: XDP accounted it already.
        count(Counter::TcMasq);
        return Ok(());
    }
    account(
        flow.service,
        flow.backend,
        Direction::Reply,
        len as u64,
        false,
    );
    account_kernel(flow.service, Counter::TcReply);
    count(Counter::TcReply);
    Ok(())
}

/// Whether the entry is one this program applies: a router-mode reply entry (source
/// becomes the gateway), or a SNAT forward packet's `NAT_MASQ` entry (source becomes
/// the node). Both rewrite the source to `nat_*`. A SNAT flow's reply entry (keyed by
/// the node's address, which the kernel delivers locally) is XDP's only.
#[inline(always)]
fn rewrites_source_on_egress<A: Family>(flow: &Flow<A>) -> bool {
    (flow.kind == NAT_SRC && !flow.is_snat()) || flow.kind == NAT_MASQ
}

/// Rewrites the source address `old` (and, with a transport header whose checksum is
/// at `check_off`, the source port) to the flow's.
#[inline(always)]
fn snat<A: Family>(
    ctx: &TcContext,
    old: A,
    check_off: Option<usize>,
    l4_off: usize,
    flow: &Flow<A>,
    udp: bool,
) -> Result<(), Stop> {
    let e = |_| Untouched;
    // Nothing is written unless the checksum is in the packet too: a transport header
    // cut short (a tiny first fragment) would be left half translated.
    if let Some(check_off) = check_off {
        ctx.load::<u16>(check_off).map_err(e)?;
    }
    ctx.store(ETH_LEN + A::SRC_OFF, &flow.nat_addr, 0)
        .map_err(e)?;
    // UDP: a zero checksum means "none" and stays zero; a computed zero is sent as 0xffff.
    let mangled = if udp { BPF_F_MARK_MANGLED_0 as u64 } else { 0 };
    for i in 0..A::WORDS {
        let (from, to) = (old.word(i) as u64, flow.nat_addr.word(i) as u64);
        if let Some(hdr_check) = A::HDR_CHECK_OFF {
            ctx.l3_csum_replace(ETH_LEN + hdr_check, from, to, 4)
                .map_err(e)?;
        }
        if let Some(check_off) = check_off {
            ctx.l4_csum_replace(check_off, from, to, BPF_F_PSEUDO_HDR as u64 | mangled | 4)
                .map_err(e)?;
        }
    }
    let Some(check_off) = check_off else {
        return Ok(());
    };
    let old_port: u16 = ctx.load(l4_off).map_err(e)?;
    ctx.store(l4_off, &flow.nat_port, 0).map_err(e)?;
    ctx.l4_csum_replace(
        check_off,
        old_port as u64,
        flow.nat_port as u64,
        mangled | 2,
    )
    .map_err(e)
}

/// An ICMP (ICMPv6) error quoting a packet as the kernel forwarded it: a forward packet
/// as translated (client → backend), whose quoted destination becomes the gateway
/// address and port again; or in SNAT mode a reply with its destination translated
/// (backend → client), whose quoted destination becomes the node's address and port.
/// The outer source too, if the quoted destination itself sent the error. Its ICMP
/// header starts at `l4_off`, its IP packet ends at `end` (from the start of the
/// frame).
#[inline(always)]
fn icmp_error<A: Family>(ctx: &TcContext, l4_off: usize, end: usize) -> Result<(), Stop> {
    let e = |_| Untouched;
    let mut icmp: Icmp = ctx.load(l4_off).map_err(e)?;
    if !A::icmp_error(icmp.kind) {
        return Ok(());
    }
    let inner_off = l4_off + core::mem::size_of::<Icmp>();
    let mut inner: A::Hdr = ctx.load(inner_off).map_err(e)?;
    let after = inner_off + core::mem::size_of::<A::Hdr>();
    let frag_at = |off| ctx.load::<FragHdr>(off).ok();
    // SAFETY: a whole header, on the stack.
    let Some((inner_proto, ports_off)) = (unsafe { quoted_transport::<A>(&inner, after, frag_at) })
    else {
        return Ok(());
    };
    let mut ports: Ports = ctx.load(ports_off).map_err(e)?;
    // SAFETY: as above.
    let (inner_src, inner_dst) = unsafe { A::addrs(&inner) };
    // The quoted packet travelled opposite to this error.
    let key = tuple((inner_dst, ports.dst), (inner_src, ports.src), inner_proto);
    let Some(flow) = flow_of(ctx, &key, NoEntry::Leave)? else {
        return Ok(());
    };
    let mut ip: A::Hdr = ctx.load(ETH_LEN).map_err(e)?;
    let check_off = ports_off + quoted_check_off(inner_proto);
    let mut l4_check: u16 = 0;
    let quoted_check = A::QUOTE_L4_CHECK
        && check_off + 2 <= end
        && ctx.load(check_off).map(|c| l4_check = c).is_ok();
    // The translation is computed on copies and written back whole (ICMP is never
    // checksum-offloaded); after the flow was found, a failed write leaves a packet of
    // ours untranslated.
    let quote = Quote {
        ip: &mut ip,
        icmp: &mut icmp,
        inner: &mut inner,
        ports: &mut ports,
        l4_check: quoted_check.then_some(&raw mut l4_check),
    };
    let to = Endpoint {
        addr: flow.nat_addr,
        port: flow.nat_port,
    };
    // SAFETY: every pointer in `quote` is to a local.
    unsafe { translate(&quote, Side::Src, to) };
    let written = (|| -> Result<(), Stop> {
        ctx.store(ETH_LEN, &ip, 0).map_err(e)?;
        ctx.store(l4_off, &icmp, 0).map_err(e)?;
        ctx.store(inner_off, &inner, 0).map_err(e)?;
        ctx.store(ports_off, &ports, 0).map_err(e)?;
        if quoted_check {
            ctx.store(check_off, &l4_check, 0).map_err(e)?;
        }
        Ok(())
    })();
    written.inspect_err(|_| count(Counter::TcUntranslated))?;
    count(Counter::TcIcmp);
    Ok(())
}
