//! The address family a program instance serves. The flow logic (`conntrack/`,
//! `nat.rs`, `fwd.rs`, `translate`) is written once, generic over `Family`, which the
//! address type itself implements (so the family follows from the keys a function is
//! given): each family brings its maps and how its network header is read and
//! rewritten. IPv4 is `u32`, IPv6 `[u32; 4]` (see docs/ipv6.md).

use core::mem::MaybeUninit;

use aya_ebpf::{
    bindings::bpf_fib_lookup,
    maps::{HashMap, LruHashMap},
};
use gateway_common::{
    proto::{self, ipv6_ext},
    Addr, Affinity, AffinityKey, Backend, Flow, FlowKey, FragKey, FragKey6, FragPorts, ReplyIndex,
    Service, ServiceKey,
};

use crate::{
    csum::{replace2, replace4},
    maps::{
        Addr6, Pending, ADDRESSES, ADDRESSES6, AFFINITY, AFFINITY6, BACKENDS6, CONNTRACK,
        CONNTRACK6, FRAGMENTS, FRAGMENTS6, PENDING, PENDING6, REPLY_INDEX, REPLY_INDEX6, SCRATCH,
        SCRATCH6, SERVICES, SERVICES6, SNAT_SOURCES, SNAT_SOURCES6,
    },
    nat::Side,
    packet::{Ipv4, Ipv6, IPV6_LEN},
};

