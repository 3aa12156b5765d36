//! IP protocol numbers the datapath handles.

/// ICMP.
pub const ICMP: u8 = 1;
/// TCP.
pub const TCP: u8 = 6;
/// UDP.
pub const UDP: u8 = 17;
/// ICMPv6.
pub const ICMPV6: u8 = 58;
/// IPv6 extension headers the datapath walks past.
pub mod ipv6_ext {
    /// Hop-by-hop options.
    pub const HOP_BY_HOP: u8 = 0;
    /// Routing.
    pub const ROUTING: u8 = 43;
    /// Fragment.
    pub const FRAGMENT: u8 = 44;
    /// Authentication header.
    pub const AUTH: u8 = 51;
    /// Destination options.
    pub const DEST_OPTS: u8 = 60;
}
