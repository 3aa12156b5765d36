//! Incremental Internet checksum updates (RFC 1624: HC' = ~(~HC + ~m + m')).
//!
//! Values are the raw header words read as native integers; the one's-complement sum
//! does not depend on byte order as long as every word is read the same way.

#[inline(always)]
fn fold(mut sum: u32) -> u16 {
    sum = (sum & 0xffff) + (sum >> 16);
    sum = (sum & 0xffff) + (sum >> 16);
    sum as u16
}

/// Checksum after a 16-bit word changed from `old` to `new`.
#[inline(always)]
pub fn replace2(check: u16, old: u16, new: u16) -> u16 {
    let sum = (!check) as u32 + (!old) as u32 + new as u32;
    !fold(sum)
}

/// Checksum after a 32-bit field changed from `old` to `new`.
#[inline(always)]
pub fn replace4(check: u16, old: u32, new: u32) -> u16 {
    let sum = (!check) as u32 + ((!old) & 0xffff) + ((!old) >> 16) + (new & 0xffff) + (new >> 16);
    !fold(sum)
}
