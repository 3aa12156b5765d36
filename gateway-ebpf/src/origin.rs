//! Where a packet from a backend came from (issue 27, `reply_spoofed`).
//!
//! A reply of a flow, or an ICMP error about a packet the gateway sent to a backend, is
//! translated only if it arrived from where the gateway sends that backend's packets:
//! the interface the forward path uses for the backend and, in XDP when the neighbour
//! is known, the neighbour's MAC as the frame's source. Without the check, a backend of
//! one tenant that forged the address of another tenant's backend had its answers
//! delivered to that tenant's client as coming from the gateway address (600 of 600
//! forged DNS answers), and a forged ICMP port-unreachable quoting the other tenant's
//! flow reset it: the gateway's translation made the forgeries look genuine, and
//! `rp_filter` does not see them (XDP runs first, and the forged source is routable
//! through the spoofer's interface when both backends share a subnet).
//!
//! The expected place is the backend's next-hop cache (`berth_backend_hops`, filled by
//! its forward packets): the established paths pay one array lookup. An empty or
//! stale cache (a gateway behind ECMP that never forwarded to the backend, a flow whose
//! client is silent) is filled by a FIB lookup toward the backend, once a second.
//!
//! What it cannot tell: a tenant on the same L2 segment that forges the other backend's
//! MAC as well as its address (or, through the kernel's path, where the MAC is gone,
//! any spoofer on the backend's interface). Packets the host itself sends (TC, no
//! ingress interface: the kernel's own ICMP errors) are trusted.

use core::ffi::c_void;

use aya_ebpf::{
    bindings::{
        __sk_buff, bpf_fib_lookup, xdp_md, BPF_FIB_LKUP_RET_FRAG_NEEDED, BPF_FIB_LKUP_RET_NO_NEIGH,
        BPF_FIB_LKUP_RET_SUCCESS,
    },
    helpers::generated::bpf_fib_lookup as fib_lookup,
    programs::{TcContext, XdpContext},
};
use gateway_common::{config, NextHop, NEXT_HOP_REFRESH};

use crate::{
    family::Family,
    fwd::{coarse_now, fib_params},
    maps::{backend_hop, BACKENDS, CONFIG},
    packet::Eth,
};

/// Where a packet arrived: its context (an XDP frame's, with its source MAC; or a TC
/// packet's). Two words: `berth_v6` has few stack bytes to spare.
pub struct Origin {
    /// The program's context: an `xdp_md` if `mac` is set, else a `__sk_buff`.
    ctx: *mut c_void,
    /// The frame's source MAC (XDP); null where the frame's own is gone (TC).
    mac: *const [u8; 6],
}

impl Origin {
    /// A frame XDP received; `eth` its Ethernet header.
    ///
    /// # Safety
    /// `eth` must point into the packet, bounds-checked.
    #[inline(always)]
    pub unsafe fn xdp(ctx: &XdpContext, eth: *const Eth) -> Self {
        Origin {
            ctx: ctx.ctx.cast(),
            mac: &raw const (*eth).src,
        }
    }

    /// A packet leaving through the TC egress program.
    #[inline(always)]
    pub fn tc(ctx: &TcContext) -> Self {
        Origin {
            ctx: ctx.skb.skb.cast(),
            mac: core::ptr::null(),
        }
    }

    /// The interface the packet arrived on; 0: the host sent it (TC).
    #[inline(always)]
    fn ifindex(&self) -> u32 {
        // SAFETY: the program's own context, of the kind `mac` says.
        unsafe {
            if self.mac.is_null() {
                (*self.ctx.cast::<__sk_buff>()).ingress_ifindex
            } else {
                (*self.ctx.cast::<xdp_md>()).ingress_ifindex
            }
        }
    }

    /// Whether a packet from backend `backend` (id), address `addr`, came from where
    /// the gateway sends that backend's packets (see the module doc). What cannot be
    /// known (no route toward the backend) is not held against it.
    ///
    /// The operator may allow any origin (`config::REPLY_ORIGIN`, asked only when the
    /// origin is not the backend's: the established path pays nothing for it).
    #[inline(always)]
    pub fn is_backend<A: Family>(&self, backend: u32, addr: A) -> bool {
        self.at_backend(backend, addr) || any_origin()
    }

