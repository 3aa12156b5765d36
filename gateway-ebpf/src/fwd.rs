//! Forwarding a rewritten packet: FIB lookup, MAC rewrite and redirect, else the kernel.

use aya_ebpf::{
    bindings::{bpf_fib_lookup, xdp_action, BPF_FIB_LKUP_RET_SUCCESS},
    helpers::generated::{bpf_fib_lookup as fib_lookup, bpf_ktime_get_coarse_ns, bpf_redirect},
    programs::XdpContext,
};
use gateway_common::{Counter, NextHop, NEXT_HOP_REFRESH};

use crate::{
    csum::replace2,
    maps::count,
    packet::{Eth, Ipv4},
};

const AF_INET: u8 = 2;

/// Sends the packet on its way: straight out of the egress interface when the kernel's
/// FIB knows the route and the neighbour, otherwise up the stack, which forwards it
/// (and resolves the neighbour, or answers with ICMP when the TTL runs out).
///
/// `hop` caches the FIB's answer for the flow; it is asked again when the cache is
/// empty, about a second old, or the packet is longer than any the FIB has accepted
/// (the FIB checks the MTU).
///
/// # Safety
/// `eth` and `ip` must point into the packet, bounds-checked.
#[inline(always)]
pub unsafe fn forward(ctx: &XdpContext, eth: *mut Eth, ip: *mut Ipv4, hop: &mut NextHop) -> u32 {
    if (*ip).ttl <= 1 {
        count(Counter::KernelForward);
        return xdp_action::XDP_PASS;
    }
    let ingress = ctx.ingress_ifindex() as u32;
    let len = u16::from_be((*ip).tot_len);
    let now = (bpf_ktime_get_coarse_ns() >> 20) as u32;
    if hop.ifindex == 0 || len > hop.fit_len || now.wrapping_sub(hop.checked_at) > NEXT_HOP_REFRESH
    {
        let Some(found) = fib(ctx, ip, ingress) else {
            // Asked and not answered: ask again on the next packet. The time still says
            // the flow is alive (userspace counts active flows by it).
            hop.ifindex = 0;
            hop.checked_at = now;
            count(Counter::KernelForward);
            return xdp_action::XDP_PASS;
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
    // The TTL shares a 16-bit checksum word with the protocol field.
    let word = (ip as *mut u8).add(8) as *mut u16;
    let old = *word;
    (*ip).ttl -= 1;
    (*ip).check = replace2((*ip).check, old, *word);
    (*eth).dst = hop.dmac;
    (*eth).src = hop.smac;
    if hop.ifindex == ingress {
        count(Counter::Tx);
        return xdp_action::XDP_TX;
    }
    count(Counter::Redirect);
    bpf_redirect(hop.ifindex, 0) as u32
}

struct Found {
    ifindex: u32,
    dmac: [u8; 6],
    smac: [u8; 6],
}

/// Asks the kernel's FIB (routes and neighbours, MTU checked) where `ip` goes.
#[inline(always)]
unsafe fn fib(ctx: &XdpContext, ip: *mut Ipv4, ingress: u32) -> Option<Found> {
    // All 64 bytes must be initialised for the helper. Zeroed word by word with volatile
    // stores: a plain zeroed() becomes a call to a BPF memset subprogram, which costs
    // more than the rest of the fast path together.
    let mut params = core::mem::MaybeUninit::<bpf_fib_lookup>::uninit();
    let words = params.as_mut_ptr() as *mut u64;
    for i in 0..core::mem::size_of::<bpf_fib_lookup>() / 8 {
        core::ptr::write_volatile(words.add(i), 0);
    }
    // SAFETY: every byte was just written; all-zero is a valid bpf_fib_lookup.
    let mut params = params.assume_init();
    params.family = AF_INET;
    params.l4_protocol = (*ip).proto;
    params.__bindgen_anon_1.tot_len = u16::from_be((*ip).tot_len);
    params.ifindex = ingress;
    params.__bindgen_anon_2.tos = (*ip).tos;
    params.__bindgen_anon_3.ipv4_src = (*ip).src;
    params.__bindgen_anon_4.ipv4_dst = (*ip).dst;
    let rc = fib_lookup(
        ctx.ctx.cast(),
        &mut params,
        core::mem::size_of::<bpf_fib_lookup>() as i32,
        0,
    );
    if rc != BPF_FIB_LKUP_RET_SUCCESS as i64 {
        return None;
    }
    Some(Found {
        ifindex: params.ifindex,
        dmac: params.dmac,
        smac: params.smac,
    })
}
