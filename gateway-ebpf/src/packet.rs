//! Header layouts and bounds-checked packet access.
//!
//! Multi-byte fields hold wire bytes read as native integers ("network order").

use aya_ebpf::programs::XdpContext;

pub const ETH_LEN: usize = 14;
/// EtherType IPv4 as read natively from the wire.
pub const ETH_P_IP: u16 = 0x0800u16.to_be();
/// EtherType IPv6 as read natively from the wire.
pub const ETH_P_IPV6: u16 = 0x86ddu16.to_be();
pub const IPV4_MIN_LEN: usize = 20;
/// "More fragments" flag in `Ipv4::frag`, host order.
pub const IP_MF: u16 = 0x2000;
/// Fragment offset mask in `Ipv4::frag`, host order.
pub const IP_OFFSET: u16 = 0x1fff;

#[repr(C)]
pub struct Eth {
    pub dst: [u8; 6],
    pub src: [u8; 6],
    pub ether_type: u16,
}

#[repr(C)]
pub struct Ipv4 {
    pub vihl: u8,
    pub tos: u8,
    pub tot_len: u16,
    pub id: u16,
    pub frag: u16,
    pub ttl: u8,
    pub proto: u8,
    pub check: u16,
    pub src: u32,
    pub dst: u32,
}

pub const IPV6_LEN: usize = 40;

#[repr(C)]
pub struct Ipv6 {
    /// Version, traffic class, flow label.
    pub vtc_flow: u32,
    pub payload_len: u16,
    pub next_hdr: u8,
    pub hop_limit: u8,
    pub src: [u32; 4],
    pub dst: [u32; 4],
}

/// The first two bytes of an IPv6 extension header.
#[repr(C)]
pub struct ExtHdr {
    pub next_hdr: u8,
    /// Length in 8-byte units after the first 8 (AH: 4-byte units after the first 8).
    pub len: u8,
}

/// The IPv6 fragment header (8 bytes).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct FragHdr {
    pub next_hdr: u8,
    pub reserved: u8,
    /// Offset (13 bits, 8-byte units), 2 reserved bits, more-fragments; network order.
    pub frag: u16,
    pub id: u32,
}

/// The first eight bytes of TCP and UDP headers share the port layout.
#[repr(C)]
pub struct Ports {
    pub src: u16,
    pub dst: u16,
}

#[repr(C)]
pub struct Icmp {
    pub kind: u8,
    pub code: u8,
    pub check: u16,
    pub rest: u32,
}

/// Offset of the checksum within the TCP header.
pub const TCP_CHECK_OFF: usize = 16;
/// TCP flags (byte 13 of the header): SYN.
pub const TCP_SYN: u8 = 0x02;
/// TCP flags: ACK.
pub const TCP_ACK: u8 = 0x10;
/// Offset of the checksum within the UDP header.
pub const UDP_CHECK_OFF: usize = 6;

/// A pointer to a `T` at `offset` into the packet, if the packet is long enough.
#[inline(always)]
pub fn ptr_at<T>(ctx: &XdpContext, offset: usize) -> Option<*mut T> {
    let start = ctx.data();
    let end = ctx.data_end();
    if start + offset + core::mem::size_of::<T>() > end {
        return None;
    }
    Some((start + offset) as *mut T)
}
