//! The egress half of reverse NAT: replies (and ICMP errors about forwarded packets)
//! that the kernel forwarded untranslated are translated as they leave an
//! `--interface`. They reach the kernel that way when they arrived on an interface
//! without Berth's XDP program (a pod veth, a bridge port, a tunnel), or when XDP could
//! not send them itself and passed them up untouched; and the ICMP errors the gateway's
//! own kernel sends about a translated packet (fragmentation needed, TTL exceeded)
//! quote the backend's address, which only this program sees.
//!
//! Packets are read and written with the skb helpers: `bpf_l4_csum_replace` keeps
//! checksums right also for `CHECKSUM_PARTIAL` packets (checksum offload, GSO), where
//! only the pseudo-header part of the checksum field may change. Replies XDP translated
//! itself never come here: XDP sends them by redirect, which bypasses egress TC, and
//! their tuple (gateway → client) has no `NAT_SRC` entry anyway.

use aya_ebpf::{
    bindings::{BPF_F_MARK_MANGLED_0, BPF_F_PSEUDO_HDR},
    programs::TcContext,
};
use gateway_common::{proto, Counter, Flow, FlowKey, FragKey, FragPorts, NAT_MASQ, NAT_SRC};

use crate::{
    conntrack::{applies, find},
    csum::{replace2, replace4},
    icmp::{DEST_UNREACH, TIME_EXCEEDED},
    maps::{account, account_kernel, count, Direction, FRAGMENTS},
    packet::{
        Icmp, Ipv4, Ports, ETH_LEN, ETH_P_IP, IPV4_MIN_LEN, IP_MF, IP_OFFSET, TCP_CHECK_OFF,
        UDP_CHECK_OFF,
    },
};

/// Offsets of IPv4 header fields from the start of the frame.
const IP_CHECK: usize = ETH_LEN + 10;
const IP_SRC: usize = ETH_LEN + 12;

/// A helper failed or the packet is too short: leave it as it is.
pub struct Untouched;

