//! Berth's XDP datapath: per-port DNAT to weighted Maglev backends with an LRU
//! conntrack, reverse NAT of replies, ICMP error translation and fragment tracking.
//!
//! # The packet walk (IPv4, TCP and UDP)
//!
//! 1. **Parse** (`try_berth`): IPv6 → `berth_v6` by tail call (`ipv6.rs`), unless a
//!    TCP/UDP frame's addresses have neither role (2.); anything else not IPv4 → pass. Headers truncated or invalid → drop if
//!    addressed to a gateway address (`drop_malformed`), else pass. ICMP → `icmp.rs`.
//!    Other protocols pass untouched.
//! 2. **Roles** (`maps::Roles`): right after the IPv4 header of a TCP or UDP packet, two
//!    array lookups say whether the destination may be a gateway address and the source
//!    a backend address (`berth_addr_filter`, kept by the daemon). A packet with neither
//!    role passes untouched without a hash lookup or a look at its ports.
//! 3. **Conntrack** (`conntrack/`): an LRU hash shared by all CPUs, keyed by the
//!    5-tuple as seen on the wire. A router-mode flow has one entry, its forward one
//!    (client → gateway, rewritten to the backend); a reply (backend → client) finds it
//!    through the reply index (`berth_reply_index`: backend endpoint → the services it
//!    serves) and is rewritten to the gateway address and port. Where the index cannot
//!    tell (an endpoint of more than `REPLY_CANDIDATES` services) and in SNAT mode, a
//!    reply entry is recorded too. A new flow to a service picks a backend with weighted
//!    Maglev (a table per service sized by its backends, `maglev_size`, a region of one
//!    pool, built in userspace; weight 0 takes no new flows); a TCP SYN to a router-mode service is balanced without a conntrack
//!    lookup (a retransmission gets the same backend). A tracked flow keeps its backend
//!    while the backend is live; only if it was removed is the flow balanced again
//!    (`backend_gone`). Above `config::NEW_FLOW_LIMIT` new flows per second on a CPU,
//!    router flows are not recorded (`flood_untracked`): Maglev alone keeps them on their
//!    backend, and their replies are matched by Maglev, so a flood of new 5-tuples
//!    cannot evict the established flows.
//!    **Any gateway carries any packet of a flow** (gateways sharing an address behind
//!    ECMP, no shared state): a TCP segment without SYN that finds no entry is balanced
//!    and recorded (`ct_miss_midflow`); a router-mode reply with no entry whose forward
//!    tuple Maglev maps to the backend it came from is translated and its flow recorded
//!    (`ct_miss_reply`, under the flood guard like a new flow), else it passes
//!    (`reply_untracked`). The TC program matches replies so too; ICMP errors are
//!    translated only for flows with an entry (`conntrack::NoEntry`).
//! 4. **NAT** (`nat.rs`): addresses and ports rewritten with incremental checksum
//!    updates (RFC 1624); a zero UDP checksum stays zero.
//! 5. **Forwarding** (`fwd.rs`): `bpf_fib_lookup` (cached per backend for forward
//!    packets, `berth_backend_hops`, and in the flow's entry for its replies; asked again
//!    after about a second) finds the egress and the neighbour's MAC. XDP sends the packet
//!    itself (TTL, MACs, `bpf_redirect`) only into an interface that accepts XDP frames
//!    (`berth_xmit`). Into another Ethernet interface (a pod's veth, a bridge) a
//!    router-mode forward packet is handed to TC (`handoff.rs`): XDP writes the MACs,
//!    inserts a shim naming the egress after the Ethernet header and passes it; the
//!    hand-off program on the receiving interface's ingress (`berth_tc_in`) removes the
//!    shim and sends it out (`bpf_redirect`, `bpf_redirect_peer` into a veth peer's
//!    namespace, or into the bridge port holding the MAC), past netfilter and the
//!    forwarding path. Every other packet goes up the stack with a named reason and the
//!    kernel forwards it.
//! 6. **Replies through the kernel**: a forward packet is translated in XDP whichever
//!    way it leaves; a reply only when XDP sends it itself. Otherwise it goes up
//!    untranslated (a translated reply would be a martian) and the TC program (`tc.rs`,
//!    tcx egress) translates it as it leaves, finding its flow the same way
//!    (`conntrack::find`).
//! 7. **ICMP errors** quoting a NATed flow are translated both ways (`icmp.rs` in XDP,
//!    `tc.rs` on egress), so path MTU discovery works.
//! 8. **SNAT mode** (a service with `SERVICE_SNAT`): a new flow also gets the node's
//!    address toward its backend (`berth_snat_src`) and a source port from
//!    `berth_snat_ports`, claimed by inserting its reply entry (backend → node:port) only
//!    if absent (`SNAT_PORT_TRIES` tries). A translation then has two halves
//!    (`nat.rs`): the destination half is applied whichever way the packet leaves, the
//!    source half only when XDP sends it; on the kernel's path the TC program applies the
//!    source half on egress, from entries keyed by the tuple the packet leaves with
//!    (`NAT_MASQ` for forward packets, a router-mode reply entry for replies), made the
//!    first time the flow takes that path. Every forward packet checks that its flow
//!    still holds the port (`conntrack::holds_port`): a full conntrack evicts the reply
//!    entry and the forward entry apart, and a port is never shared by two flows.
//! 9. **Fragments** (`frag.rs`): the first fragment is handled like any packet and its ports are
//!    remembered (`berth_frags`, keyed by source, destination, IP id, protocol); later
//!    fragments follow the same flow. A later fragment to a gateway address whose first
//!    fragment was not seen is dropped (`drop_fragment`), never sent to a guessed backend.
//! 10. **Origin** (`origin.rs`): a reply, or an ICMP error about a packet sent to a
//!     backend, is translated only if it arrived from where the gateway sends that
//!     backend's packets (its next-hop cache: interface and, in XDP, neighbour MAC);
//!     otherwise dropped (`reply_spoofed`), in XDP and TC.
//!
//! # Verdicts and counters
//!
//! Every verdict other than "pass untouched" is counted per CPU by name
//! (`berth_counters`, `gateway_common::Counter`; on `/metrics` as
//! `berth_datapath_packets_total{reason}`). Per service (`berth_svc_stats`): packets and
//! bytes per direction, new flows, and packets the kernel forwarded with the last reason.
//! Nothing is logged per packet.
//!
//! | situation | verdict | counter |
//! |---|---|---|
//! | translated, sent into another interface / back out of the receiving one | `XDP_REDIRECT` | `redirect` / `tx` |
//! | router-mode forward packet, egress takes no XDP frames but Ethernet (default veth, bridge): sent by TC ingress | `XDP_PASS`, TC: redirect | `tc_redirect` |
//! | of those, into the bridge port holding the next hop's MAC (`berth_fdb`) | TC: redirect | `tc_bridge_port` |
//! | a frame arriving with a hand-off shim (forged; XDP), or one without the datapath's secret (TC) | `XDP_DROP` / TC: shot | `tc_handoff_forged` |
//! | a handed-off packet whose shim cannot be removed | TC: shot | `tc_handoff_failed` |
//! | egress takes no XDP frames, not handed to TC (a reply, SNAT, a tunnel, an ingress without the hand-off program) | `XDP_PASS` | `kernel_forward_no_xdp_egress` |
//! | neighbour not resolved yet | `XDP_PASS` | `kernel_forward_no_neighbour` |
//! | longer than the egress MTU | `XDP_PASS` | `kernel_forward_frag_needed` |
//! | TTL expired | `XDP_PASS` | `kernel_forward_ttl` |
//! | no usable route / forwarding disabled | `XDP_PASS` | `kernel_forward_no_route` / `kernel_forward_disabled` |
//! | egress index beyond `XMIT_SLOTS` | `XDP_PASS` | `kernel_forward_egress_unknown` |
//! | a reply translated on egress by TC | (TC: next) | `tc_reply_translated` |
//! | an ICMP error translated (XDP / TC) | as forwarded | `icmp_translated` / `tc_icmp_translated` |
//! | a later fragment followed its first one | as forwarded | `fragment_translated` |
//! | a reply of a tracked flow TC could not rewrite (an skb helper failed) | (TC: next) | `tc_untranslated` |
//! | a redirect the kernel refused after the program returned | (tracepoint) | `redirect_error` |
//! | an ICMPv6 redirect the host sends out of an `--interface` (IPv6 has no `send_redirects`) | TC: shot | `tc_icmp6_redirect_dropped` |
//! | a flow whose service ids now belong to another service | balanced afresh or pass | `ct_stale_service` |
//! | new flow to a service with no backend taking new flows | `XDP_DROP` | `drop_no_backend` |
//! | new router flow (or reply matched by Maglev) over its CPU's new-flow limit: forwarded, not recorded | as forwarded | `flood_untracked` |
//! | TCP segment without SYN, no entry: balanced by Maglev, recorded | as forwarded | `ct_miss_midflow` (+ `new_flow`) |
//! | reply without entry, Maglev maps its tuple to its backend: translated, recorded | as forwarded | `ct_miss_reply` |
//! | reply without entry, Maglev maps its tuple to another backend | `XDP_PASS` | `reply_untracked` |
//! | new SNAT flow: a node port claimed (after a taken one) | as forwarded | `snat_new_flow` (`snat_port_retry`) |
//! | new SNAT flow: no free node port in the tries | `XDP_DROP` | `drop_snat_ports_exhausted` |
//! | new SNAT flow: no node address toward the backend | `XDP_DROP` | `drop_snat_no_source` |
//! | a SNAT forward packet the kernel forwarded, given its node source by TC | (TC: next) | `tc_masq_translated` |
//! | malformed packet to a gateway address | `XDP_DROP` | `drop_malformed` |
//! | a reply (or ICMP error about a packet to a backend) from elsewhere than its backend (`origin.rs`) | `XDP_DROP` / TC: shot | `reply_spoofed` |
//! | would open a flow: TCP flags no TCP sends (none, SYN+FIN, SYN+RST, Xmas) | `XDP_DROP` | `drop_tcp_flags` |
//! | would open a flow: source is a gateway address | `XDP_DROP` | `drop_gateway_source` |
//! | later fragment to a gateway address, first one not seen | `XDP_DROP` | `drop_fragment` |
//! | anything else (not ours, other protocols) | `XDP_PASS` | — |
#![no_std]
#![no_main]
#![allow(
    missing_docs,
    reason = "aya's program macros drop the doc comments of the functions they export"
)]

