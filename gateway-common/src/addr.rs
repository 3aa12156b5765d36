//! Addresses as the maps hold them (`Addr`), and the address filter's slot of each
//! (`addr_slot`).

use crate::mix;

/// Entries of the `map_names::ADDR_FILTER` array.
pub const ADDR_FILTER_SLOTS: u32 = 1 << 16;
/// `map_names::ADDR_FILTER` bit: a gateway address hashes to this slot.
pub const ADDR_GATEWAY: u32 = 1;
/// `map_names::ADDR_FILTER` bit: a backend address hashes to this slot.
pub const ADDR_BACKEND: u32 = 2;

/// The `map_names::ADDR_FILTER` slot of an address (network order): a packet none of
/// whose addresses has a role there is not the program's business, known from two
/// array lookups (no hash-map lookup). A sharing address only costs its packets the
/// hash lookups. See `Addr::slot_bits` for each family's slot.
#[inline(always)]
pub fn addr_slot<A: Addr>(addr: A) -> u32 {
    addr.slot_bits() & (ADDR_FILTER_SLOTS - 1)
}

/// An address of one family as map keys and values hold it, network order: `u32`
/// (IPv4) or `[u32; 4]` (IPv6, the 16 bytes as four words). Keys and values generic
/// over it (`FlowKey<A>`, ...) default to IPv4, the layout pinned maps already have.
pub trait Addr: Copy + Eq + Default + core::fmt::Debug {
    /// 32 bits whose low 16 are the address filter's slot (`addr_slot`). IPv4: the
    /// address, host order, so its last 16 bits: the addresses of one subnet up to a
    /// /16 never share a slot, for one byte swap. IPv6: a hash of all 128 bits
    /// (`slot6`), because IPv6 hosts of different subnets often end alike (`::1`,
    /// `::10`), and the last 16 bits made a client `fd00:1::10` share a backend
    /// `fd00:2::10`'s slot.
    fn slot_bits(self) -> u32;
    /// The address folded to 32 bits for `flow_hash` (an IPv4 address is itself).
    fn fold(self) -> u32;
    /// Whether every bit is zero ("none" in `Flow::peer_addr`).
    fn is_zero(self) -> bool;
}

impl Addr for u32 {
    #[inline(always)]
    fn slot_bits(self) -> u32 {
        u32::from_be(self)
    }
    #[inline(always)]
    fn fold(self) -> u32 {
        self
    }
    #[inline(always)]
    fn is_zero(self) -> bool {
        self == 0
    }
}

impl Addr for [u32; 4] {
    #[inline(always)]
    fn slot_bits(self) -> u32 {
        slot6(self)
    }
    #[inline(always)]
    fn fold(self) -> u32 {
        mix(self[0] ^ mix(self[1] ^ mix(self[2] ^ mix(self[3]))))
    }
    #[inline(always)]
    fn is_zero(self) -> bool {
        self[0] | self[1] | self[2] | self[3] == 0
    }
}

/// The address filter's slot bits of an IPv6 address: multiply-shift over its four
/// words as they lie in memory (network order), the high half of the sum of four
/// independent products. Every bit of the address reaches the slot, and two addresses
/// that differ only in their last 16 bits (the high half of the last word, as loaded on
/// a little-endian host) never share one: `d << 16` times an odd constant is a
/// bijection of `d` in the high half. The products have no chain between them, so the
/// slot costs about one multiply's latency. (It was `fold`, the four chained
/// finalisers Maglev's flow hash keeps: 20 % of an IPv6 packet's program time, the one
/// stage IPv4 lacks; docs/benchmarks.md, "Issue 33's end".)
#[inline(always)]
pub const fn slot6(a: [u32; 4]) -> u32 {
    let h = a[0]
        .wrapping_mul(0x9e37_79b1)
        .wrapping_add(a[1].wrapping_mul(0x85eb_ca77))
        .wrapping_add(a[2].wrapping_mul(0xc2b2_ae3d))
        .wrapping_add(a[3].wrapping_mul(0x27d4_eb2f));
    h >> 16
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An IPv6 address as the maps hold it: its 16 bytes as four words, as they lie.
    fn v6(bytes: [u8; 16]) -> [u32; 4] {
        core::array::from_fn(|i| {
            u32::from_ne_bytes([
                bytes[4 * i],
                bytes[4 * i + 1],
                bytes[4 * i + 2],
                bytes[4 * i + 3],
            ])
        })
    }

    #[test]
    fn ipv6_hosts_of_one_slash_112_never_share_a_slot() {
        let mut seen = [false; ADDR_FILTER_SLOTS as usize];
        for last in 0..=u16::MAX {
            let mut bytes = [0u8; 16];
            bytes[..4].copy_from_slice(&[0xfd, 0, 0, 1]);
            bytes[14..].copy_from_slice(&last.to_be_bytes());
            let slot = addr_slot(v6(bytes)) as usize;
            assert!(!seen[slot], "::{last:x} shares slot {slot}");
            seen[slot] = true;
        }
    }

    #[test]
    fn ipv6_hosts_of_different_subnets_ending_alike_have_their_own_slots() {
        let host = |subnet: u8, last: u8| {
            let mut bytes = [0u8; 16];
            (bytes[0], bytes[3], bytes[15]) = (0xfd, subnet, last);
            addr_slot(v6(bytes))
        };
        for last in [1, 0x10, 0x64] {
            let slots: [u32; 8] = core::array::from_fn(|i| host(i as u8 + 1, last));
            for (i, a) in slots.iter().enumerate() {
                assert!(!slots[i + 1..].contains(a), "::{last:x}: {slots:?}");
            }
        }
    }
}
