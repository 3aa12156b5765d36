//! The first stage: the Gateways of our classes, each with its listeners resolved
//! against its GatewayConfig (port ranges, quotas, cool-down), numbered by age, and
//! with the ports each listener yields to an older Gateway on a shared address.

use std::{
    collections::BTreeSet,
    sync::Arc,
    time::{Duration, SystemTime},
};

use crate::model::*;

use super::{
    addresses::{Addresses, DefaultAddresses},
    overlaps, FastMap, Input, DEFAULT_RELEASE_COOLDOWN,
};

/// A listener as the planner sees it.
pub(super) struct ListenerView<'a> {
    pub spec: &'a Listener,
    pub protocol: Option<Protocol>,
    /// `port..=end` when a GatewayConfig makes it a range.
    pub range: Option<(u16, u16)>,
    pub quota: Option<u32>,
    /// Ports an older Gateway's listener serves on an address this one serves too:
    /// no route gets them here.
    pub yielded: Vec<overlaps::Yielded>,
}

/// A Gateway of ours.
pub(super) struct GatewayView<'a> {
    pub spec: &'a Gateway,
    pub listeners: Vec<ListenerView<'a>>,
    pub params_error: Option<String>,
    pub cooldown: Duration,
    /// Whether its services are source-NATed (its GatewayConfig's `sourceNAT`).
    pub source_nat: bool,
    /// The addresses it is served on (and those it is not).
    pub addresses: Addresses,
    /// Its rank among the plan's Gateways, oldest (0) first.
    pub age: usize,
}

impl GatewayView<'_> {
    pub fn key(&self) -> (String, String) {
        (
            self.spec.metadata.ns().to_string(),
            self.spec.metadata.name.to_string(),
        )
    }
}

/// The plan's Gateways, sorted by namespace/name, and their index by the same.
pub(super) struct Gateways<'a> {
    pub views: Vec<GatewayView<'a>>,
    pub at: FastMap<(&'a str, &'a str), usize>,
}

impl Gateways<'_> {
    /// The index of Gateway `namespace/name`, if it is ours.
    pub fn index(&self, namespace: &str, name: &str) -> Option<usize> {
        self.at.get(&(namespace, name)).copied()
    }
}

/// The Gateways of our classes in `input`.
pub(super) fn ours<'a>(input: &Input<'a>) -> Gateways<'a> {
    let snap = input.snapshot;
    let classes: BTreeSet<&str> = snap
        .gateway_classes
        .iter()
        .filter(|c| c.spec.controller_name == CONTROLLER_NAME)
        .map(|c| c.metadata.name.as_str())
        .collect();
    // Ours, with their position in the snapshot (their age without a creation time).
    let mut gateways: Vec<(GatewayView, usize)> = snap
        .gateways
        .iter()
        .enumerate()
        .filter(|(_, g)| classes.contains(g.spec.gateway_class_name.as_str()))
        .map(|(i, g)| {
            (
                gateway_view(g, &snap.gateway_configs, input.default_addresses),
                i,
            )
        })
        .collect();
    gateways.sort_by_key(|(g, _)| g.key());
    let (mut gateways, source): (Vec<GatewayView>, Vec<usize>) = gateways.into_iter().unzip();
    let created: Vec<Option<SystemTime>> = gateways
        .iter()
        .map(|g| g.spec.metadata.creation_timestamp.map(Time::system))
        .collect();
    overlaps::mark(&mut gateways, &created, &source);
    let at = gateways
        .iter()
        .enumerate()
        .map(|(gi, g)| ((g.spec.metadata.ns(), g.spec.metadata.name.as_str()), gi))
        .collect();
    Gateways {
        views: gateways,
        at,
    }
}