mod affinity;
mod conntrack;
mod csum;
mod family;
mod frag;
mod fwd;
mod handoff;
mod icmp;
mod ipv6;
mod maps;
mod monitor;
mod nat;
mod origin;
mod packet;
mod tc;

use core::mem::MaybeUninit;

use aya_ebpf::{
    bindings::{xdp_action, TC_ACT_SHOT, TC_ACT_UNSPEC},
    macros::{classifier, tracepoint, xdp},
    programs::{TcContext, TracePointContext, XdpContext},
};
use gateway_common::{proto, Counter, Flow, FlowKey, NextHop, NAT_DST, TCP_STATE_FLAGS};

use crate::{
    conntrack::{lookup_or_balance, Found, Lookup},
    family::Family,
    fwd::Path,
    maps::{
        account, account_kernel, count, is_gateway_address, Direction, Roles, PROGRAMS, PROG_V6,
    },
    nat::{halves, rewrite, Side, L4},
    origin::Origin,
    packet::{
        ptr_at, Eth, Ipv4, Ipv6, ETH_LEN, ETH_P_IP, ETH_P_IPV6, IPV4_MIN_LEN, IP_MF, IP_OFFSET,
    },
};

/// The gateway program, attached to every `--interface`. (Inlined into the entry point
/// the macro makes: a BPF-to-BPF call and return cost a miss about 10 ns.)
#[xdp]
#[inline(always)]
pub fn berth(ctx: XdpContext) -> u32 {
    verdict(&ctx, try_berth(&ctx))
}

