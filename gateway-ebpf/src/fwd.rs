//! Forwarding a rewritten packet: FIB lookup, MAC rewrite and redirect, else the kernel.

use aya_ebpf::{
    bindings::{bpf_fib_lookup, xdp_action, BPF_FIB_LKUP_RET_SUCCESS},
    helpers::generated::{bpf_fib_lookup as fib_lookup, bpf_redirect},
    programs::XdpContext,
};
use gateway_common::Counter;

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
/// # Safety
/// `eth` and `ip` must point into the packet, bounds-checked.
#[inline(always)]
pub unsafe fn forward(ctx: &XdpContext, eth: *mut Eth, ip: *mut Ipv4) -> u32 {
    let ingress = ctx.ingress_ifindex() as u32;
    // SAFETY: bpf_fib_lookup is plain data; all-zero is a valid value.
    let mut params: bpf_fib_lookup = core::mem::zeroed();
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
    if rc != BPF_FIB_LKUP_RET_SUCCESS as i64 || (*ip).ttl <= 1 {
        count(Counter::KernelForward);
        return xdp_action::XDP_PASS;
    }
    // The TTL shares a 16-bit checksum word with the protocol field.
    let word = (ip as *mut u8).add(8) as *mut u16;
    let old = *word;
    (*ip).ttl -= 1;
    (*ip).check = replace2((*ip).check, old, *word);
    (*eth).dst = params.dmac;
    (*eth).src = params.smac;
    if params.ifindex == ingress {
        count(Counter::Tx);
        return xdp_action::XDP_TX;
    }
    count(Counter::Redirect);
    bpf_redirect(params.ifindex, 0) as u32
}
