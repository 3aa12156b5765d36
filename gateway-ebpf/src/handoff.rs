//! The hand-off from XDP to TC: forwarding into an egress that takes no XDP frames (a
//! pod's veth as CNIs make it, a bridge such as `cni0`, a default veth) without the
//! kernel's forwarding path.
//!
//! XDP cannot send such a packet itself (`fwd.rs`). Before this hand-off it translated
//! the packet and passed it up, and the kernel routed it again, ran netfilter on it,
//! resolved the neighbour again and forwarded it: no faster than iptables' own DNAT.
//! Now XDP, which already knows the egress and the neighbour's MAC (`bpf_fib_lookup`,
//! cached per backend), writes them into the frame's metadata (`bpf_xdp_adjust_meta`)
//! and passes the packet up; the first thing that sees it in the kernel, this crate's
//! TC program on the receiving interface's ingress (`berth_tc_in`, tcx), finds the
//! metadata, decrements the TTL, writes the MACs and sends the packet out of the
//! egress (`bpf_redirect`), or straight into the namespace of a veth's peer
//! (`bpf_redirect_peer`: ingress to ingress, without the backlog queue), as Cilium's
//! host routing does.
//!
//! XDP leaves the packet exactly as the kernel's path wants it (the MACs and TTL as
//! they came, only the destination half of the translation applied, as for any packet
//! handed to the kernel), so where the TC program does not run (not attached yet, an
//! older daemon's) or cannot take the packet, the kernel forwards it as before. Only
//! packets whose translation has no source half (router-mode forward packets) are
//! handed off: a packet with one of the gateway's own addresses as its source would be
//! a martian there.
//!
//! Into a bridge without VLAN filtering (`cni0`), the packet is sent into the bridge
//! port that holds the next hop's MAC in the bridge's forwarding database (`berth_fdb`,
//! which the daemon keeps from the kernel's), and into the port's peer namespace if the
//! port is a pod's veth: the bridge's own forwarding (its FDB lookup, the port's
//! transmit and the backlog queue) is skipped as well. A MAC the map lacks (not learnt
//! yet, aged out) goes into the bridge, which finds or floods it as it would anyway.
//!
//! Where a driver keeps no metadata (`bpf_xdp_adjust_meta` fails), the packet takes
//! the kernel's path, counted as `kernel_forward_no_xdp_egress`.

use aya_ebpf::{
    bindings::{__sk_buff, TC_ACT_UNSPEC},
    helpers::generated::{bpf_csum_update, bpf_redirect, bpf_redirect_peer, bpf_xdp_adjust_meta},
    programs::{TcContext, XdpContext},
};
use gateway_common::{Counter, FdbKey, NextHop, XMIT_TC_PEER};

use crate::{
    family::Family,
    fwd::Via,
    maps::{count, Addr6, FDB, XMIT},
    packet::{Eth, Ipv4, Ipv6, ETH_LEN, ETH_P_IP, ETH_P_IPV6},
};

/// What XDP leaves in the frame's metadata (20 bytes: the kernel wants a multiple of 4,
/// at most 32).
#[repr(C)]
struct Handoff {
    /// `MAGIC`, `MAGIC | PEER` or `MAGIC | BRIDGE`.
    magic: u32,
    /// The egress interface.
    ifindex: u32,
    /// The next hop's MAC.
    dmac: [u8; 6],
    /// The egress interface's MAC.
    smac: [u8; 6],
}

/// Says that the metadata is a hand-off (other XDP programs write none on an
/// interface Berth's program holds; the value only guards against a stale layout).
const MAGIC: u32 = 0xbe47_4800;
/// Set in `magic`: redirect into the veth's peer (another namespace).
const PEER: u32 = 1;
/// Set in `magic`: `ifindex` is a bridge; redirect into the port holding `dmac`.
const BRIDGE: u32 = 2;

const SIZE: usize = core::mem::size_of::<Handoff>();

/// XDP's half: writes `hop` into the frame's metadata for the TC program. False if the
/// driver keeps no metadata; then the kernel forwards the packet.
///
/// Every packet pointer the caller holds is invalid afterwards (the verifier forgets
/// them): call it last.
#[inline(always)]
pub fn leave(ctx: &XdpContext, hop: &NextHop, via: Via) -> bool {
    // SAFETY: the program's own context.
    if unsafe { bpf_xdp_adjust_meta(ctx.ctx, -(SIZE as i32)) } != 0 {
        return false;
    }
    let meta = ctx.metadata();
    if meta + SIZE > ctx.data() {
        return false;
    }
    let h = meta as *mut Handoff;
    // SAFETY: `h` lies in the metadata, bounds-checked against `data` above.
    unsafe {
        (*h).magic = MAGIC
            | match via {
                Via::Redirect => 0,
                Via::Peer => PEER,
                Via::Bridge => BRIDGE,
            };
        (*h).ifindex = hop.ifindex;
        (*h).dmac = hop.dmac;
        (*h).smac = hop.smac;
    }
    true
}

/// TC's half, on the receiving interface's ingress: a packet XDP handed off is sent out
/// of its egress (counted `tc_redirect`); any other packet goes on (`TC_ACT_UNSPEC`).
#[inline(always)]
pub fn take(ctx: &TcContext) -> i32 {
    let skb = ctx.skb.skb;
    // SAFETY: the program's own context, valid while it runs.
    let (meta, data, end) = unsafe {
        (
            (*skb).data_meta as usize,
            (*skb).data as usize,
            (*skb).data_end as usize,
        )
    };
    if meta + SIZE > data {
        return TC_ACT_UNSPEC;
    }
    let h = meta as *const Handoff;
    // SAFETY: `h` lies in the metadata, bounds-checked against `data` above.
    let (magic, ifindex, dmac, smac) = unsafe { ((*h).magic, (*h).ifindex, (*h).dmac, (*h).smac) };
    if magic & !(PEER | BRIDGE) != MAGIC {
        return TC_ACT_UNSPEC;
    }
    if data + ETH_LEN > end {
        return TC_ACT_UNSPEC;
    }
    let eth = data as *mut Eth;
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
            _ => return TC_ACT_UNSPEC,
        }
        (*eth).dst = dmac;
        (*eth).src = smac;
    }
    count(Counter::TcRedirect);
    let (ifindex, peer) = if magic & BRIDGE != 0 {
        bridge_port(ifindex, dmac)
    } else {
        (ifindex, magic & PEER != 0)
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
            (port, XMIT.get(port) == Some(&XMIT_TC_PEER))
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