/// The IPv6 half of the gateway program, entered by tail call from `berth`
/// (`maps::PROG_V6`): a stack of its own, the same flow logic (`ipv6.rs`).
#[xdp]
#[inline(always)]
pub fn berth_v6(ctx: XdpContext) -> u32 {
    verdict(&ctx, ipv6::try_berth(&ctx))
}

/// The ICMPv6 part of the gateway program, entered by tail call from `berth_v6`
/// (`maps::PROG_ICMP6`): ICMPv6 errors about a flow are translated (`icmp.rs`).
#[xdp]
#[inline(always)]
pub fn berth_icmp6(ctx: XdpContext) -> u32 {
    verdict(&ctx, ipv6::try_icmp(&ctx))
}

/// Sends the event of the packet in hand (`monitor.rs`), entered by tail call from the
/// gateway programs' verdict (`maps::PROG_MONITOR`) while `berth monitor` listens.
#[xdp]
#[inline(always)]
pub fn berth_monitor(ctx: XdpContext) -> u32 {
    monitor::send(&ctx)
}

/// An XDP verdict: a dropped packet's reason is counted. A packet that is none of the
/// program's business (`MISS`) passes without asking whether `berth monitor` listens;
/// another one is an event if it listens and the packet was counted as one.
#[inline(always)]
fn verdict(ctx: &XdpContext, result: Result<u32, Counter>) -> u32 {
    match result {
        Ok(action) if action & MISS_BIT != 0 => xdp_action::XDP_PASS,
        Ok(action) if monitor::listening() => monitor::flush(ctx, action),
        Ok(action) => action,
        Err(reason) => {
            count(reason);
            monitor::dropped(ctx, reason)
        }
    }
}

