//! Forwarding a packet: choose the path (redirect by XDP, or the kernel's stack), then
//! send it. The kernel is asked where the packet goes (`bpf_fib_lookup`), and a frame
//! is redirected only into an interface known to accept XDP frames (`berth_xmit`,
//! kept by the daemon from the kernel's `xdp-features`).
//!
//! Why the check exists: `bpf_redirect` into a device that cannot take XDP frames (a
//! veth whose peer has neither XDP nor GRO — the kernel's default —, a bridge, a
//! tunnel) "succeeds" in the program and the kernel drops the frame afterwards; only a
//! tracepoint saw it. Measured on default veths: every packet of every route lost.

use aya_ebpf::{
    bindings::{
        bpf_fib_lookup, BPF_FIB_LKUP_RET_FRAG_NEEDED, BPF_FIB_LKUP_RET_FWD_DISABLED,
        BPF_FIB_LKUP_RET_NO_NEIGH, BPF_FIB_LKUP_RET_SUCCESS,
    },
    helpers::generated::{bpf_fib_lookup as fib_lookup, bpf_ktime_get_coarse_ns, bpf_redirect},
    programs::XdpContext,
};
use gateway_common::{
    Counter, NextHop, NEXT_HOP_REFRESH, XMIT_EGRESS, XMIT_OK, XMIT_SLOTS, XMIT_TC, XMIT_TC_BRIDGE,
    XMIT_TC_PEER,
};

use crate::{
    family::Family,
    maps::{count, FIB_PARAMS, XMIT},
    packet::Eth,
};

/// How a packet leaves the gateway.
#[derive(Clone, Copy)]
pub enum Path {
    /// Out of `hop.ifindex` by XDP redirect.
    Redirect,
    /// Out of `hop.ifindex`, which takes no XDP frames, by the TC program on the
    /// receiving interface's ingress (`handoff.rs`), in the way `Via` says.
    Tc(Via),
    /// Up the stack: the kernel forwards it (it resolves the neighbour, fragments or
    /// answers with ICMP). The reason is counted.
    Kernel(Counter),
}

/// How the TC program sends a packet XDP handed to it.
#[derive(Clone, Copy)]
pub enum Via {
    /// `bpf_redirect` into the egress.
    Redirect,
    /// `bpf_redirect_peer` into the namespace of the veth's peer.
    Peer,
    /// Into the bridge port that holds the next hop's MAC (`berth_fdb`), or the bridge.
    Bridge,
}

/// Chooses the path of the packet whose network header is `ip`, as it will be sent (its
/// destination already final). `hop` caches the FIB's answer for the flow; it is asked
/// again when the cache is empty, about a second old, or the packet is longer than any
/// the FIB has accepted (the FIB checks the MTU).
///
/// `now` is `coarse_now()`, read once per packet.
///
/// # Safety
/// `ip` must point into the packet, bounds-checked.
#[inline(always)]
pub unsafe fn path<A: Family>(
    ctx: &XdpContext,
    ip: *mut A::Hdr,
    hop: &mut NextHop,
    now: u32,
) -> Path {
    if A::hops(ip) <= 1 {
        return Path::Kernel(Counter::KernelTtl);
    }
    let len = A::ip_len(ip);
    if hop.ifindex == 0 || len > hop.fit_len || now.wrapping_sub(hop.checked_at) > NEXT_HOP_REFRESH
    {
        let found = match fib::<A>(ctx, ip) {
            Ok(found) => found,
            Err(reason) => {
                // Asked and not answered: ask again on the next packet. The time still
                // says the flow is alive (userspace counts active flows by it).
                hop.ifindex = 0;
                hop.checked_at = now;
                return Path::Kernel(reason);
            }
        };
        let fresh =
            hop.ifindex == found.ifindex && now.wrapping_sub(hop.checked_at) <= NEXT_HOP_REFRESH;
        hop.fit_len = if fresh && hop.fit_len > len {
            hop.fit_len
        } else {
            len
        };
        hop.ifindex = found.ifindex;
        hop.checked_at = now;
        hop.dmac = found.dmac;
        hop.smac = found.smac;
    }
    if hop.ifindex >= XMIT_SLOTS {
        return Path::Kernel(Counter::KernelEgressUnknown);
    }
    // The egress bits only: an interface may be an attached ingress too.
    match XMIT.get(hop.ifindex).map(|x| x & XMIT_EGRESS) {
        Some(XMIT_OK) => Path::Redirect,
        Some(XMIT_TC) => Path::Tc(Via::Redirect),
        Some(XMIT_TC_PEER) => Path::Tc(Via::Peer),
        Some(XMIT_TC_BRIDGE) => Path::Tc(Via::Bridge),
        _ => Path::Kernel(Counter::KernelNoXdpEgress),
    }
}