/// Translates the packet if it is a reply of a tracked flow, or an ICMP error quoting a
/// translated forward packet.
#[inline(always)]
pub fn egress(ctx: &TcContext) -> Result<(), Untouched> {
    let ether_type: u16 = ctx.load(12).map_err(|_| Untouched)?;
    if ether_type != ETH_P_IP {
        return Ok(());
    }
    let ip: Ipv4 = ctx.load(ETH_LEN).map_err(|_| Untouched)?;
    if ip.vihl >> 4 != 4 || ((ip.vihl & 0x0f) as usize) * 4 < IPV4_MIN_LEN {
        return Ok(());
    }
    let l4_off = ETH_LEN + ((ip.vihl & 0x0f) as usize) * 4;
    let frag = u16::from_be(ip.frag);
    match ip.proto {
        proto::TCP | proto::UDP => {}
        proto::ICMP if frag & (IP_MF | IP_OFFSET) == 0 => return icmp_error(ctx, &ip, l4_off),
        _ => return Ok(()),
    }
    let frag_key = FragKey {
        src: ip.src,
        dst: ip.dst,
        id: ip.id,
        proto: ip.proto,
        pad: 0,
    };
    // A later fragment carries no ports: its first fragment left them.
    let later = frag & IP_OFFSET != 0;
    let ports = if later {
        // SAFETY: the value is copied out at once.
        match unsafe { FRAGMENTS.get(frag_key) } {
            Some(p) => Ports {
                src: p.sport,
                dst: p.dport,
            },
            None => return Ok(()),
        }
    } else {
        ctx.load::<Ports>(l4_off).map_err(|_| Untouched)?
    };
    let key = FlowKey {
        src: ip.src,
        dst: ip.dst,
        sport: ports.src,
        dport: ports.dst,
        proto: ip.proto,
        pad: [0; 3],
    };
    let Some(flow) = find(&key) else {
        return Ok(());
    };
    if !rewrites_source_on_egress(&flow) {
        return Ok(());
    }
    if !applies(&key, &flow) {
        count(Counter::CtStaleService);
        return Ok(());
    }
    if frag & IP_MF != 0 && !later {
        let ports = FragPorts {
            sport: ports.src,
            dport: ports.dst,
        };
        let _ = FRAGMENTS.insert(frag_key, ports, 0);
    }
    let check = if ip.proto == proto::UDP {
        UDP_CHECK_OFF
    } else {
        TCP_CHECK_OFF
    };
    snat(
        ctx,
        &ip,
        (!later).then_some(l4_off + check),
        l4_off,
        &flow,
        ip.proto == proto::UDP,
    )
    .inspect_err(|_| count(Counter::TcUntranslated))?;
    if flow.kind == NAT_MASQ {
        // A forward packet: XDP accounted it already.
        count(Counter::TcMasq);
        return Ok(());
    }
    account(
        flow.service,
        Direction::Reply,
        u16::from_be(ip.tot_len) as u64,
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
fn rewrites_source_on_egress(flow: &Flow) -> bool {
    (flow.kind == NAT_SRC && !flow.is_snat()) || flow.kind == NAT_MASQ
}

/// Rewrites the source address (and, with a transport header whose checksum is at
/// `check_off`, the source port) to the flow's.
#[inline(always)]
fn snat(
    ctx: &TcContext,
    ip: &Ipv4,
    check_off: Option<usize>,
    l4_off: usize,
    flow: &Flow,
    udp: bool,
) -> Result<(), Untouched> {
    let e = |_| Untouched;
    // Nothing is written unless the checksum is in the packet too: a transport header
    // cut short (a tiny first fragment) would be left half translated.
    if let Some(check_off) = check_off {
        ctx.load::<u16>(check_off).map_err(e)?;
    }
    ctx.store(IP_SRC, &flow.nat_addr, 0).map_err(e)?;
    ctx.l3_csum_replace(IP_CHECK, ip.src as u64, flow.nat_addr as u64, 4)
        .map_err(e)?;
    let Some(check_off) = check_off else {
        return Ok(());
    };
    // UDP: a zero checksum means "none" and stays zero; a computed zero is sent as 0xffff.
    let mangled = if udp { BPF_F_MARK_MANGLED_0 as u64 } else { 0 };
    ctx.l4_csum_replace(
        check_off,
        ip.src as u64,
        flow.nat_addr as u64,
        BPF_F_PSEUDO_HDR as u64 | mangled | 4,
    )
    .map_err(e)?;
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

/// An ICMP error (destination unreachable, time exceeded) quoting a packet as the
/// kernel forwarded it: a forward packet as translated (client → backend), whose
/// quoted destination becomes the gateway address and port again; or in SNAT mode a
/// reply with its destination translated (backend → client), whose quoted destination
/// becomes the node's address and port. The outer source too, if the quoted
/// destination itself sent the error.
#[inline(always)]
fn icmp_error(ctx: &TcContext, ip: &Ipv4, l4_off: usize) -> Result<(), Untouched> {
    let e = |_| Untouched;
    let icmp: Icmp = ctx.load(l4_off).map_err(e)?;
    if icmp.kind != DEST_UNREACH && icmp.kind != TIME_EXCEEDED {
        return Ok(());
    }
    let inner_off = l4_off + core::mem::size_of::<Icmp>();
    let inner: Ipv4 = ctx.load(inner_off).map_err(e)?;
    if inner.vihl != 0x45 || (inner.proto != proto::TCP && inner.proto != proto::UDP) {
        return Ok(());
    }
    let ports: Ports = ctx.load(inner_off + IPV4_MIN_LEN).map_err(e)?;
    // The quoted packet travelled opposite to this error.
    let key = FlowKey {
        src: inner.dst,
        dst: inner.src,
        sport: ports.dst,
        dport: ports.src,
        proto: inner.proto,
        pad: [0; 3],
    };
    let Some(flow) = find(&key) else {
        return Ok(());
    };
    if !rewrites_source_on_egress(&flow) {
        return Ok(());
    }
    if !applies(&key, &flow) {
        count(Counter::CtStaleService);
        return Ok(());
    }
    // After the flow was found, a failed write leaves a packet of ours untranslated.
    let written = (|| -> Result<(), Untouched> {
        let e = |_| Untouched;
        // The ICMP checksum covers the quoted bytes and no pseudo-header: computed here
        // and written whole (ICMP is never checksum-offloaded).
        let inner_check = replace4(inner.check, inner.dst, flow.nat_addr);
        let mut check = replace4(icmp.check, inner.dst, flow.nat_addr);
        check = replace2(check, ports.dst, flow.nat_port);
        check = replace2(check, inner.check, inner_check);
        ctx.store(inner_off + 16, &flow.nat_addr, 0).map_err(e)?;
        ctx.store(inner_off + 10, &inner_check, 0).map_err(e)?;
        ctx.store(inner_off + IPV4_MIN_LEN + 2, &flow.nat_port, 0)
            .map_err(e)?;
        ctx.store(l4_off + 2, &check, 0).map_err(e)?;
        if ip.src == inner.dst {
            ctx.store(IP_SRC, &flow.nat_addr, 0).map_err(e)?;
            ctx.l3_csum_replace(IP_CHECK, ip.src as u64, flow.nat_addr as u64, 4)
                .map_err(e)?;
        }
        Ok(())
    })();
    written.inspect_err(|_| count(Counter::TcUntranslated))?;
    count(Counter::TcIcmp);
    Ok(())
}