/// The reverse-NAT program on the `--interface`s' egress (tcx): translates replies the
/// kernel forwarded. It drops nothing but forged replies (`reply_spoofed`) and the
/// host's ICMPv6 redirects (`berth_tc_icmp6`): it returns "next", so later programs
/// still run.
#[classifier]
pub fn berth_tc(ctx: TcContext) -> i32 {
    monitor::entered(&ctx);
    tc_verdict(&ctx, tc::egress(&ctx))
}

/// The IPv6 half of `berth_tc`, entered by tail call (`maps::TC_PROGRAMS`).
#[classifier]
pub fn berth_tc_v6(ctx: TcContext) -> i32 {
    tc_verdict(&ctx, tc::egress6(&ctx))
}

/// The hand-off program on the `--interface`s' ingress (tcx): sends out a packet XDP
/// translated for an egress that takes no XDP frames, from the shim XDP inserted
/// (`handoff.rs`); every other packet goes on untouched.
#[classifier]
pub fn berth_tc_in(ctx: TcContext) -> i32 {
    handoff::take(&ctx)
}

/// Sends the event of the TC programs' packet in hand (`monitor.rs`), entered by tail
/// call from their verdict (`maps::PROG_TC_MONITOR`) while `berth monitor` listens.
#[classifier]
pub fn berth_tc_monitor(ctx: TcContext) -> i32 {
    tc_action(monitor::send(&ctx))
}

/// A TC verdict: a forged reply is dropped, everything else goes on; an event, if the
/// packet is one and `berth monitor` listens.
#[inline(always)]
fn tc_verdict(ctx: &TcContext, result: Result<(), tc::Stop>) -> i32 {
    let action = match result {
        Err(tc::Stop::Drop) => xdp_action::XDP_DROP,
        _ => xdp_action::XDP_PASS,
    };
    if monitor::listening() {
        return tc_action(monitor::flush(ctx, action));
    }
    tc_action(action)
}

/// The TC verdict of an event's action (`MonitorEvent::action`).
#[inline(always)]
fn tc_action(action: u32) -> i32 {
    if action == xdp_action::XDP_DROP {
        TC_ACT_SHOT
    } else {
        TC_ACT_UNSPEC
    }
}