/// One address family, implemented by its address type (as keys and values hold it):
/// its maps and network header.
pub trait Family: Addr + 'static {
    /// The network header.
    type Hdr;

    /// (gateway address, protocol, port) → service.
    fn services() -> &'static HashMap<ServiceKey<Self>, Service>;
    /// Gateway address → number of services on it.
    fn addresses() -> &'static HashMap<Self, u32>;
    /// The conntrack.
    fn conntrack() -> &'static LruHashMap<FlowKey<Self>, Flow<Self>>;
    /// A client of a service with session affinity → its backend.
    fn affinity() -> &'static LruHashMap<AffinityKey<Self>, Affinity>;
    /// Backend endpoint → the router-mode services it serves.
    fn reply_index() -> &'static HashMap<ServiceKey<Self>, ReplyIndex<Self>>;
    /// This CPU's scratch flow slot (see `maps::SCRATCH`).
    fn scratch() -> Option<&'static mut MaybeUninit<Flow<Self>>>;
    /// This CPU's pending entry (see `maps::Pending`).
    fn pending() -> Option<&'static mut Pending<Self>>;
    /// The address of backend `id` (whose `BACKENDS` entry is `backend`).
    fn backend_addr(id: u32, backend: &Backend) -> Self;
    /// The node's address toward backend `id` (SNAT mode), if one is known.
    fn snat_source(id: u32) -> Option<Self>;
    /// The ports the first fragment of datagram `id` (network order; IPv4's 16-bit id
    /// zero-extended) from `src` to `dst` of protocol `proto` showed, if it was seen.
    fn fragment_ports(src: Self, dst: Self, id: u32, proto: u8) -> Option<FragPorts>;
    /// Remembers the ports of a first fragment (see `fragment_ports`).
    fn remember_fragment(src: Self, dst: Self, id: u32, proto: u8, ports: FragPorts);

    /// The header's source and destination.
    ///
    /// # Safety
    /// `ip` must point into the packet, bounds-checked.
    unsafe fn addrs(ip: *const Self::Hdr) -> (Self, Self);
    /// Writes `side`'s address, keeping the header's own checksum (if any) right;
    /// returns the old address.
    ///
    /// # Safety
    /// `ip` must point into the packet, bounds-checked.
    unsafe fn set_addr(ip: *mut Self::Hdr, side: Side, to: Self) -> Self;
    /// A transport checksum after an address of its pseudo-header changed.
    fn csum_addr(check: u16, old: Self, new: Self) -> u16;
    /// TTL or hop limit.
    ///
    /// # Safety
    /// `ip` must point into the packet, bounds-checked.
    unsafe fn hops(ip: *const Self::Hdr) -> u8;
    /// Decrements the TTL or hop limit (one forwarding hop).
    ///
    /// # Safety
    /// `ip` must point into the packet, bounds-checked.
    unsafe fn decrement_hops(ip: *mut Self::Hdr);
    /// The length of the IP packet (header included), host order.
    ///
    /// # Safety
    /// `ip` must point into the packet, bounds-checked.
    unsafe fn ip_len(ip: *const Self::Hdr) -> u16;
    /// Fills the family, addresses, protocol, length and class of a FIB lookup.
    ///
    /// # Safety
    /// `ip` must point into the packet, bounds-checked.
    unsafe fn fib_params(ip: *const Self::Hdr, params: &mut bpf_fib_lookup);
    /// Fills the family and destination of a FIB lookup toward `addr` (`origin.rs`:
    /// where a backend's packets go).
    fn fib_toward(addr: Self, params: &mut bpf_fib_lookup);

    /// 32-bit words in an address (for the skb checksum helpers, which take 4 bytes at
    /// a time).
    const WORDS: usize;
    /// Word `i` (< `WORDS`) of the address, network order.
    fn word(self, i: usize) -> u32;
    /// Offset of the source address in the network header.
    const SRC_OFF: usize;
    /// Offset of the network header's own checksum, if it has one (IPv4).
    const HDR_CHECK_OFF: Option<usize>;

    /// ICMP's protocol number in this family.
    const ICMP: u8;
    /// Whether ICMP type `kind` is an error about a packet that is translated like the
    /// packet it quotes.
    fn icmp_error(kind: u8) -> bool;
    /// Whether the ICMP checksum covers the pseudo-header (ICMPv6): an outer address
    /// change changes it too.
    const ICMP_PSEUDO: bool;
    /// Whether a quoted transport checksum is kept right when the quote is translated
    /// (IPv6; IPv4 leaves it, receivers do not verify it).
    const QUOTE_L4_CHECK: bool;
    /// The transport protocol of a quoted packet whose TCP or UDP header follows the
    /// fixed header (`size_of::<Hdr>()` bytes) at once; otherwise none.
    ///
    /// # Safety
    /// `ip` must point to a whole header, bounds-checked.
    unsafe fn quoted_proto(ip: *const Self::Hdr) -> Option<u8>;
    /// Whether a quoted header is followed at once by a fragment header (IPv6: the
    /// quote of a fragment; see `icmp::quoted_transport`).
    ///
    /// # Safety
    /// `ip` must point to a whole header, bounds-checked.
    unsafe fn quotes_fragment(ip: *const Self::Hdr) -> bool;
    /// The header's own checksum (0 without one).
    ///
    /// # Safety
    /// `ip` must point to a whole header, bounds-checked.
    unsafe fn hdr_check(ip: *const Self::Hdr) -> u16;
}

/// ICMP type "destination unreachable" (fragmentation needed is its code 4).
const ICMP_DEST_UNREACH: u8 = 3;
/// ICMP type "time exceeded".
const ICMP_TIME_EXCEEDED: u8 = 11;
/// ICMP type "parameter problem" (its pointer is an offset into the quoted packet,
/// which the translation does not move).
const ICMP_PARAMETER_PROBLEM: u8 = 12;
/// ICMPv6 types "destination unreachable" (1), "packet too big" (2), "time exceeded"
/// (3) and "parameter problem" (4): every ICMPv6 error (RFC 4443 2.1; 5-127 are
/// unassigned).
const ICMPV6_ERRORS: core::ops::RangeInclusive<u8> = 1..=4;

const AF_INET: u8 = 2;
const AF_INET6: u8 = 10;

/// IPv4.
impl Family for u32 {
    type Hdr = Ipv4;

