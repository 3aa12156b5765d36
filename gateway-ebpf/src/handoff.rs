//! The hand-off from XDP to TC: forwarding into an egress that takes no XDP frames (a
//! pod's veth as CNIs make it, a bridge such as `cni0`, a default veth) without the
//! kernel's forwarding path.
//!
//! XDP cannot send such a packet itself (`fwd.rs`). Before this hand-off it translated
//! the packet and passed it up, and the kernel routed it again, ran netfilter on it,
//! resolved the neighbour again and forwarded it: no faster than iptables' own DNAT.
//! Now XDP, which already knows the egress and the neighbour's MAC (`bpf_fib_lookup`,
//! cached per backend), writes the MACs into the frame and the egress into a shim it
//! inserts between the Ethernet and the IP header (`bpf_xdp_adjust_head`), and passes
//! the packet up; the first thing that sees it in the kernel, this crate's TC program
//! on the receiving interface's ingress (`berth_tc_in`, tcx), finds the shim, removes
//! it (`bpf_skb_adjust_room`), decrements the TTL and sends the packet out of the
//! egress (`bpf_redirect`), or straight into the namespace of a veth's peer
//! (`bpf_redirect_peer`: ingress to ingress, without the backlog queue), as Cilium's
//! host routing does.
//!
//! Why a shim and not the frame's metadata (`bpf_xdp_adjust_meta`, the first design):
//! many drivers keep no metadata, and some kernels refuse the helper outright (the
//! 6.18 kernel of this project's machines since 2026-12-07 did: the whole program
//! failed to load). Moving the head works on every driver and kernel with XDP.
//!
//! The shim is no IP header (version 0; for IPv6 also "no next header"): where the TC
//! program does not take it, the kernel drops the packet and GRO merges nothing. So
//! XDP hands a packet off only on an interface whose TC hand-off program the daemon
//! knows is attached (`XMIT_HANDOFF_IN` in `berth_xmit`), and the TC program takes
//! only a shim carrying the datapath's secret (`config::HANDOFF_NONCE`): a frame from
//! the wire forging a shim is dropped (`tc_handoff_forged`), never redirected past
//! netfilter. XDP, which sees every frame first, drops any that arrives with a shim
//! already (`is_shim`), so the secret is a second lock, not the only one. Only packets whose translation has no source half (router-mode forward
//! packets) are handed off: a packet with one of the gateway's own addresses as its
//! source would be a martian on the kernel's path.
//!
//! Into a bridge without VLAN filtering (`cni0`), the packet is sent into the bridge
//! port that holds the next hop's MAC in the bridge's forwarding database (`berth_fdb`,
//! which the daemon keeps from the kernel's), and into the port's peer namespace if the
//! port is a pod's veth: the bridge's own forwarding (its FDB lookup, the port's
//! transmit and the backlog queue) is skipped as well. A MAC the map lacks (not learnt
//! yet, aged out) goes into the bridge, which finds or floods it as it would anyway.

use aya_ebpf::{
    bindings::{__sk_buff, bpf_adj_room_mode::BPF_ADJ_ROOM_MAC, TC_ACT_SHOT, TC_ACT_UNSPEC},
    helpers::generated::{
        bpf_csum_update, bpf_redirect, bpf_redirect_peer, bpf_skb_adjust_room, bpf_xdp_adjust_head,
    },
    programs::{TcContext, XdpContext},
};
use gateway_common::{
    config, Counter, FdbKey, NextHop, XMIT_EGRESS, XMIT_HANDOFF_IN, XMIT_TC_PEER,
};

use crate::{
    family::Family,
    fwd::Via,
    maps::{count, Addr6, CONFIG, FDB, XMIT},
    packet::{Eth, Ipv4, Ipv6, ETH_LEN, ETH_P_IP, ETH_P_IPV6},
};