/// The ICMPv6 part of `berth_tc_v6`, entered by tail call (`maps::PROG_TC_ICMP6`):
/// ICMPv6 errors about a translated packet (`tc::icmp6`); the host's ICMPv6 redirects
/// are dropped (`tc::is_redirect`), the one thing the TC programs drop.
#[classifier]
pub fn berth_tc_icmp6(ctx: TcContext) -> i32 {
    if tc::is_redirect(&ctx) {
        return tc_verdict(&ctx, Err(tc::Stop::Drop));
    }
    tc_verdict(&ctx, tc::icmp6(&ctx))
}

/// On `xdp:xdp_redirect_err`: counts a redirect of the gateway program that the kernel
/// refused after the program returned (the frame is lost). With `berth_xmit` this
/// should not happen; if it does, the operator sees `redirect_error` grow.
#[tracepoint]
pub fn berth_redirect_err(ctx: TracePointContext) -> u32 {
    // Field `prog_id` at offset 8 of the event (see the tracepoint's format file).
    // SAFETY: reads the event record through bpf_probe_read_kernel.
    let prog: i32 = unsafe { ctx.read_at(8) }.unwrap_or(-1);
    if maps::is_gateway_program(prog as u32) {
        count(Counter::RedirectError);
    }
    0
}

/// Returns at once: the benchmark's floor.
#[xdp]
pub fn berth_pass(_ctx: XdpContext) -> u32 {
    xdp_action::XDP_PASS
}

const PASS: Result<u32, Counter> = Ok(xdp_action::XDP_PASS);

/// Set in a verdict of a packet that is none of the program's business (`MISS`).
const MISS_BIT: u32 = 1 << 31;

/// A packet that is none of the program's business: passes, and is no event.
const MISS: Result<u32, Counter> = Ok(xdp_action::XDP_PASS | MISS_BIT);

/// Whether an IPv6 frame is none of the program's business before the tail call into
/// `berth_v6`: a TCP/UDP (or extension-header) packet whose addresses have neither role
/// passes as `berth_v6` would pass it, without the tail call, which was most of an
/// IPv6 miss. ICMPv6 is not filtered by roles (errors are addressed to clients and
/// backends) and goes on.
#[inline(always)]
fn ipv6_has_no_role(ctx: &XdpContext) -> bool {
    let Some(ip) = ptr_at::<Ipv6>(ctx, ETH_LEN) else {
        return false;
    };
    // SAFETY: `ip` comes from `ptr_at`.
    let (next, src, dst) = unsafe { ((*ip).next_hdr, (*ip).src, (*ip).dst) };
    next != proto::ICMPV6 && Roles::of(src, dst).none()
}