/// Resolves a Gateway's listeners against its GatewayConfig.
fn gateway_view<'a>(
    gw: &'a Gateway,
    configs: &'a [Arc<GatewayConfig>],
    default_addresses: DefaultAddresses,
) -> GatewayView<'a> {
    let mut listeners: Vec<ListenerView<'a>> = gw
        .spec
        .listeners
        .iter()
        .map(|l| ListenerView {
            spec: l,
            protocol: Protocol::parse(&l.protocol),
            range: None,
            quota: None,
            yielded: Vec::new(),
        })
        .collect();
    let mut view = GatewayView {
        spec: gw,
        listeners: Vec::new(),
        params_error: None,
        cooldown: DEFAULT_RELEASE_COOLDOWN,
        source_nat: false,
        addresses: Addresses::of(&gw.spec.addresses, default_addresses),
        age: 0,
    };
    let Some(pref) = gw
        .spec
        .infrastructure
        .as_ref()
        .and_then(|i| i.parameters_ref.as_ref())
    else {
        view.listeners = listeners;
        return view;
    };
    let ns = gw.metadata.ns();
    let mut errors = Vec::new();
    if pref.group != BERTH_GROUP || pref.kind != "GatewayConfig" {
        errors.push(format!(
            "spec.infrastructure.parametersRef: {}/{} is not a {BERTH_GROUP}/GatewayConfig",
            pref.group, pref.kind
        ));
    } else if let Some(config) = configs
        .iter()
        .find(|c| c.metadata.ns() == ns && c.metadata.name == pref.name)
    {
        let cname = format!("GatewayConfig {ns}/{}", pref.name);
        if let Some(c) = &config.spec.release_cooldown {
            match humantime::parse_duration(c) {
                Ok(d) => view.cooldown = d,
                Err(e) => errors.push(format!("{cname}: spec.releaseCooldown {c:?}: {e}")),
            }
        }
        match config.spec.source_nat() {
            Ok(on) => view.source_nat = on,
            Err(e) => errors.push(format!("{cname}: {e}")),
        }
        set_ranges(config, &mut listeners, &cname, &mut errors);
        // Ranges of one protocol must not overlap each other or a fixed listener's port.
        overlapping_ranges(&listeners, &cname, &mut errors);
    } else {
        errors.push(format!(
            "spec.infrastructure.parametersRef: GatewayConfig {ns}/{} not found",
            pref.name
        ));
    }
    if !errors.is_empty() {
        view.params_error = Some(errors.join("; "));
        for l in &mut listeners {
            l.range = None;
        }
    }
    view.listeners = listeners;
    view
}

/// Makes the listeners `config` (named `cname`) lists ranges; what it gets wrong goes to
/// `errors`.
fn set_ranges(
    config: &GatewayConfig,
    listeners: &mut [ListenerView],
    cname: &str,
    errors: &mut Vec<String>,
) {
    let mut seen = BTreeSet::new();
    for (i, r) in config.spec.listeners.iter().enumerate() {
        let field = format!("{cname}: spec.listeners[{i}]");
        if !seen.insert(r.name.clone()) {
            errors.push(format!("{field}.name: listener {} is listed twice", r.name));
            continue;
        }
        let Some(l) = listeners.iter_mut().find(|l| l.spec.name == r.name) else {
            errors.push(format!(
                "{field}.name: the Gateway has no listener {}",
                r.name
            ));
            continue;
        };
        if l.protocol.is_none() {
            errors.push(format!(
                "{field}: listener {} has protocol {}; only TCP and UDP take port ranges",
                r.name, l.spec.protocol
            ));
            continue;
        }
        if r.end_port < l.spec.port {
            errors.push(format!(
                "{field}.endPort: {} is below the listener's port {}",
                r.end_port, l.spec.port
            ));
            continue;
        }
        l.range = Some((l.spec.port, r.end_port));
        l.quota = r.max_ports_per_namespace;
    }
}

/// Adds to `errors` each two listeners of one protocol, one of them a range, whose
/// ports overlap (`cname` names the GatewayConfig).
fn overlapping_ranges(listeners: &[ListenerView], cname: &str, errors: &mut Vec<String>) {
    for (i, a) in listeners.iter().enumerate() {
        for b in listeners.iter().skip(i + 1) {
            if a.protocol.is_none() || a.protocol != b.protocol {
                continue;
            }
            let span = |l: &ListenerView| l.range.unwrap_or((l.spec.port, l.spec.port));
            let ((a0, a1), (b0, b1)) = (span(a), span(b));
            if (a.range.is_some() || b.range.is_some()) && a0 <= b1 && b0 <= a1 {
                errors.push(format!(
                    "{cname}: listeners {} ({a0}-{a1}) and {} ({b0}-{b1}) overlap",
                    a.spec.name, b.spec.name
                ));
            }
        }
    }
}