/// What XDP inserts between the Ethernet and the IP header (16 bytes).
#[repr(C)]
struct Shim {
    /// Where an IP header has its version: 0, which no IP packet has.
    zero: u8,
    /// `PEER` or `BRIDGE` bits.
    flags: u8,
    /// `MAGIC`.
    magic: u16,
    /// Where an IPv6 header has its payload length, next header and hop limit:
    /// `IPV6_GUARD`, "no next header", so that IPv6 GRO finds no protocol to merge by.
    ipv6_guard: [u8; 4],
    /// The datapath's secret (`config::HANDOFF_NONCE`).
    nonce: u32,
    /// The egress interface.
    ifindex: u32,
}

const MAGIC: u16 = 0xbe47;
const IPV6_GUARD: [u8; 4] = [0, 0, 59, 0];
/// Set in `flags`: redirect into the veth's peer (another namespace).
const PEER: u8 = 1;
/// Set in `flags`: `ifindex` is a bridge; redirect into the port holding the MAC.
const BRIDGE: u8 = 2;

const SIZE: usize = core::mem::size_of::<Shim>();

/// The datapath's secret, 0 where the daemon has not set one (then nothing is handed
/// off: a shim with 0 would be no secret).
#[inline(always)]
fn nonce() -> u32 {
    CONFIG.get(config::HANDOFF_NONCE).copied().unwrap_or(0)
}

/// XDP's half: writes `hop`'s MACs into the frame and a shim naming its egress. False
/// where the packet must take the kernel's path instead: the receiving interface has no
/// hand-off program on TC (as the daemon says), no secret is set, or the head cannot
/// move.
///
/// Every packet pointer the caller holds is invalid afterwards (the verifier forgets
/// them): call it last.
#[inline(always)]
pub fn leave(ctx: &XdpContext, hop: &NextHop, via: Via) -> bool {
    let ingress = ctx.ingress_ifindex() as u32;
    if XMIT.get(ingress).is_none_or(|x| x & XMIT_HANDOFF_IN == 0) {
        return false;
    }
    let nonce = nonce();
    if nonce == 0 {
        return false;
    }
    // SAFETY: the program's own context.
    if unsafe { bpf_xdp_adjust_head(ctx.ctx, -(SIZE as i32)) } != 0 {
        return false;
    }
    let (data, end) = (ctx.data(), ctx.data_end());
    // The new Ethernet header, the shim over the old Ethernet header.
    if data + ETH_LEN + SIZE > end {
        return false;
    }
    let eth = data as *mut Eth;
    let old = (data + SIZE) as *const Eth;
    let shim = (data + ETH_LEN) as *mut Shim;
    // SAFETY: all three lie in the frame, bounds-checked above; the old header's type is
    // read before the shim overwrites it.
    unsafe {
        (*eth).ether_type = (*old).ether_type;
        (*eth).dst = hop.dmac;
        (*eth).src = hop.smac;
        *shim = Shim {
            zero: 0,
            flags: match via {
                Via::Redirect => 0,
                Via::Peer => PEER,
                Via::Bridge => BRIDGE,
            },
            magic: MAGIC,
            ipv6_guard: IPV6_GUARD,
            nonce,
            ifindex: hop.ifindex,
        };
    }
    true
}

/// Whether a frame XDP received carries a hand-off shim: forged on the wire (only XDP
/// makes one, after its own work), so dropped there (`tc_handoff_forged`), before TC
/// could be asked to redirect it. `first`: the 4 bytes after the Ethernet header.
#[inline(always)]
pub fn is_shim(first: [u8; 4]) -> bool {
    first[0] == 0 && u16::from_ne_bytes([first[2], first[3]]) == MAGIC
}