#[inline(always)]
fn try_berth(ctx: &XdpContext) -> Result<u32, Counter> {
    let Some(eth) = ptr_at::<Eth>(ctx, 0) else {
        return MISS;
    };
    // Every header pointer below comes from `ptr_at`, which checked that the whole
    // header lies inside the packet.
    // SAFETY: `eth` is such a pointer.
    let ether_type = unsafe { (*eth).ether_type };
    if ether_type != ETH_P_IP {
        if ether_type == ETH_P_IPV6 {
            if forged_shim(ctx) {
                return Err(Counter::HandoffForged);
            }
            if ipv6_has_no_role(ctx) {
                return MISS;
            }
            monitor::entered(ctx);
            // SAFETY: a tail call into the IPv6 program; returns only if it failed.
            unsafe { PROGRAMS.tail_call(ctx, PROG_V6) };
            count(Counter::Ipv6NoProgram);
            return PASS;
        }
        return MISS;
    }
    let Some(ip) = ptr_at::<Ipv4>(ctx, ETH_LEN) else {
        return MISS;
    };
    // SAFETY: `ip` comes from `ptr_at`.
    let (vihl, ip_proto, src, dst, frag, tot_len) = unsafe {
        (
            (*ip).vihl,
            (*ip).proto,
            (*ip).src,
            (*ip).dst,
            u16::from_be((*ip).frag),
            u16::from_be((*ip).tot_len) as usize,
        )
    };
    let ihl = ((vihl & 0x0f) as usize) * 4;
    if vihl >> 4 != 4
        || ihl < IPV4_MIN_LEN
        || tot_len < ihl
        || ETH_LEN + tot_len > ctx.data_end() - ctx.data()
    {
        if forged_shim(ctx) {
            return Err(Counter::HandoffForged);
        }
        return malformed(dst);
    }
    let l4_off = ETH_LEN + ihl;
    let udp = match ip_proto {
        proto::TCP => false,
        proto::UDP => true,
        proto::ICMP if frag & (IP_MF | IP_OFFSET) == 0 => {
            // An ICMP error about a flow is addressed to its client or backend, which
            // have no role: ICMP is not filtered by roles.
            monitor::entered(ctx);
            // SAFETY: `eth` and `ip` come from `ptr_at`.
            return Ok(unsafe { icmp::handle::<u32>(ctx, eth, ip, l4_off, ETH_LEN + tot_len) });
        }
        _ => return MISS,
    };
    let roles = Roles::of(src, dst);
    if roles.none() {
        return MISS;
    }
    monitor::entered(ctx);

    // SAFETY: `ip` comes from `ptr_at`.
    let id = u32::from(unsafe { (*ip).id });
    if frag & IP_OFFSET != 0 {
        // A later fragment carries no ports: follow the flow its first fragment took.
        return frag::later::<u32>(ctx, eth, ip, roles, id, ip_proto, tot_len);
    }

    let Some(l4) = L4::at(ctx, l4_off, ETH_LEN + tot_len, udp) else {
        return malformed(dst);
    };
    let (sport, dport, _, flags) = l4.fields();
    let t = FlowKey {
        src,
        dst,
        sport,
        dport,
        proto: ip_proto,
        pad: [0; 3],
    };
    // First fragment of a datagram for us: remember its ports for the later ones.
    let first_fragment = frag & IP_MF != 0;
    let Some(new) = Family::scratch() else {
        return PASS;
    };
    // SAFETY: `eth` comes from `ptr_at`.
    let origin = unsafe { Origin::xdp(ctx, eth) };
    let found = lookup_or_balance(&t, roles, flags, &origin, new)?;
    if found.found == Found::Miss {
        if first_fragment && is_gateway_address(dst) {
            frag::remember(&t, id);
        }
        return PASS;
    }
    if first_fragment {
        frag::remember(&t, id);
    }
    let pkt = Packet {
        eth,
        ip,
        l4: Some(&l4),
        len: tot_len,
    };
    // SAFETY: every pointer in `pkt` comes from `ptr_at`; `found` is this run's.
    Ok(unsafe { translate(ctx, &pkt, &t, found, new) })
}

/// A bounds-checked packet of a tracked or new flow.
pub struct Packet<'a, A: Family> {
    /// Ethernet header.
    pub eth: *mut Eth,
    /// Network header.
    pub ip: *mut A::Hdr,
    /// Transport header (absent in later fragments).
    pub l4: Option<&'a L4>,
    /// IP packet length (header included).
    pub len: usize,
}

