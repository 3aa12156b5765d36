//! How a packet leaves by each interface (`map_names::XMIT`), and the bridges'
//! forwarding databases (`map_names::FDB`) the hand-off to TC reads.

/// Entries of the `map_names::XMIT` array: interfaces with a higher index are never
/// redirected to (their packets take the kernel's path, counted).
pub const XMIT_SLOTS: u32 = 65536;

/// `berth_xmit` value: the interface accepts redirected XDP frames (the kernel's
/// `NETDEV_XDP_ACT_NDO_XMIT`), so the program may `bpf_redirect` into it.
pub const XMIT_OK: u32 = 1;

/// `berth_xmit` value: the interface takes no XDP frames but carries Ethernet (a
/// bridge, a veth whose peer runs no XDP, a VXLAN): XDP hands the packet to the TC
/// program on the receiving interface's ingress, which sends it out with `bpf_redirect`.
pub const XMIT_TC: u32 = 2;

/// `berth_xmit` value: as `XMIT_TC`, for a veth whose peer is in another network
/// namespace (a pod's): the TC program sends the packet into the peer's namespace with
/// `bpf_redirect_peer`.
pub const XMIT_TC_PEER: u32 = 3;

/// `berth_xmit` value: as `XMIT_TC`, for a bridge without VLAN filtering (`cni0`): the
/// TC program looks the next hop's MAC up in `map_names::FDB` and sends the packet
/// into the bridge port that holds it (into its peer's namespace if the port is a veth
/// with `XMIT_TC_PEER`), past the bridge; a MAC the map lacks goes into the bridge.
pub const XMIT_TC_BRIDGE: u32 = 4;

/// The bits of a `berth_xmit` value that say how a packet leaves by the interface.
pub const XMIT_EGRESS: u32 = 0xff;

/// `berth_xmit` bit: the interface is attached and its TC ingress holds the hand-off
/// program (`berth_tc_in`), so XDP may hand packets arriving on it to TC.
pub const XMIT_HANDOFF_IN: u32 = 1 << 8;

/// Key of `map_names::FDB`: a MAC in a bridge's forwarding database.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FdbKey {
    /// The bridge's interface index, host order.
    pub bridge: u32,
    /// The MAC.
    pub mac: [u8; 6],
    /// Always zero.
    pub pad: [u8; 2],
}

/// Entries of `map_names::FDB`: MACs beyond it are sent into their bridge.
pub const FDB_ENTRIES: u32 = 8192;