/// TC's half, on the receiving interface's ingress: a packet XDP handed off is sent out
/// of its egress (counted `tc_redirect`); a forged shim is dropped; any other packet
/// goes on (`TC_ACT_UNSPEC`).
#[inline(always)]
pub fn take(ctx: &TcContext) -> i32 {
    let skb = ctx.skb.skb;
    let (data, end) = bounds(skb);
    if data + ETH_LEN + SIZE > end {
        return TC_ACT_UNSPEC;
    }
    let shim = (data + ETH_LEN) as *const Shim;
    // SAFETY: `shim` is bounds-checked above.
    let (zero, magic, flags, nonce, ifindex) = unsafe {
        (
            (*shim).zero,
            (*shim).magic,
            (*shim).flags,
            (*shim).nonce,
            (*shim).ifindex,
        )
    };
    // Every IP packet has a version here: the fast way out.
    if zero != 0 || magic != MAGIC {
        return TC_ACT_UNSPEC;
    }
    if nonce != self::nonce() || nonce == 0 {
        count(Counter::HandoffForged);
        return TC_ACT_SHOT;
    }
    // SAFETY: the program's own context; removes the shim after the Ethernet header.
    if unsafe { bpf_skb_adjust_room(skb, -(SIZE as i32), BPF_ADJ_ROOM_MAC, 0) } != 0 {
        count(Counter::HandoffFailed);
        return TC_ACT_SHOT;
    }
    let (data, end) = bounds(skb);
    if data + ETH_LEN > end {
        count(Counter::HandoffFailed);
        return TC_ACT_SHOT;
    }
    let eth = data as *const Eth;
    // SAFETY: `eth` is bounds-checked above, the network headers below.
    unsafe {
        match (*eth).ether_type {
            ETH_P_IP if data + ETH_LEN + core::mem::size_of::<Ipv4>() <= end => {
                // The header's checksum is updated with the TTL: its one's complement
                // sum, and so a CHECKSUM_COMPLETE skb's, stays the same.
                <u32 as Family>::decrement_hops((data + ETH_LEN) as *mut Ipv4);
            }
            ETH_P_IPV6 if data + ETH_LEN + core::mem::size_of::<Ipv6>() <= end => {
                decrement_hop_limit(skb, (data + ETH_LEN) as *mut Ipv6);
            }
            _ => {
                count(Counter::HandoffFailed);
                return TC_ACT_SHOT;
            }
        }
    }
    count(Counter::TcRedirect);
    let (ifindex, peer) = if flags & BRIDGE != 0 {
        let dmac = {
            // SAFETY: `eth` is bounds-checked above.
            unsafe { (*eth).dst }
        };
        bridge_port(ifindex, dmac)
    } else {
        (ifindex, flags & PEER != 0)
    };
    // SAFETY: helpers on the program's own context.
    unsafe {
        if peer {
            bpf_redirect_peer(ifindex, 0) as i32
        } else {
            bpf_redirect(ifindex, 0) as i32
        }
    }
}

/// The packet's data and end.
#[inline(always)]
fn bounds(skb: *mut __sk_buff) -> (usize, usize) {
    // SAFETY: the program's own context, valid while it runs.
    unsafe { ((*skb).data as usize, (*skb).data_end as usize) }
}

/// Where a packet to `dmac` through `bridge` goes: the port that holds the MAC, and
/// whether into its veth peer's namespace; the bridge itself where the map has no port.
#[inline(always)]
fn bridge_port(bridge: u32, dmac: [u8; 6]) -> (u32, bool) {
    let key = FdbKey {
        bridge,
        mac: dmac,
        pad: [0; 2],
    };
    // SAFETY: a plain value read from a map the program holds.
    match unsafe { FDB.get(key) } {
        Some(&port) => {
            count(Counter::TcBridgePort);
            (
                port,
                XMIT.get(port)
                    .is_some_and(|x| x & XMIT_EGRESS == XMIT_TC_PEER),
            )
        }
        None => (bridge, false),
    }
}

/// Decrements an IPv6 packet's hop limit; an skb with CHECKSUM_COMPLETE gets the
/// change into its checksum (`bpf_csum_update` does nothing to any other).
///
/// # Safety
/// `ip` must point into the packet, bounds-checked.
#[inline(always)]
unsafe fn decrement_hop_limit(skb: *mut __sk_buff, ip: *mut Ipv6) {
    // The 32-bit word with the hop limit (payload length, next header, hop limit).
    let word = (ip as *mut u8).add(4) as *mut u32;
    let old = *word;
    <Addr6 as Family>::decrement_hops(ip);
    let sum = u64::from(!old) + u64::from(*word);
    let delta = ((sum & 0xffff_ffff) + (sum >> 32)) as u32;
    bpf_csum_update(skb, delta);
}
