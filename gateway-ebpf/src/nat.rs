//! Header rewriting with incremental checksum updates.
//!
//! A flow's translation has up to two halves: the destination half (a forward packet's
//! backend, or in SNAT mode a reply's client) and the source half (a reply's gateway
//! address, or in SNAT mode a forward packet's node address). The destination half is
//! applied whichever way the packet leaves; the source half only when XDP sends the
//! packet itself, because the kernel drops a received packet whose source is one of its
//! own addresses (a martian) — on the kernel's path the TC program applies it on egress.

use gateway_common::{Addr, Flow, NAT_DST};

use aya_ebpf::programs::XdpContext;

use crate::{
    csum::replace2,
    family::Family,
    packet::{ptr_at, Ports, TCP_CHECK_OFF, UDP_CHECK_OFF},
};

/// The transport header of a packet, when it is present (not in later fragments).
pub struct L4 {
    pub ports: *mut Ports,
    pub check: *mut u16,
    /// UDP: a zero checksum means "none" and stays zero.
    pub udp: bool,
}

impl L4 {
    /// The TCP (20 bytes) or UDP (8 bytes) header at `off` of a packet whose IP packet
    /// ends at `end` (both from the start of the frame), if it is all there.
    #[inline(always)]
    pub fn at(ctx: &XdpContext, off: usize, end: usize, udp: bool) -> Option<L4> {
        let (ports, check_off, len) = if udp {
            (
                ptr_at::<[u8; 8]>(ctx, off).map(|p| p as *mut Ports),
                UDP_CHECK_OFF,
                8,
            )
        } else {
            (
                ptr_at::<[u8; 20]>(ctx, off).map(|p| p as *mut Ports),
                TCP_CHECK_OFF,
                20,
            )
        };
        let ports = ports?;
        if off + len > end {
            return None;
        }
        Some(L4 {
            ports,
            // SAFETY: the checksum lies inside the header `ptr_at` checked (UDP 6..8 of
            // 8, TCP 16..18 of 20).
            check: unsafe { (ports as *mut u8).add(check_off) as *mut u16 },
            udp,
        })
    }

    /// Source port, destination port (network order), checksum, and the TCP flags
    /// (byte 13 of the TCP header; 0 for UDP).
    #[inline(always)]
    pub fn fields(&self) -> (u16, u16, u16, u8) {
        // SAFETY: `at` checked the whole header.
        unsafe {
            let flags = if self.udp {
                0
            } else {
                *(self.ports as *const u8).add(13)
            };
            ((*self.ports).src, (*self.ports).dst, *self.check, flags)
        }
    }

    /// The TCP flags (byte 13 of the TCP header; 0 for UDP).
    #[inline(always)]
    pub fn tcp_flags(&self) -> u8 {
        if self.udp {
            return 0;
        }
        // SAFETY: `at` checked the whole header.
        unsafe { *(self.ports as *const u8).add(13) }
    }
}

/// Which address and port of a packet a rewrite changes.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Side {
    Src,
    Dst,
}

/// An address and port to write (network order).
#[derive(Clone, Copy)]
pub struct Endpoint<A: Addr = u32> {
    pub addr: A,
    pub port: u16,
}

/// The destination and source halves of a flow's translation (see the module doc).
#[inline(always)]
pub fn halves<A: Addr>(flow: &Flow<A>) -> (Option<Endpoint<A>>, Option<Endpoint<A>>) {
    let nat = Endpoint {
        addr: flow.nat_addr,
        port: flow.nat_port,
    };
    let peer = flow.is_snat().then_some(Endpoint {
        addr: flow.peer_addr,
        port: flow.peer_port,
    });
    if flow.kind == NAT_DST {
        (Some(nat), peer)
    } else {
        (peer, Some(nat))
    }
}

/// Rewrites one side's address and (with a transport header) port.
///
/// # Safety
/// `ip` and the pointers in `l4` must point into the packet, bounds-checked.
#[inline(always)]
pub unsafe fn rewrite<A: Family>(ip: *mut A::Hdr, l4: Option<&L4>, side: Side, to: Endpoint<A>) {
    let old_addr = A::set_addr(ip, side, to.addr);

    let Some(l4) = l4 else {
        return;
    };
    let port = if side == Side::Dst {
        &mut (*l4.ports).dst
    } else {
        &mut (*l4.ports).src
    };
    let old_port = *port;
    *port = to.port;
    let check = *l4.check;
    if l4.udp && check == 0 {
        return;
    }
    let mut check = replace2(A::csum_addr(check, old_addr, to.addr), old_port, to.port);
    if l4.udp && check == 0 {
        check = 0xffff;
    }
    *l4.check = check;
}