    #[inline(always)]
    fn services() -> &'static HashMap<ServiceKey, Service> {
        &SERVICES
    }

    #[inline(always)]
    fn addresses() -> &'static HashMap<u32, u32> {
        &ADDRESSES
    }

    #[inline(always)]
    fn conntrack() -> &'static LruHashMap<FlowKey, Flow> {
        &CONNTRACK
    }

    #[inline(always)]
    fn affinity() -> &'static LruHashMap<AffinityKey, Affinity> {
        &AFFINITY
    }

    #[inline(always)]
    fn reply_index() -> &'static HashMap<ServiceKey, ReplyIndex> {
        &REPLY_INDEX
    }

    #[inline(always)]
    fn scratch() -> Option<&'static mut MaybeUninit<Flow>> {
        let slot = SCRATCH.get_ptr_mut(0)?;
        // SAFETY: per-CPU slot, used only by this CPU while the program runs;
        // MaybeUninit has the layout of Flow.
        Some(unsafe { &mut *(slot as *mut MaybeUninit<Flow>) })
    }

    #[inline(always)]
    fn pending() -> Option<&'static mut Pending<u32>> {
        // SAFETY: per-CPU slot, used only by this CPU while the program runs.
        PENDING.get_ptr_mut(0).map(|p| unsafe { &mut *p })
    }

    #[inline(always)]
    fn backend_addr(_id: u32, backend: &Backend) -> u32 {
        backend.addr
    }

    #[inline(always)]
    fn snat_source(id: u32) -> Option<u32> {
        match SNAT_SOURCES.get(id) {
            Some(&addr) if addr != 0 => Some(addr),
            _ => None,
        }
    }

    #[inline(always)]
    fn fragment_ports(src: u32, dst: u32, id: u32, proto: u8) -> Option<FragPorts> {
        // SAFETY: the value is copied out at once, before the map can change it.
        unsafe { FRAGMENTS.get(frag_key4(src, dst, id, proto)) }.copied()
    }

    #[inline(always)]
    fn remember_fragment(src: u32, dst: u32, id: u32, proto: u8, ports: FragPorts) {
        let _ = FRAGMENTS.insert(frag_key4(src, dst, id, proto), ports, 0);
    }

    #[inline(always)]
    unsafe fn addrs(ip: *const Ipv4) -> (u32, u32) {
        ((*ip).src, (*ip).dst)
    }

    #[inline(always)]
    unsafe fn set_addr(ip: *mut Ipv4, side: Side, to: u32) -> u32 {
        let addr = match side {
            Side::Dst => &mut (*ip).dst,
            Side::Src => &mut (*ip).src,
        };
        let old = *addr;
        *addr = to;
        (*ip).check = replace4((*ip).check, old, to);
        old
    }

    #[inline(always)]
    fn csum_addr(check: u16, old: u32, new: u32) -> u16 {
        replace4(check, old, new)
    }

    #[inline(always)]
    unsafe fn hops(ip: *const Ipv4) -> u8 {
        (*ip).ttl
    }

    #[inline(always)]
    unsafe fn decrement_hops(ip: *mut Ipv4) {
        // The TTL shares a 16-bit checksum word with the protocol field.
        let word = (ip as *mut u8).add(8) as *mut u16;
        let old = *word;
        (*ip).ttl -= 1;
        (*ip).check = replace2((*ip).check, old, *word);
    }

    #[inline(always)]
    unsafe fn ip_len(ip: *const Ipv4) -> u16 {
        u16::from_be((*ip).tot_len)
    }

    const WORDS: usize = 1;

    #[inline(always)]
    fn word(self, _i: usize) -> u32 {
        self
    }

    const SRC_OFF: usize = 12;
    const HDR_CHECK_OFF: Option<usize> = Some(10);
    const ICMP: u8 = proto::ICMP;

    #[inline(always)]
    fn icmp_error(kind: u8) -> bool {
        kind == ICMP_DEST_UNREACH || kind == ICMP_TIME_EXCEEDED || kind == ICMP_PARAMETER_PROBLEM
    }

    const ICMP_PSEUDO: bool = false;
    const QUOTE_L4_CHECK: bool = false;

    #[inline(always)]
    unsafe fn quoted_proto(ip: *const Ipv4) -> Option<u8> {
        // Quoted packets with IP options are rare enough to leave to the kernel.
        let p = (*ip).proto;
        ((*ip).vihl == 0x45 && (p == proto::TCP || p == proto::UDP)).then_some(p)
    }

    #[inline(always)]
    unsafe fn quotes_fragment(_ip: *const Ipv4) -> bool {
        // An IPv4 fragment's ports follow its header as in any packet.
        false
    }

    #[inline(always)]
    unsafe fn hdr_check(ip: *const Ipv4) -> u16 {
        (*ip).check
    }

    #[inline(always)]
    unsafe fn fib_params(ip: *const Ipv4, params: &mut bpf_fib_lookup) {
        params.family = AF_INET;
        params.l4_protocol = (*ip).proto;
        params.__bindgen_anon_1.tot_len = u16::from_be((*ip).tot_len);
        params.__bindgen_anon_2.tos = (*ip).tos;
        params.__bindgen_anon_3.ipv4_src = (*ip).src;
        params.__bindgen_anon_4.ipv4_dst = (*ip).dst;
    }

    #[inline(always)]
    fn fib_toward(addr: u32, params: &mut bpf_fib_lookup) {
        params.family = AF_INET;
        params.__bindgen_anon_4.ipv4_dst = addr;
    }
}

