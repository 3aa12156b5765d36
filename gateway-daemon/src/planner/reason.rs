//! The reasons the planner gives in the conditions it writes: upstream Gateway API
//! reasons where one fits, Berth's own otherwise. Serialised to the exact strings the
//! Gateway API (and Berth's documentation) use; conditions read back from a cluster keep
//! their text, whatever wrote it.

/// A condition reason the planner writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Reason {
    /// Gateway, listener or route accepted.
    Accepted,
    /// Gateway or listener programmed into the datapath.
    Programmed,
    /// Not programmed: the Gateway or listener is invalid.
    Invalid,
    /// Not programmed: no address the gateway can serve.
    AddressNotAssigned,
    /// Not programmed: an address of the Gateway cannot be used.
    AddressNotUsable,
    /// The GatewayConfig the Gateway references is invalid.
    InvalidParameters,
    /// Some listener of the Gateway is not valid.
    ListenersNotValid,
    /// A listener's protocol is not TCP or UDP.
    UnsupportedProtocol,
    /// A listener's `allowedRoutes.kinds` names a kind it cannot serve.
    InvalidRouteKinds,
    /// A port (or range) is held by an older Gateway or another route.
    PortUnavailable,
    /// A listener overlaps an older Gateway's listener of the same protocol.
    ProtocolConflict,
    /// A listener conflicts with nothing.
    NoConflicts,
    /// Not decided yet (a route waiting for a port).
    Pending,
    /// All references resolved.
    ResolvedRefs,
    /// No listener of the parent admits the route's kind or namespace.
    NotAllowedByListeners,
    /// The parentRef matches no listener (or no port of one).
    NoMatchingParent,
    /// A cross-namespace backend without a ReferenceGrant.
    RefNotPermitted,
    /// A backendRef of a kind other than Service.
    InvalidKind,
    /// A backend Service (or its port) does not exist.
    BackendNotFound,
    /// Berth's own: the route's endpoints are of no IP family its Gateway serves (no
    /// NAT64).
    IPFamilyMismatch,
    /// The namespace holds its quota of ports in the range.
    QuotaExceeded,
    /// Every port of the range is held or cooling down.
    PortRangeExhausted,
    /// A listener's range overlaps the host's ephemeral ports.
    OverlapsEphemeralPorts,
    /// Berth's own: a route's services are not programmed, as the datapath's maps are
    /// full of older routes' (`berth run --max-services`, `--max-backends`).
    DatapathFull,
    /// Berth's own: most of a range listener's ports are bound or cooling down.
    RangeNearlyFull,
}

impl Reason {
    /// The reason as written in a condition.
    pub const fn as_str(self) -> &'static str {
        match self {
            Reason::Accepted => "Accepted",
            Reason::Programmed => "Programmed",
            Reason::Invalid => "Invalid",
            Reason::AddressNotAssigned => "AddressNotAssigned",
            Reason::AddressNotUsable => "AddressNotUsable",
            Reason::InvalidParameters => "InvalidParameters",
            Reason::ListenersNotValid => "ListenersNotValid",
            Reason::UnsupportedProtocol => "UnsupportedProtocol",
            Reason::InvalidRouteKinds => "InvalidRouteKinds",
            Reason::PortUnavailable => "PortUnavailable",
            Reason::ProtocolConflict => "ProtocolConflict",
            Reason::NoConflicts => "NoConflicts",
            Reason::Pending => "Pending",
            Reason::ResolvedRefs => "ResolvedRefs",
            Reason::NotAllowedByListeners => "NotAllowedByListeners",
            Reason::NoMatchingParent => "NoMatchingParent",
            Reason::RefNotPermitted => "RefNotPermitted",
            Reason::InvalidKind => "InvalidKind",
            Reason::BackendNotFound => "BackendNotFound",
            Reason::IPFamilyMismatch => "IPFamilyMismatch",
            Reason::QuotaExceeded => "QuotaExceeded",
            Reason::PortRangeExhausted => "PortRangeExhausted",
            Reason::OverlapsEphemeralPorts => "OverlapsEphemeralPorts",
            Reason::DatapathFull => "DatapathFull",
            Reason::RangeNearlyFull => "RangeNearlyFull",
        }
    }
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
