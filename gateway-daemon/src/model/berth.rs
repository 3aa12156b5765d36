//! Berth's own kinds: the GatewayConfig and PortClaim CRDs.

use serde::{Deserialize, Serialize};

use super::{Meta, Str, GATEWAY_GROUP};

/// The kind of one of Berth's policies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum PolicyKind {
    /// BackendHealthPolicy.
    BackendHealthPolicy,
    /// RouteTrafficPolicy.
    RouteTrafficPolicy,
}

impl PolicyKind {
    /// The Kubernetes kind name.
    pub const fn name(self) -> &'static str {
        match self {
            PolicyKind::BackendHealthPolicy => "BackendHealthPolicy",
            PolicyKind::RouteTrafficPolicy => "RouteTrafficPolicy",
        }
    }
}

impl std::fmt::Display for PolicyKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.name())
    }
}

/// `berth.dev/v1alpha1` GatewayConfig.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GatewayConfig {
    /// Metadata.
    pub metadata: Meta,
    /// Spec.
    pub spec: GatewayConfigSpec,
}

// The derive also generates `GatewayConfigResource`, the kube type behind our CRD.
/// GatewayConfig spec: turns a Gateway's TCP/UDP listeners into port ranges.
#[derive(
    Clone,
    Debug,
    Default,
    PartialEq,
    Eq,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
    kube::CustomResource,
)]
#[kube(
    group = "berth.dev",
    version = "v1alpha1",
    kind = "GatewayConfig",
    root = "GatewayConfigResource",
    namespaced
)]
#[serde(rename_all = "camelCase")]
pub struct GatewayConfigSpec {
    /// Listeners turned into port ranges.
    #[serde(default)]
    pub listeners: Vec<ListenerRange>,
    /// How long a released port stays unassigned (`300s` when absent).
    #[serde(default)]
    pub release_cooldown: Option<String>,
    /// SNAT mode: backends see the node's address and a port of its own per flow, so
    /// their replies need not route through the gateway (`false` when absent: router
    /// mode, backends see the client's address).
    // Kept as read, so that a value other than a boolean becomes the Gateway's
    // InvalidParameters like a bad releaseCooldown: see `GatewayConfigSpec::source_nat`.
    #[serde(default, rename = "sourceNAT", skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<bool>")]
    pub source_nat: Option<serde_json::Value>,
}

impl GatewayConfigSpec {
    /// `spec.sourceNAT` as a boolean (`false` when absent), or what is wrong with it.
    pub fn source_nat(&self) -> Result<bool, String> {
        match &self.source_nat {
            None | Some(serde_json::Value::Null) => Ok(false),
            Some(serde_json::Value::Bool(b)) => Ok(*b),
            Some(v) => Err(format!("spec.sourceNAT {v}: not a boolean (true or false)")),
        }
    }
}

/// One listener's range.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ListenerRange {
    /// The Gateway listener's name.
    pub name: String,
    /// Last port of the range (the listener's port is the first).
    pub end_port: u16,
    /// Most ports one namespace may hold in this range.
    #[serde(default)]
    pub max_ports_per_namespace: Option<u32>,
}

/// `berth.dev/v1alpha1` PortClaim: the durable record of one allocation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PortClaim {
    /// Metadata: in the Gateway's namespace, named `<gateway>-<tcp|udp>-<port>`.
    pub metadata: Meta,
    /// Spec.
    pub spec: PortClaimSpec,
    /// Status.
    #[serde(default)]
    pub status: Option<PortClaimStatus>,
}

// The derive also generates `PortClaimResource`, the kube type behind our CRD.
/// PortClaim spec: which route holds which port of which Gateway listener.
#[derive(
    Clone,
    Debug,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
    kube::CustomResource,
)]
#[kube(
    group = "berth.dev",
    version = "v1alpha1",
    kind = "PortClaim",
    root = "PortClaimResource",
    namespaced
)]
#[kube(status = "PortClaimStatus")]
#[kube(printcolumn = r#"{"name":"Gateway","type":"string","jsonPath":".spec.gateway"}"#)]
#[kube(printcolumn = r#"{"name":"Protocol","type":"string","jsonPath":".spec.protocol"}"#)]
#[kube(printcolumn = r#"{"name":"Port","type":"integer","jsonPath":".spec.port"}"#)]
#[kube(printcolumn = r#"{"name":"Route","type":"string","jsonPath":".spec.route.name"}"#)]
#[kube(printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#)]
#[serde(rename_all = "camelCase")]
pub struct PortClaimSpec {
    /// Gateway name (same namespace as the claim).
    #[schemars(with = "String")]
    pub gateway: Str,
    /// Listener name.
    #[schemars(with = "String")]
    pub listener: Str,
    /// `TCP` or `UDP`.
    #[schemars(with = "String")]
    pub protocol: Str,
    /// The port.
    pub port: u16,
    /// The route holding the port.
    pub route: ClaimRoute,
}

/// The route a claim belongs to.
#[derive(
    Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "camelCase")]
pub struct ClaimRoute {
    /// Group.
    #[schemars(with = "String")]
    pub group: Str,
    /// Kind (`TCPRoute` or `UDPRoute`).
    #[schemars(with = "String")]
    pub kind: Str,
    /// Namespace.
    #[schemars(with = "String")]
    pub namespace: Str,
    /// Name.
    #[schemars(with = "String")]
    pub name: Str,
    /// UID, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<String>")]
    pub uid: Option<Str>,
}