    /// Whether the packet came from where the gateway sends the backend's packets.
    ///
    /// A cached hop that agrees answers at once. Otherwise the id must still name the
    /// address the packet comes from: ids are reused, and a flow balanced before its
    /// backend left keeps the old id (found by the fuzzer: an old backend's genuine
    /// reply was judged by the next hop of the id's new backend). Where it does not,
    /// this check has no say, and the FIB is not asked either: its answer toward the
    /// old address would poison the new backend's next-hop cache, which forwards.
    #[inline(always)]
    fn at_backend<A: Family>(&self, backend: u32, addr: A) -> bool {
        let ifindex = self.ifindex();
        if ifindex == 0 {
            return true;
        }
        let Some(hop) = backend_hop(backend) else {
            return true;
        };
        // SAFETY: a valid map value pointer for the duration of this program run.
        let hop = unsafe { &mut *hop };
        let now = coarse_now();
        let fresh = hop.ifindex != 0 && now.wrapping_sub(hop.checked_at) <= NEXT_HOP_REFRESH;
        if fresh && hop.ifindex == ifindex && self.from(&hop.dmac) {
            return true;
        }
        if !names(backend, addr) {
            return true;
        }
        if fresh {
            return false;
        }
        match self.ask(addr, ifindex, hop, now) {
            Asked::Cached => hop.ifindex == ifindex && self.from(&hop.dmac),
            Asked::Interface(toward) => toward == ifindex,
            Asked::Unknown => hop.ifindex == 0 || hop.ifindex == ifindex,
        }
    }

    /// Whether the frame's source MAC is `mac` (always, where the frame's own is gone).
    #[inline(always)]
    fn from(&self, mac: &[u8; 6]) -> bool {
        // SAFETY: `mac` points into the packet, bounds-checked (`xdp`), if not null.
        self.mac.is_null() || unsafe { *self.mac } == *mac
    }

    /// Asks the FIB where packets to `addr` leave, as if routed from the packet's
    /// interface `ifindex` (the forward path asks from the client's; routes do not
    /// differ by input interface unless policy routing says so), and caches a whole
    /// answer in `hop` as the backend's forward packets would (`fwd::path`). The length
    /// the hop was seen to fit is kept only if the interface is the same, so the next
    /// forward packet asks the FIB again otherwise.
    #[inline(always)]
    fn ask<A: Family>(&self, addr: A, ifindex: u32, hop: &mut NextHop, now: u32) -> Asked {
        // SAFETY: the slot is used by this lookup only.
        let Some(params) = (unsafe { fib_params() }) else {
            return Asked::Unknown;
        };
        A::fib_toward(addr, params);
        params.ifindex = ifindex;
        // SAFETY: the context is the program's own; the parameters are whole.
        let rc = unsafe {
            fib_lookup(
                self.ctx,
                params,
                core::mem::size_of::<bpf_fib_lookup>() as i32,
                0,
            )
        };
        match rc as u32 {
            BPF_FIB_LKUP_RET_SUCCESS => {
                if hop.ifindex != params.ifindex {
                    hop.fit_len = 0;
                }
                hop.ifindex = params.ifindex;
                hop.dmac = params.dmac;
                hop.smac = params.smac;
                hop.checked_at = now;
                Asked::Cached
            }
            // The route was found and its interface set before the neighbour (or, for
            // an skb, its length) was checked.
            BPF_FIB_LKUP_RET_NO_NEIGH | BPF_FIB_LKUP_RET_FRAG_NEEDED => {
                Asked::Interface(params.ifindex)
            }
            _ => Asked::Unknown,
        }
    }
}

/// Whether backend id `backend` is the backend at `addr` (configured, live or not).
#[inline(always)]
fn names<A: Family>(backend: u32, addr: A) -> bool {
    BACKENDS
        .get(backend)
        .is_some_and(|b| A::backend_addr(backend, b) == addr)
}

/// Whether the operator lets replies come from anywhere (`config::REPLY_ORIGIN`).
#[inline(always)]
fn any_origin() -> bool {
    CONFIG.get(config::REPLY_ORIGIN) == Some(&config::REPLY_ORIGIN_ANY)
}

/// What the FIB said about the way to a backend.
enum Asked {
    /// Its interface and neighbour, now in the backend's next-hop cache.
    Cached,
    /// Its interface; the neighbour is not resolved.
    Interface(u32),
    /// No route (or not one the FIB answers for).
    Unknown,
}