/// Translates and forwards a packet of a flow; records a new flow.
///
/// The destination half of the translation (a forward packet's backend; a SNAT reply's
/// client) is applied whichever way the packet leaves: the kernel forwards it like any
/// packet. The source half (a reply's gateway address; a SNAT forward packet's node
/// address) only when XDP sends the packet itself: handed to the kernel with one of its
/// own addresses as the source, it would be dropped as a martian, so it goes up with
/// its source as it came and the TC program translates that on egress.
///
/// # Safety
/// The pointers in `pkt` must point into the packet, bounds-checked; a `Tracked`
/// pointer must come from this run.
#[inline(always)]
unsafe fn translate<A: Family>(
    ctx: &XdpContext,
    pkt: &Packet<A>,
    key: &FlowKey<A>,
    found: Lookup<A>,
    new: &mut MaybeUninit<Flow<A>>,
) -> u32 {
    // The flow the packet belongs to (its translation) and where its next hop is cached:
    // a forward packet's with its backend (shared by all the backend's flows), a reply's
    // in the entry it found (`Reply`: its flow's forward entry). A translation made in
    // the slot for a flow without an entry caches nothing: its hop is the slot's own.
    let (flow, reply_hop, is_new): (*mut Flow<A>, *mut NextHop, bool) = match found.found {
        Found::Tracked => (found.entry, &raw mut (*found.entry).next_hop, false),
        // For the three below `lookup_or_balance` wrote the slot.
        Found::Reply => (new.as_mut_ptr(), &raw mut (*found.entry).next_hop, false),
        Found::Matched => {
            let flow = new.as_mut_ptr();
            (flow, &raw mut (*flow).next_hop, false)
        }
        _ => {
            let flow = new.as_mut_ptr();
            (flow, &raw mut (*flow).next_hop, true)
        }
    };
    // A TCP segment's state flags (a later fragment has none to read), noted first:
    // nothing of the lookup stays live across the calls below (`berth_v6` has no
    // stack to spare for it).
    if let Some(l4) = pkt.l4.filter(|_| key.proto == proto::TCP) {
        let flags = l4.tcp_flags();
        if flags & TCP_STATE_FLAGS != 0 {
            conntrack::note_tcp(key, &found, &mut *flow, flags);
        }
    }
    let now = fwd::coarse_now();
    let hop = if (*flow).kind == NAT_DST {
        conntrack::seen(&mut *flow, now);
        maps::backend_hop((*flow).backend).unwrap_or(reply_hop)
    } else {
        reply_hop
    };
    let (forward, service, snat) = ((*flow).kind == NAT_DST, (*flow).service, (*flow).is_snat());
    let backend = (*flow).backend;
    let (dst, src) = halves(&*flow);
    if let Some(dst) = dst {
        rewrite::<A>(pkt.ip, pkt.l4, Side::Dst, dst);
    }
    if forward {
        account(service, backend, Direction::Forward, pkt.len as u64, is_new);
    }
    let verdict = match fwd::path::<A>(ctx, pkt.ip, &mut *hop, now) {
        Path::Redirect => {
            if let Some(src) = src {
                rewrite::<A>(pkt.ip, pkt.l4, Side::Src, src);
            }
            if !forward {
                account(service, backend, Direction::Reply, pkt.len as u64, false);
            }
            fwd::send::<A>(ctx, pkt.eth, pkt.ip, &*hop)
        }
        // A packet whose translation has no source half (a router-mode forward
        // packet) into an egress that takes no XDP frames: handed to the TC program
        // on ingress (`handoff.rs`), last (no packet pointer is valid after it).
        Path::Tc(via) if src.is_none() && handoff::leave(ctx, &*hop, via) => {
            maps::account_handoff(service);
            xdp_action::XDP_PASS
        }
        // The source half is left to the TC program on egress. A reply is counted
        // again (and accounted to the service) there.
        other => {
            let reason = other.kernel_reason();
            count(reason);
            if forward {
                account_kernel(service, reason);
            }
            if snat {
                conntrack::add_kernel_path_entries(key, &*flow);
            }
            xdp_action::XDP_PASS
        }
    };
    if is_new {
        conntrack::record(key, &*flow, now);
    }
    verdict
}

/// Whether the frame arrived with a hand-off shim after its Ethernet header (forged:
/// `handoff::is_shim`).
#[inline(always)]
fn forged_shim(ctx: &XdpContext) -> bool {
    // SAFETY: `ptr_at` checked that the 4 bytes lie inside the packet.
    ptr_at::<[u8; 4]>(ctx, ETH_LEN).is_some_and(|first| handoff::is_shim(unsafe { *first }))
}

/// A packet whose headers cannot be parsed (either family): ours to drop if it was sent
/// to a gateway address, otherwise none of our business.
#[inline(always)]
fn malformed<A: Family>(dst: A) -> Result<u32, Counter> {
    if is_gateway_address(dst) {
        Err(Counter::DropMalformed)
    } else {
        PASS
    }
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";