impl PortClaimSpec {
    /// The spec of a claim on `port` of a Gateway's listener for `route`.
    pub fn new(
        gateway: &str,
        listener: &str,
        protocol: &str,
        port: u16,
        route: ClaimRoute,
    ) -> Self {
        PortClaimSpec {
            gateway: gateway.into(),
            listener: listener.into(),
            protocol: protocol.into(),
            port,
            route,
        }
    }
}

impl ClaimRoute {
    /// The key of the route named; `None` for a kind other than TCPRoute and UDPRoute.
    pub fn key(&self) -> Option<super::RouteKey> {
        Some(super::RouteKey {
            kind: super::RouteKind::of_name(&self.kind)?,
            namespace: self.namespace.clone(),
            name: self.name.clone(),
        })
    }

    /// A Gateway API route (`TCPRoute` or `UDPRoute`) by kind, namespace and name.
    pub fn new(kind: super::RouteKind, namespace: &str, name: &str, uid: Option<Str>) -> Self {
        ClaimRoute {
            group: Str::const_new(GATEWAY_GROUP),
            kind: kind.name().into(),
            namespace: namespace.into(),
            name: name.into(),
            uid,
        }
    }
}

/// PortClaim status.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PortClaimStatus {
    /// `Bound` or `Released`.
    pub phase: ClaimPhase,
    // A text that is no time reads as none: the claim is kept and its port stays held
    // (`bind::cooled_down`), never freed early.
    /// When the claim was released (RFC 3339), for the cool-down.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "super::time::lenient"
    )]
    #[schemars(with = "Option<String>")]
    pub released_at: Option<super::Time>,
}

/// Phase of a claim.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
pub enum ClaimPhase {
    /// Held by its route.
    #[default]
    Bound,
    /// Its route let go; the port is free after the cool-down.
    Released,
}

impl PortClaim {
    /// A bound claim for `port` of a Gateway listener, named by `claim_name`.
    pub fn bound(gateway_ns: &str, spec: PortClaimSpec) -> Self {
        PortClaim {
            metadata: Meta {
                name: claim_name(&spec.gateway, &spec.protocol, spec.port).into(),
                namespace: Some(gateway_ns.into()),
                ..Meta::default()
            },
            spec,
            status: Some(PortClaimStatus {
                phase: ClaimPhase::Bound,
                released_at: None,
            }),
        }
    }

    /// Whether the claim is bound (a claim without a status is).
    pub fn is_bound(&self) -> bool {
        self.status
            .as_ref()
            .is_none_or(|s| s.phase == ClaimPhase::Bound)
    }

    /// Whether the claim is released (cooling down).
    pub fn is_released(&self) -> bool {
        self.status
            .as_ref()
            .is_some_and(|s| s.phase == ClaimPhase::Released)
    }
}

/// The longest object name Kubernetes takes (a DNS-1123 subdomain).
pub const MAX_NAME_LEN: usize = 253;

/// The name of the claim for a port: creating it is the lock. `<gateway>-<tcp|udp>-<port>`,
/// unless that is longer than [`MAX_NAME_LEN`] (a Gateway name may have 253 characters
/// itself): then the Gateway's name is cut and a hash of all of it added,
/// `<start of gateway>-<hash>-<tcp|udp>-<port>`, still one name per port and Gateway.
pub fn claim_name(gateway: &str, protocol: &str, port: u16) -> String {
    let suffix = format!("-{}-{port}", protocol.to_ascii_lowercase());
    if gateway.len() + suffix.len() <= MAX_NAME_LEN {
        return format!("{gateway}{suffix}");
    }
    let hash = format!("-{:016x}", fnv1a(gateway.as_bytes()));
    let mut keep = MAX_NAME_LEN - suffix.len() - hash.len();
    // Names are ASCII once checked; cut on a character boundary all the same.
    while !gateway.is_char_boundary(keep) {
        keep -= 1;
    }
    // The cut part must end as a name part does: with a letter or digit.
    let start = gateway[..keep].trim_end_matches(['-', '.']);
    format!("{start}{hash}{suffix}")
}

/// FNV-1a, 64 bits: a hash that stays the same from one build and platform to the next,
/// as names derived from it must.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claim_names_of_gateways_with_long_names_stay_valid_and_distinct() {
        assert_eq!(claim_name("shared", "TCP", 30000), "shared-tcp-30000");
        let valid = |n: &str| {
            n.len() <= MAX_NAME_LEN
                && n.split('.').all(|p| {
                    let b = p.as_bytes();
                    let alnum = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
                    b.first().is_some_and(alnum)
                        && b.last().is_some_and(alnum)
                        && b.iter().all(|c| alnum(c) || *c == b'-')
                })
        };
        // 243 characters fit as they are; longer ones (up to 253) are cut and hashed.
        let fits = "g".repeat(243);
        assert_eq!(claim_name(&fits, "UDP", 65535), format!("{fits}-udp-65535"));
        let mut seen = std::collections::BTreeSet::new();
        for gateway in [
            "a".repeat(244),
            "a".repeat(253),
            format!("{}b", "a".repeat(252)),
            format!("{}.{}", "a".repeat(230), "b".repeat(22)),
            // Cut right after a dot: the dot goes too.
            format!("{}.{}", "a".repeat(225), "c".repeat(27)),
        ] {
            let name = claim_name(&gateway, "TCP", 30000);
            assert!(valid(&name), "{name:?} ({} characters)", name.len());
            assert!(name.ends_with("-tcp-30000"), "{name}");
            assert!(seen.insert(name.clone()), "{name} twice");
            assert_eq!(name, claim_name(&gateway, "TCP", 30000), "stable");
        }
    }
}