impl Path {
    /// Why a packet that does not leave by XDP redirect goes to the kernel, when it
    /// is not handed to TC either.
    #[inline(always)]
    pub fn kernel_reason(self) -> Counter {
        match self {
            Path::Kernel(reason) => reason,
            _ => Counter::KernelNoXdpEgress,
        }
    }
}

/// The coarse clock in the units of `NextHop::checked_at` (2^20 ns).
#[inline(always)]
pub fn coarse_now() -> u32 {
    // SAFETY: a helper without arguments.
    (unsafe { bpf_ktime_get_coarse_ns() } >> 20) as u32
}

/// Sends the packet out of `hop.ifindex`: TTL (hop limit) decremented, MACs rewritten, redirected
/// (to the receiving interface too: `XDP_TX` on a veth whose peer runs no XDP program
/// leaves frames queued until something else wakes the peer, a redirect flushes them).
///
/// # Safety
/// `eth` and `ip` must point into the packet, bounds-checked; `hop` must be the one
/// `path` returned `Path::Redirect` for.
#[inline(always)]
pub unsafe fn send<A: Family>(
    ctx: &XdpContext,
    eth: *mut Eth,
    ip: *mut A::Hdr,
    hop: &NextHop,
) -> u32 {
    A::decrement_hops(ip);
    (*eth).dst = hop.dmac;
    (*eth).src = hop.smac;
    count(if hop.ifindex == ctx.ingress_ifindex() as u32 {
        Counter::Tx
    } else {
        Counter::Redirect
    });
    bpf_redirect(hop.ifindex, 0) as u32
}

struct Found {
    ifindex: u32,
    dmac: [u8; 6],
    smac: [u8; 6],
}

/// Asks the kernel's FIB (routes and neighbours, MTU checked) where `ip` goes; a
/// failure says why, as the counter of the kernel path it leads to.
#[inline(always)]
unsafe fn fib<A: Family>(ctx: &XdpContext, ip: *mut A::Hdr) -> Result<Found, Counter> {
    let Some(params) = fib_params() else {
        return Err(Counter::KernelNoRoute);
    };
    A::fib_params(ip, params);
    params.ifindex = ctx.ingress_ifindex() as u32;
    let rc = fib_lookup(
        ctx.ctx.cast(),
        params,
        core::mem::size_of::<bpf_fib_lookup>() as i32,
        0,
    );
    match rc as u32 {
        BPF_FIB_LKUP_RET_SUCCESS => Ok(Found {
            ifindex: params.ifindex,
            dmac: params.dmac,
            smac: params.smac,
        }),
        BPF_FIB_LKUP_RET_NO_NEIGH => Err(Counter::KernelNoNeighbour),
        BPF_FIB_LKUP_RET_FRAG_NEEDED => Err(Counter::KernelFragNeeded),
        BPF_FIB_LKUP_RET_FWD_DISABLED => Err(Counter::KernelForwardingOff),
        _ => Err(Counter::KernelNoRoute),
    }
}

/// This CPU's `bpf_fib_lookup` parameters, zeroed. They live in a per-CPU slot (64
/// bytes the stack cannot spare). All of them must be set for the helper: zeroed word
/// by word with volatile stores (a plain zeroed() becomes a call to a BPF memset
/// subprogram, which costs more than the rest of the fast path together).
///
/// # Safety
/// The slot is used by one lookup at a time: the reference must be dropped before the
/// next call.
#[inline(always)]
pub unsafe fn fib_params() -> Option<&'static mut bpf_fib_lookup> {
    let params = FIB_PARAMS.get_ptr_mut(0)?;
    let words = params as *mut u64;
    for i in 0..core::mem::size_of::<bpf_fib_lookup>() / 8 {
        core::ptr::write_volatile(words.add(i), 0);
    }
    // SAFETY: per-CPU slot, used only by this CPU while the program runs; all-zero is
    // a valid bpf_fib_lookup.
    Some(&mut *params)
}