/// IPv6.
impl Family for Addr6 {
    type Hdr = Ipv6;

    #[inline(always)]
    fn services() -> &'static HashMap<ServiceKey<Addr6>, Service> {
        &SERVICES6
    }

    #[inline(always)]
    fn addresses() -> &'static HashMap<Addr6, u32> {
        &ADDRESSES6
    }

    #[inline(always)]
    fn conntrack() -> &'static LruHashMap<FlowKey<Addr6>, Flow<Addr6>> {
        &CONNTRACK6
    }

    #[inline(always)]
    fn affinity() -> &'static LruHashMap<AffinityKey<Addr6>, Affinity> {
        &AFFINITY6
    }

    #[inline(always)]
    fn reply_index() -> &'static HashMap<ServiceKey<Addr6>, ReplyIndex<Addr6>> {
        &REPLY_INDEX6
    }

    #[inline(always)]
    fn scratch() -> Option<&'static mut MaybeUninit<Flow<Addr6>>> {
        let slot = SCRATCH6.get_ptr_mut(0)?;
        // SAFETY: as for IPv4.
        Some(unsafe { &mut *(slot as *mut MaybeUninit<Flow<Addr6>>) })
    }

    #[inline(always)]
    fn pending() -> Option<&'static mut Pending<Addr6>> {
        // SAFETY: as for IPv4.
        PENDING6.get_ptr_mut(0).map(|p| unsafe { &mut *p })
    }

    #[inline(always)]
    fn backend_addr(id: u32, _backend: &Backend) -> Addr6 {
        BACKENDS6.get(id).copied().unwrap_or_default()
    }

    #[inline(always)]
    fn snat_source(id: u32) -> Option<Addr6> {
        match SNAT_SOURCES6.get(id) {
            Some(addr) if !addr.is_zero() => Some(*addr),
            _ => None,
        }
    }

    #[inline(always)]
    fn fragment_ports(src: Addr6, dst: Addr6, id: u32, proto: u8) -> Option<FragPorts> {
        // SAFETY: the value is copied out at once, before the map can change it.
        unsafe { FRAGMENTS6.get(frag_key6(src, dst, id, proto)) }.copied()
    }

    #[inline(always)]
    fn remember_fragment(src: Addr6, dst: Addr6, id: u32, proto: u8, ports: FragPorts) {
        let _ = FRAGMENTS6.insert(frag_key6(src, dst, id, proto), ports, 0);
    }

    #[inline(always)]
    unsafe fn addrs(ip: *const Ipv6) -> (Addr6, Addr6) {
        ((*ip).src, (*ip).dst)
    }

    #[inline(always)]
    unsafe fn set_addr(ip: *mut Ipv6, side: Side, to: Addr6) -> Addr6 {
        let addr = match side {
            Side::Dst => &mut (*ip).dst,
            Side::Src => &mut (*ip).src,
        };
        let old = *addr;
        *addr = to;
        old
    }

    #[inline(always)]
    fn csum_addr(check: u16, old: Addr6, new: Addr6) -> u16 {
        let mut check = check;
        for i in 0..4 {
            check = replace4(check, old[i], new[i]);
        }
        check
    }

    #[inline(always)]
    unsafe fn hops(ip: *const Ipv6) -> u8 {
        (*ip).hop_limit
    }

    #[inline(always)]
    unsafe fn decrement_hops(ip: *mut Ipv6) {
        (*ip).hop_limit -= 1;
    }

    #[inline(always)]
    unsafe fn ip_len(ip: *const Ipv6) -> u16 {
        u16::from_be((*ip).payload_len).wrapping_add(IPV6_LEN as u16)
    }

    const WORDS: usize = 4;

    #[inline(always)]
    fn word(self, i: usize) -> u32 {
        self[i]
    }

    const SRC_OFF: usize = 8;
    const HDR_CHECK_OFF: Option<usize> = None;
    const ICMP: u8 = proto::ICMPV6;

    #[inline(always)]
    fn icmp_error(kind: u8) -> bool {
        ICMPV6_ERRORS.contains(&kind)
    }

    const ICMP_PSEUDO: bool = true;
    const QUOTE_L4_CHECK: bool = true;

    #[inline(always)]
    unsafe fn quoted_proto(ip: *const Ipv6) -> Option<u8> {
        // A quote with other extension headers than a fragment header
        // (`quotes_fragment`) is left to the kernel.
        let p = (*ip).next_hdr;
        ((*ip).vtc_flow & 0xf0 == 0x60 && (p == proto::TCP || p == proto::UDP)).then_some(p)
    }

    #[inline(always)]
    unsafe fn quotes_fragment(ip: *const Ipv6) -> bool {
        (*ip).vtc_flow & 0xf0 == 0x60 && (*ip).next_hdr == ipv6_ext::FRAGMENT
    }

    #[inline(always)]
    unsafe fn hdr_check(_ip: *const Ipv6) -> u16 {
        0
    }

    #[inline(always)]
    unsafe fn fib_params(ip: *const Ipv6, params: &mut bpf_fib_lookup) {
        params.family = AF_INET6;
        params.l4_protocol = (*ip).next_hdr;
        params.__bindgen_anon_1.tot_len = Self::ip_len(ip);
        // Traffic class and flow label (the version masked off), network order, as the
        // kernel's own XDP forwarding example passes them.
        params.__bindgen_anon_2.flowinfo = (*ip).vtc_flow & 0xffff_ff0fu32;
        params.__bindgen_anon_3.ipv6_src = (*ip).src;
        params.__bindgen_anon_4.ipv6_dst = (*ip).dst;
    }

    #[inline(always)]
    fn fib_toward(addr: Addr6, params: &mut bpf_fib_lookup) {
        params.family = AF_INET6;
        params.__bindgen_anon_4.ipv6_dst = addr;
    }
}

/// The IPv4 fragment map's key (`id`: the header's 16-bit id, network order, widened).
#[inline(always)]
fn frag_key4(src: u32, dst: u32, id: u32, proto: u8) -> FragKey {
    FragKey {
        src,
        dst,
        id: id as u16,
        proto,
        pad: 0,
    }
}

/// The IPv6 fragment map's key.
#[inline(always)]
fn frag_key6(src: Addr6, dst: Addr6, id: u32, proto: u8) -> FragKey6 {
    FragKey6 {
        src,
        dst,
        id,
        proto,
        pad: [0; 3],
    }
}
