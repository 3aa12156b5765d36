//! The named per-CPU counters: every verdict other than "pass untouched" counts one,
//! and which of them are `berth monitor`'s events.

macro_rules! counters {
    ($($(#[doc = $doc:literal])* $variant:ident = $name:literal,)*) => {
        /// Named per-CPU counters: every verdict other than "pass untouched" counts one.
        #[repr(u32)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub enum Counter {
            $($(#[doc = $doc])* $variant,)*
        }

        impl Counter {
            /// All counters in index order.
            pub const ALL: &'static [Counter] = &[$(Counter::$variant,)*];
            /// Number of counters (size of the counter map).
            pub const COUNT: u32 = Self::ALL.len() as u32;

            /// Name used in metrics and test output.
            pub const fn name(self) -> &'static str {
                match self {
                    $(Counter::$variant => $name,)*
                }
            }
        }
    };
}

counters! {
    /// NATed and sent out with `bpf_redirect` into another interface (XDP_REDIRECT).
    Redirect = "redirect",
    /// NATed and sent back out of the receiving interface (XDP_REDIRECT to itself).
    Tx = "tx",
    /// Handed to the kernel to forward: the egress interface takes no XDP frames
    /// (a veth whose peer has neither XDP nor GRO, a bridge, a tunnel, ...).
    KernelNoXdpEgress = "kernel_forward_no_xdp_egress",
    /// Handed to the kernel to forward: the next hop's neighbour entry is not resolved yet.
    KernelNoNeighbour = "kernel_forward_no_neighbour",
    /// Handed to the kernel to forward: longer than the egress MTU (the kernel fragments
    /// it or answers ICMP fragmentation-needed, which is translated back).
    KernelFragNeeded = "kernel_forward_frag_needed",
    /// Handed to the kernel: TTL 1 (the kernel answers ICMP time-exceeded).
    KernelTtl = "kernel_forward_ttl",
    /// Handed to the kernel: the FIB has no usable route (unreachable, blackhole,
    /// prohibited, local); the kernel answers or drops it as its routes say.
    KernelNoRoute = "kernel_forward_no_route",
    /// Handed to the kernel, which will drop it: forwarding is disabled on the ingress
    /// interface (`net.ipv4.conf.*.forwarding=0`).
    KernelForwardingOff = "kernel_forward_disabled",
    /// Handed to the kernel: the egress interface's index is beyond `XMIT_SLOTS`.
    KernelEgressUnknown = "kernel_forward_egress_unknown",
    /// A new flow to a service none of whose backends takes new flows (XDP_DROP).
    DropNoBackend = "drop_no_backend",
    /// A packet to a gateway address whose headers are truncated or invalid (XDP_DROP).
    DropMalformed = "drop_malformed",
    /// A non-first fragment to a gateway address whose first fragment was not seen (XDP_DROP).
    DropFragment = "drop_fragment",
    /// A flow was assigned a backend by Maglev and recorded.
    NewFlow = "new_flow",
    /// A tracked flow whose backend was removed was balanced again.
    BackendGone = "backend_gone",
    /// An ICMP error about a NATed flow was translated by XDP.
    IcmpTranslated = "icmp_translated",
    /// A non-first fragment followed its first fragment's flow.
    FragmentTranslated = "fragment_translated",
    /// A reply the kernel forwarded was translated on egress by the TC program.
    TcReply = "tc_reply_translated",
    /// An ICMP error about a NATed flow (also one the gateway itself sent, such as
    /// fragmentation-needed) was translated on egress by the TC program.
    TcIcmp = "tc_icmp_translated",
    /// A reply (or ICMP error) of a tracked flow the TC program could not rewrite (an
    /// skb helper failed): it left untranslated, and its receiver will drop it.
    TcUntranslated = "tc_untranslated",
    /// A redirect the kernel refused after the program returned (tracepoint
    /// `xdp:xdp_redirect_err`): the frame was lost.
    RedirectError = "redirect_error",
    /// A conntrack entry of a removed service (whose ids another service may hold now)
    /// was not used: a forward packet is balanced afresh by the service it addresses
    /// now (or passes untouched if there is none), a reply (or ICMP error) passes
    /// untranslated. Each program that sees such a packet counts it.
    CtStaleService = "ct_stale_service",
    /// A SNAT-mode flow was given a node source port and recorded.
    SnatNewFlow = "snat_new_flow",
    /// A SNAT source port a new flow tried was taken; it tried the next.
    SnatPortRetry = "snat_port_retry",
    /// A new SNAT flow found no free source port in `SNAT_PORT_TRIES` tries (XDP_DROP):
    /// the port range is too small for the flows toward that backend.
    DropSnatPortsExhausted = "drop_snat_ports_exhausted",
    /// A new SNAT flow to a backend with no known node address toward it (no route, or
    /// the daemon has not resolved it yet) (XDP_DROP).
    DropSnatNoSource = "drop_snat_no_source",
    /// A SNAT-mode forward packet the kernel forwarded got its node source address
    /// and port on egress by the TC program.
    TcMasq = "tc_masq_translated",
    /// A new flow above the new-flow limit of its CPU (`config::NEW_FLOW_LIMIT`) was
    /// balanced by Maglev and forwarded without a conntrack entry: its packets keep going
    /// to the same backend while the backends do not change. So was a reply matched by
    /// Maglev (`ct_miss_reply`): a SYN flood's SYN-ACKs evict no established flow.
    FloodUntracked = "flood_untracked",
    /// A packet from a backend endpoint of a service (one the reply index lists) matched
    /// no flow, and Maglev maps its tuple to another backend (the backend set changed
    /// since its flow began, or it is not a reply through the gateway): it passed
    /// untranslated.
    ReplyUntracked = "reply_untracked",
    /// A conntrack entry was created (forward, reply or kernel-path entry). Created minus
    /// live entries is what the LRU evicted (the kernel does not count evictions).
    CtCreated = "ct_created",
    /// An IPv6 packet passed untouched because an IPv6 program (`berth_v6`,
    /// `berth_icmp6`, `berth_tc_v6`) could not be entered (its tail-call slot was empty:
    /// a loader that did not fill it).
    Ipv6NoProgram = "ipv6_no_program",
    /// An ICMPv6 redirect the host sent out of an `--interface` was dropped by the TC
    /// program: it would tell a backend to reach its client directly, around the
    /// gateway's NAT (a one-armed gateway). IPv4's redirects are turned off
    /// (`send_redirects`); IPv6 has no such switch.
    TcRedirectDropped = "tc_icmp6_redirect_dropped",
    /// A SNAT flow's node port was claimed by another flow after the full conntrack
    /// evicted the flow's reply entry (the port's lock): the flow was balanced again and
    /// leaves from another port, which breaks a TCP connection. The conntrack is too
    /// small for the flows (`--conntrack-size`).
    SnatPortLost = "snat_port_lost",
    /// An ICMP error addressed to a gateway address that XDP left untranslated: its
    /// quote cannot be read (IP options, IPv6 extension headers other than a first
    /// fragment's fragment header, a later fragment, cut short) or is of no tracked
    /// flow. It goes to the kernel, and the quoted packet's sender never learns of it.
    IcmpUntranslated = "icmp_untranslated",
    /// A TCP segment without SYN to a service found no conntrack entry (its flow began
    /// on another gateway behind the same ECMP route, or its entry was evicted, or its
    /// backend removed): balanced by Maglev like a new flow (counted as `new_flow` too)
    /// and recorded, so any node carries any packet of a flow while the backends do not
    /// change (Katran's `TCP_NONSYN_LRUMISS`). A UDP datagram without an entry cannot be
    /// told from a new flow's first: it is a `new_flow` only.
    CtMissMidflow = "ct_miss_midflow",
    /// A reply from a backend with no conntrack entry whose tuple Maglev maps to that
    /// backend (its flow began on another gateway, or its entry was evicted): translated
    /// and its flow recorded (not a `new_flow`; over the new-flow limit not recorded,
    /// and counted as `flood_untracked` too).
    CtMissReply = "ct_miss_reply",
    /// A reply (or an ICMP error about a packet sent to a backend) of a tracked flow, or
    /// one Maglev matched, that did not arrive from where the gateway sends its backend's
    /// packets: another interface than the backend's egress, or (XDP, neighbour known)
    /// another source MAC than the backend's next hop. A tenant's backend forging
    /// another tenant's backend address (XDP_DROP; TC: shot).
    ReplySpoofed = "reply_spoofed",
    /// A TCP segment to a service that would open a flow with flags no TCP sends: none,
    /// SYN+FIN, SYN+RST, or FIN+PSH+URG (Xmas) (XDP_DROP).
    DropTcpFlags = "drop_tcp_flags",
    /// A packet to a service that would open a flow whose source is a gateway address
    /// (one Berth serves): forged, or looping (XDP_DROP).
    DropGatewaySource = "drop_gateway_source",
    /// An event `berth monitor` asked for that was not sent: over its CPU's rate
    /// (`config::MONITOR_RATE`) or the ring buffer was full.
    MonitorLost = "monitor_lost",
    /// NATed by XDP for an egress that takes no XDP frames and sent out of it by the TC
    /// program on the receiving interface's ingress, from the shim XDP inserted after
    /// the Ethernet header (`bpf_redirect`; into a veth peer's namespace
    /// `bpf_redirect_peer`): the kernel's forwarding path and netfilter skipped.
    /// Counted when the program asks for the redirect: the kernel carries it out after
    /// the program returns, and one that fails then (a device gone or down) is the
    /// kernel's drop, not counted here.
    TcRedirect = "tc_redirect",
    /// Of `tc_redirect`: sent into a bridge's port (the port holding the next hop's MAC
    /// in the bridge's forwarding database, `berth_fdb`) rather than into the bridge:
    /// the bridge's own forwarding skipped too.
    TcBridgePort = "tc_bridge_port",
    /// A frame arrived with a hand-off shim (an IP version 0 and the hand-off's magic
    /// after its Ethernet header): forged on the wire, never redirected (XDP_DROP; TC,
    /// which takes only shims carrying the datapath's secret: shot).
    HandoffForged = "tc_handoff_forged",
    /// A packet XDP handed to TC could not be taken: its shim could not be removed or
    /// what follows it is no IP header (TC: shot).
    HandoffFailed = "tc_handoff_failed",
}

impl Counter {
    /// Whether a packet counted so is an event for `berth monitor`: what the XDP and TC
    /// programs count but the ordinary course of a flow (sent by XDP, recorded,
    /// translated by TC) and the monitor's own loss.
    pub const fn is_event(self) -> bool {
        !matches!(
            self,
            Counter::Redirect
                | Counter::Tx
                | Counter::NewFlow
                | Counter::FragmentTranslated
                | Counter::TcReply
                | Counter::TcMasq
                | Counter::TcIcmp
                | Counter::SnatNewFlow
                | Counter::CtCreated
                | Counter::RedirectError
                | Counter::MonitorLost
                | Counter::TcRedirect
                | Counter::TcBridgePort
        )
    }

    /// The counter with index `i`, if any.
    pub fn from_index(i: u32) -> Option<Counter> {
        Counter::ALL.get(i as usize).copied()
    }
}
