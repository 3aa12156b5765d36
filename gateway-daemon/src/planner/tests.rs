//! Conditions of listeners, Gateways and routes where Gateways share an address, and
//! route attachment refusals.

use std::{collections::BTreeSet, net::Ipv4Addr, ops::RangeInclusive, path::Path};

use super::*;
use crate::{datapath::Capacity, manifests, model::Protocol};

pub(super) const CLASS: &str = "apiVersion: gateway.networking.k8s.io/v1\nkind: GatewayClass\n\
    metadata: {name: berth}\nspec: {controllerName: berth.dev/gateway-controller}\n";

/// A Gateway `name` in `infra` on 10.0.0.1, created at `created` (seconds), with
/// `listeners` (YAML flow items) and, for `range = Some((listener, end))`, a
/// GatewayConfig making that listener a range.
pub(super) fn gateway(
    name: &str,
    created: u64,
    listeners: &[&str],
    range: Option<(&str, u16)>,
) -> String {
    let params = match range {
        Some(_) => format!(
            "  infrastructure:\n    parametersRef: {{group: berth.dev, kind: GatewayConfig, name: {name}}}\n"
        ),
        None => String::new(),
    };
    let mut s = format!(
        "---\napiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\n\
         metadata: {{name: {name}, namespace: infra, creationTimestamp: \"2026-01-01T00:00:{created:02}Z\"}}\n\
         spec:\n  gatewayClassName: berth\n  addresses: [{{value: 10.0.0.1}}]\n{params}  listeners:\n"
    );
    for l in listeners {
        s.push_str(&format!("  - {l}\n"));
    }
    if let Some((listener, end)) = range {
        s.push_str(&format!(
            "---\napiVersion: berth.dev/v1alpha1\nkind: GatewayConfig\n\
             metadata: {{name: {name}, namespace: infra}}\n\
             spec: {{listeners: [{{name: {listener}, endPort: {end}}}]}}\n"
        ));
    }
    s
}

/// A Gateway `name` with one TCP range listener `listener` (`first..=last`) that
/// takes routes from every namespace.
pub(super) fn range_gateway(
    name: &str,
    created: u64,
    listener: &str,
    first: u16,
    last: u16,
) -> String {
    let spec = format!("{{name: {listener}, protocol: TCP, port: {first}, {ALL}}}");
    gateway(name, created, &[&spec], Some((listener, last)))
}

/// A route `kind/team/name` with one parentRef (YAML flow mapping body).
pub(super) fn route(kind: &str, name: &str, created: u64, parent: &str) -> String {
    format!(
        "---\napiVersion: gateway.networking.k8s.io/v1\nkind: {kind}\n\
         metadata: {{name: {name}, namespace: team, creationTimestamp: \"2026-01-01T00:01:{created:02}Z\"}}\n\
         spec:\n  parentRefs: [{{{parent}}}]\n"
    )
}

pub(super) fn plan_of<'c>(
    text: &str,
    claims: impl IntoIterator<Item = &'c Arc<PortClaim>>,
) -> Plan {
    plan_snat(text, claims, DEFAULT_SNAT_PORTS)
}

/// The plan with `snat_ports` as the configured SNAT source ports.
fn plan_snat<'c>(
    text: &str,
    claims: impl IntoIterator<Item = &'c Arc<PortClaim>>,
    snat_ports: RangeInclusive<u16>,
) -> Plan {
    plan_for(text, claims, snat_ports, Capacity::default())
}

/// The plan for a datapath of room `capacity`.
fn plan_room(text: &str, capacity: Capacity) -> Plan {
    plan_for(text, &[], DEFAULT_SNAT_PORTS, capacity)
}

fn plan_for<'c>(
    text: &str,
    claims: impl IntoIterator<Item = &'c Arc<PortClaim>>,
    snat_ports: RangeInclusive<u16>,
    capacity: Capacity,
) -> Plan {
    let claims: ClaimList = claims.into_iter().cloned().collect();
    let parsed = manifests::parse_file(Path::new("test.yaml"), text);
    assert!(parsed.errors.is_empty(), "{:?}", parsed.errors);
    let snapshot = manifests::snapshot([&parsed]);
    plan(&Input {
        snapshot: &snapshot,
        claims: &claims,
        now: humantime::parse_rfc3339("2026-01-01T01:00:00Z").expect("time"),
        default_addresses: DefaultAddresses::default(),
        ephemeral_ports: None,
        snat_ports,
        allocate: true,
        capacity,
    })
}

#[test]
fn a_fixed_listeners_service_shared_by_its_routes_takes_room_once_for_the_oldest() {
    // Two routes on a fixed listener share its one service (only the oldest is served
    // there); a route of the range is between them in age.
    let fixed = format!("{{name: fixed, protocol: TCP, port: 80, {ALL}}}");
    let pool = format!("{{name: pool, protocol: TCP, port: 30000, {ALL}}}");
    let on = |l: &str| format!("name: gw, namespace: infra, sectionName: {l}");
    let text = [
        CLASS.to_string(),
        gateway("gw", 1, &[&fixed, &pool], Some(("pool", 30009))),
        route("TCPRoute", "old", 1, &on("fixed")),
        route("TCPRoute", "ranged", 2, &on("pool")),
        route("TCPRoute", "new", 3, &on("fixed")),
    ]
    .concat();
    let room = |services| Capacity {
        services,
        ..Capacity::default()
    };
    let programmed = |p: &Plan, name: &str| -> Vec<String> {
        let r = p.routes.iter().find(|r| r.name == name).expect("route");
        r.status.parents[0]
            .conditions
            .iter()
            .filter(|c| c.kind == capacity::PROGRAMMED)
            .map(|c| format!("{} {}", c.status, c.reason))
            .collect()
    };
    // Two services: the fixed listener's and the range's one; nothing waits.
    let two = plan_room(&text, room(2));
    assert!(two.waiting.is_empty(), "{:?}", two.waiting);
    assert_eq!(two.datapath.services.len(), 2);
    assert_eq!(two.used.services, 2);
    // One: the oldest route's; the range's route waits, the shadowed one does not.
    let one = plan_room(&text, room(1));
    let waiting: Vec<&str> = one.waiting.iter().map(|w| w.route.name.as_str()).collect();
    assert_eq!(waiting, ["ranged"]);
    assert_eq!(one.waiting[0].limit, crate::datapath::Limit::Services);
    let served: Vec<u16> = one.datapath.services.keys().map(|s| s.port).collect();
    assert_eq!(served, [80]);
    assert_eq!(programmed(&one, "ranged"), ["False DatapathFull"]);
    assert!(programmed(&one, "old").is_empty() && programmed(&one, "new").is_empty());
    assert_eq!(one.claims, two.claims, "room changes no claim");
}

#[test]
fn gateway_addresses_beyond_the_datapaths_wait_with_their_routes_and_the_rest_are_served() {
    // One Gateway more than the datapath has addresses of a family for, each with its
    // own address and route: the youngest route waits, every other one is served.
    let n = crate::datapath::Limits::ADDRESSES as usize + 1;
    let fixed = format!("{{name: tcp, protocol: TCP, port: 80, {ALL}}}");
    let mut text = CLASS.to_string();
    for i in 0..n {
        let address = format!("10.1.{}.{}", i / 200, i % 200 + 1);
        text += &gateway(&format!("g{i:03}"), 1, &[&fixed], None).replace("10.0.0.1", &address);
        text += &route(
            "TCPRoute",
            &format!("r{i:03}"),
            1,
            &format!("name: g{i:03}, namespace: infra"),
        );
    }
    let p = plan_room(&text, Capacity::default());
    let waiting: Vec<(&str, crate::datapath::Limit)> = p
        .waiting
        .iter()
        .map(|w| (w.route.name.as_str(), w.limit))
        .collect();
    let last = format!("r{:03}", n - 1);
    assert_eq!(
        waiting,
        [(last.as_str(), crate::datapath::Limit::Addresses)]
    );
    assert_eq!(p.datapath.services.len(), n - 1);
    assert_eq!(
        capacity::distinct_addresses(&p.datapath.services),
        [n - 1, 0]
    );
    let entry = p.routes.iter().find(|r| r.name == last).expect("route");
    let programmed = find(&entry.status.parents[0].conditions, capacity::PROGRAMMED);
    assert_eq!(programmed.reason, "DatapathFull");
    assert!(
        programmed.message.contains("gateway addresses"),
        "{}",
        programmed.message
    );
}

fn find<'a>(conditions: &'a [Condition], kind: &str) -> &'a Condition {
    conditions
        .iter()
        .find(|c| c.kind == kind)
        .unwrap_or_else(|| panic!("no {kind} in {conditions:?}"))
}

fn gateway_status<'a>(plan: &'a Plan, name: &str) -> &'a GatewayStatus {
    &plan
        .gateways
        .iter()
        .find(|g| g.name == name)
        .expect("gateway")
        .status
}

fn listener<'a>(plan: &'a Plan, gateway: &str, name: &str) -> &'a ListenerStatus {
    gateway_status(plan, gateway)
        .listeners
        .iter()
        .find(|l| l.name == name)
        .expect("listener")
}

fn route_accepted<'a>(plan: &'a Plan, name: &str) -> &'a Condition {
    let r = plan.routes.iter().find(|r| r.name == name).expect("route");
    find(&r.status.parents[0].conditions, "Accepted")
}

fn owner(plan: &Plan, port: u16) -> Option<&str> {
    let service = ServiceAddr {
        addr: Ipv4Addr::new(10, 0, 0, 1).into(),
        protocol: Protocol::Tcp,
        port,
    };
    plan.owners.get(&service).map(|r| r.name.as_str())
}

fn claim(gateway: &str, listener: &str, port: u16, route: &str) -> Arc<PortClaim> {
    Arc::new(PortClaim::bound(
        "infra",
        PortClaimSpec {
            gateway: gateway.into(),
            listener: listener.into(),
            protocol: "TCP".into(),
            port,
            route: ClaimRoute::new(crate::model::RouteKind::Tcp, "team", route, None),
        },
    ))
}

pub(super) const ALL: &str = "allowedRoutes: {namespaces: {from: All}}";

#[test]
fn a_partly_overlapping_newer_listener_is_port_unavailable_and_keeps_its_other_ports() {
    let text = [
        CLASS.to_string(),
        range_gateway("old", 0, "pool", 30005, 30009),
        range_gateway("new", 1, "wide", 30000, 30009),
        route("TCPRoute", "kept", 0, "name: new, namespace: infra"),
        route("TCPRoute", "moved", 1, "name: new, namespace: infra"),
        route(
            "TCPRoute",
            "asks",
            2,
            "name: new, namespace: infra, port: 30007",
        ),
        route(
            "TCPRoute",
            "older-team",
            3,
            "name: old, namespace: infra, port: 30006",
        ),
    ]
    .concat();
    // `kept` held 30002 (outside the overlap), `moved` held 30006 (inside it).
    let claims = [
        claim("new", "wide", 30002, "kept"),
        claim("new", "wide", 30006, "moved"),
    ];
    let plan = plan_of(&text, &claims);

    let wide = listener(&plan, "new", "wide");
    let accepted = find(&wide.conditions, "Accepted");
    assert_eq!(
        (&*accepted.status, &*accepted.reason),
        ("False", "PortUnavailable")
    );
    assert_eq!(
        accepted.message,
        "ports 30005-30009 on 10.0.0.1 belong to listener pool of the older Gateway infra/old; \
         no route of this listener gets them; ports 30000-30004 of this listener keep serving \
         their routes"
    );
    let conflicted = find(&wide.conditions, "Conflicted");
    assert_eq!(
        (&*conflicted.status, &*conflicted.reason),
        ("True", "ProtocolConflict")
    );
    assert_eq!(conflicted.message, accepted.message);
    let programmed = find(&wide.conditions, "Programmed");
    assert_eq!(&*programmed.status, "True", "{programmed:?}");
    assert!(programmed
        .message
        .starts_with("ports 30000-30004 programmed"));
    // Routes with a port are attached: `kept` and `moved` (now on 30000).
    assert_eq!(wide.attached_routes, 2);

    let gw = find(&gateway_status(&plan, "new").conditions, "Accepted");
    assert_eq!((&*gw.status, &*gw.reason), ("True", "ListenersNotValid"));
    assert!(gw.message.contains("wide ("), "{}", gw.message);
    let old = listener(&plan, "old", "pool");
    assert_eq!(&*find(&old.conditions, "Accepted").status, "True");
    assert_eq!(&*find(&old.conditions, "Conflicted").reason, "NoConflicts");

    // Outside the overlap the route keeps its port; inside it the claim moves out.
    assert_eq!(&*route_accepted(&plan, "kept").status, "True");
    assert_eq!(owner(&plan, 30002), Some("kept"));
    assert_eq!(
        route_accepted(&plan, "moved").message,
        "assigned port 30000"
    );
    let asks = route_accepted(&plan, "asks");
    assert_eq!((&*asks.status, &*asks.reason), ("False", "PortUnavailable"));
    assert_eq!(
        asks.message,
        "port 30007 on 10.0.0.1 belongs to listener pool of the older Gateway infra/old"
    );
    assert_eq!(owner(&plan, 30006), Some("older-team"));
    assert_eq!(owner(&plan, 30007), None);
}

#[test]
fn a_fixed_listener_whose_port_is_taken_gives_its_routes_no_port() {
    let text = [
        CLASS.to_string(),
        gateway(
            "old",
            0,
            &[&format!("{{name: db, protocol: TCP, port: 5432, {ALL}}}")],
            None,
        ),
        gateway(
            "new",
            1,
            &[&format!("{{name: pg, protocol: TCP, port: 5432, {ALL}}}")],
            None,
        ),
        route("TCPRoute", "theirs", 0, "name: old, namespace: infra"),
        route("TCPRoute", "mine", 1, "name: new, namespace: infra"),
    ]
    .concat();
    let plan = plan_of(&text, &[]);

    let mine = route_accepted(&plan, "mine");
    assert_eq!((&*mine.status, &*mine.reason), ("False", "PortUnavailable"));
    assert_eq!(
        mine.message,
        "listener pg serves no traffic: port 5432 on 10.0.0.1 belongs to listener db of the \
         older Gateway infra/old"
    );
    assert_eq!(owner(&plan, 5432), Some("theirs"));
    let pg = listener(&plan, "new", "pg");
    assert_eq!(pg.attached_routes, 0, "only accepted routes are attached");
    assert_eq!(&*find(&pg.conditions, "Accepted").reason, "PortUnavailable");
    assert_eq!(&*find(&pg.conditions, "Programmed").status, "False");
    // No listener of the newer Gateway serves: it is not accepted as a whole.
    let gw = gateway_status(&plan, "new");
    let accepted = find(&gw.conditions, "Accepted");
    assert_eq!(
        (&*accepted.status, &*accepted.reason),
        ("False", "ListenersNotValid")
    );
    assert_eq!(&*find(&gw.conditions, "Programmed").status, "False");
    assert_eq!(listener(&plan, "old", "db").attached_routes, 1);
}

#[test]
fn a_route_kind_or_namespace_the_named_listeners_refuse_is_not_allowed_by_listeners() {
    let text = [
        CLASS.to_string(),
        gateway(
            "gw",
            0,
            &[
                "{name: dns, protocol: UDP, port: 53, allowedRoutes: {namespaces: {from: All}, \
                 kinds: [{kind: UDPRoute}]}}",
                "{name: home, protocol: TCP, port: 80}",
                &format!("{{name: open, protocol: TCP, port: 81, {ALL}}}"),
                "{name: web, protocol: HTTP, port: 8080}",
            ],
            None,
        ),
        // The issue's case: a TCPRoute naming a UDP listener that allows UDPRoutes only.
        route(
            "TCPRoute",
            "by-section",
            0,
            "name: gw, namespace: infra, sectionName: dns",
        ),
        route(
            "TCPRoute",
            "by-port",
            1,
            "name: gw, namespace: infra, port: 53",
        ),
        route(
            "TCPRoute",
            "http",
            2,
            "name: gw, namespace: infra, sectionName: web",
        ),
        route(
            "TCPRoute",
            "elsewhere",
            3,
            "name: gw, namespace: infra, sectionName: home",
        ),
        route(
            "UDPRoute",
            "udp-to-tcp",
            4,
            "name: gw, namespace: infra, port: 81",
        ),
        route(
            "TCPRoute",
            "no-such",
            5,
            "name: gw, namespace: infra, sectionName: nope",
        ),
        route(
            "TCPRoute",
            "no-port",
            6,
            "name: gw, namespace: infra, port: 9999",
        ),
        route("TCPRoute", "whole", 7, "name: gw, namespace: infra"),
    ]
    .concat();
    let plan = plan_of(&text, &[]);
    let expect = |name: &str, reason: &str, message: &str| {
        let c = route_accepted(&plan, name);
        assert_eq!(
            (&*c.status, &*c.reason, &*c.message),
            ("False", reason, message),
            "{name}"
        );
    };
    expect(
        "by-section",
        "NotAllowedByListeners",
        "listener dns (protocol UDP) does not take TCPRoutes",
    );
    expect(
        "by-port",
        "NotAllowedByListeners",
        "listener dns (protocol UDP) does not take TCPRoutes",
    );
    expect(
        "http",
        "NotAllowedByListeners",
        "listener web (protocol HTTP) does not take TCPRoutes",
    );
    expect(
        "elsewhere",
        "NotAllowedByListeners",
        "listener home does not allow routes from namespace team (allowedRoutes.namespaces.from: Same)",
    );
    expect(
        "udp-to-tcp",
        "NotAllowedByListeners",
        "listener open (protocol TCP) does not take UDPRoutes",
    );
    expect(
        "no-such",
        "NoMatchingParent",
        "the Gateway has no listener nope",
    );
    expect(
        "no-port",
        "NoMatchingParent",
        "port 9999 is neither the port nor in the port range of a listener",
    );
    // Without sectionName or port, the listeners that admit it are attached to.
    let whole = route_accepted(&plan, "whole");
    assert_eq!(
        (&*whole.status, &*whole.message),
        ("True", "attached to listener open")
    );
}

#[test]
fn a_kind_excluded_by_allowed_kinds_is_not_allowed_by_listeners() {
    let text = [
        CLASS.to_string(),
        gateway(
            "gw",
            0,
            &["{name: tcp, protocol: TCP, port: 80, allowedRoutes: {namespaces: {from: All}, kinds: [{kind: UDPRoute}]}}"],
            None,
        ),
        route("TCPRoute", "r", 0, "name: gw, namespace: infra, sectionName: tcp"),
    ]
    .concat();
    let plan = plan_of(&text, &[]);
    let c = route_accepted(&plan, "r");
    assert_eq!(
        (&*c.status, &*c.reason, &*c.message),
        (
            "False",
            "NotAllowedByListeners",
            "listener tcp does not allow TCPRoutes (allowedRoutes.kinds)"
        )
    );
}

/// Found by the property test: a route whose range shrank away from its port got
/// that port back as its own released claim, while a newer Gateway on the address,
/// no longer overlapping, had given it to its own route: two routes on one port.
#[test]
fn a_released_claim_outside_the_listeners_range_now_is_not_bound_again() {
    let text = [
        CLASS.to_string(),
        range_gateway("old", 0, "pool", 30000, 30000),
        range_gateway("new", 1, "pool", 30009, 30009),
        route("TCPRoute", "theirs", 0, "name: old, namespace: infra"),
        route("TCPRoute", "mine", 1, "name: new, namespace: infra"),
    ]
    .concat();
    // `theirs` held 30009 while `old`'s range was 30009-30009.
    let claims = [claim("old", "pool", 30009, "theirs")];
    let plan = plan_of(&text, &claims);
    let again = plan_of(&text, &plan.claims);
    for plan in [&plan, &again] {
        assert_eq!(
            route_accepted(plan, "theirs").message,
            "assigned port 30000"
        );
        assert_eq!(route_accepted(plan, "mine").message, "assigned port 30009");
        assert_eq!(owner(plan, 30009), Some("mine"));
        let bound_at_30009 = plan
            .claims
            .iter()
            .filter(|c| c.spec.port == 30009)
            .filter(|c| c.is_bound())
            .count();
        assert_eq!(bound_at_30009, 1, "{:?}", plan.claims);
    }
}

/// Records checked when loaded (issue 12): a claim outside its listener's range, or a
/// second claim of a route on one listener, is released, and the plan says which and
/// why (the daemon logs it, `berth check` prints it) — a route that merely left its
/// listener is released without a word.
#[test]
fn a_claim_released_while_its_route_still_attaches_is_named_with_the_reason() {
    let text = [
        CLASS.to_string(),
        range_gateway("gw", 0, "pool", 30000, 30009),
        route("TCPRoute", "a", 0, "name: gw, namespace: infra"),
        route("TCPRoute", "b", 1, "name: gw, namespace: infra"),
    ]
    .concat();
    let claims = [
        claim("gw", "pool", 30001, "a"),
        claim("gw", "pool", 30002, "a"),
        claim("gw", "pool", 31500, "b"),
        claim("gw", "pool", 30005, "gone"),
    ];
    let plan = plan_of(&text, &claims);
    assert_eq!(
        plan.released,
        [
            "claim infra/gw-tcp-30002 (TCP 30002) released: its route already holds another \
             port of listener pool",
            "claim infra/gw-tcp-31500 (TCP 31500) released: port 31500 is outside listener \
             pool's range 30000-30009",
        ],
        "{:?}",
        plan.claims
    );
    assert_eq!(route_accepted(&plan, "a").message, "assigned port 30001");
    assert_eq!(route_accepted(&plan, "b").message, "assigned port 30000");
    // Released once: the next plan has nothing more to say.
    assert!(plan_of(&text, &plan.claims).released.is_empty());
}

/// `gateway(...)` with `sourceNAT: {value}` in its GatewayConfig.
fn snat_gateway(
    name: &str,
    created: u64,
    listeners: &[&str],
    range: (&str, u16),
    value: &str,
) -> String {
    gateway(name, created, listeners, Some(range)).replace(
        "spec: {listeners: [",
        &format!("spec: {{sourceNAT: {value}, listeners: ["),
    )
}

/// Gateway `nat` with the TCP range 40000-40009 and `sourceNAT: {value}`.
fn nat_pool(value: &str) -> String {
    snat_gateway(
        "nat",
        0,
        &[&format!(
            "{{name: pool, protocol: TCP, port: 40000, {ALL}}}"
        )],
        ("pool", 40009),
        value,
    )
}

fn tcp(port: u16) -> ServiceAddr {
    ServiceAddr {
        addr: Ipv4Addr::new(10, 0, 0, 1).into(),
        protocol: Protocol::Tcp,
        port,
    }
}

#[test]
fn a_gateway_in_snat_mode_marks_its_services_and_snat_ports_skip_every_listener() {
    let text = [
        CLASS.to_string(),
        nat_pool("true"),
        gateway(
            "plain",
            1,
            &[
                &format!("{{name: db, protocol: TCP, port: 5432, {ALL}}}"),
                &format!("{{name: dns, protocol: UDP, port: 50000, {ALL}}}"),
                &format!("{{name: web, protocol: TCP, port: 60999, {ALL}}}"),
            ],
            None,
        ),
        route("TCPRoute", "natted", 0, "name: nat, namespace: infra"),
        route(
            "TCPRoute",
            "routed",
            1,
            "name: plain, namespace: infra, sectionName: db",
        ),
    ]
    .concat();
    let plan = plan_of(&text, &[]);
    assert_eq!(owner(&plan, 40000), Some("natted"));
    assert_eq!(owner(&plan, 5432), Some("routed"));
    assert_eq!(
        plan.datapath.source_nat,
        imbl::OrdSet::from(vec![tcp(40000)]),
        "only the SNAT Gateway's service"
    );
    // The whole range of the SNAT listener, the UDP listener's port and the last port
    // of the pool (a listener without routes) are taken out.
    assert_eq!(
        plan.datapath.snat_ports,
        vec![32768..=39999, 40010..=49999, 50001..=60998]
    );
    let narrow = plan_snat(&text, &[], 40005..=40020);
    assert_eq!(narrow.datapath.snat_ports, vec![40010..=40020]);
    let covered = plan_snat(&text, &[], 40001..=40009);
    assert!(covered.datapath.snat_ports.is_empty());
    let edges = plan_snat(&text, &[], 1..=65535);
    assert_eq!(
        edges.datapath.snat_ports,
        vec![
            1..=5431,
            5433..=39999,
            40010..=49999,
            50001..=60998,
            61000..=65535
        ]
    );
}

#[test]
fn a_source_nat_that_is_not_a_boolean_is_invalid_parameters_naming_the_field() {
    let text = [
        CLASS.to_string(),
        nat_pool("\"yes\""),
        route("TCPRoute", "natted", 0, "name: nat, namespace: infra"),
    ]
    .concat();
    let plan = plan_of(&text, &[]);
    let accepted = find(&gateway_status(&plan, "nat").conditions, "Accepted");
    assert_eq!(
        (&*accepted.status, &*accepted.reason),
        ("False", "InvalidParameters")
    );
    assert!(
        accepted
            .message
            .contains("GatewayConfig infra/nat: spec.sourceNAT \"yes\": not a boolean"),
        "{}",
        accepted.message
    );
    assert!(plan.datapath.source_nat.is_empty());
    let off = plan_of(&text.replace("sourceNAT: \"yes\"", "sourceNAT: false"), &[]);
    assert_eq!(
        &*find(&gateway_status(&off, "nat").conditions, "Accepted").status,
        "True"
    );
    assert!(off.datapath.source_nat.is_empty());
}

/// A Gateway `gw` in `infra` on `addresses` with one TCP and one UDP range listener
/// (30000-30009), a route of each kind in `team` on it, and Services `web` (TCP 80)
/// and `dns` (UDP 53) with endpoints `web` and `dns` (each `(addressType, address)`).
fn families_world(addresses: &[&str], web: &[(&str, &str)], dns: &[(&str, &str)]) -> String {
    let addrs: Vec<String> = addresses
        .iter()
        .map(|a| format!("{{value: \"{a}\"}}"))
        .collect();
    let mut s = format!(
        "{CLASS}---\napiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\n\
         metadata: {{name: gw, namespace: infra}}\n\
         spec:\n  gatewayClassName: berth\n  addresses: [{}]\n  infrastructure:\n    \
         parametersRef: {{group: berth.dev, kind: GatewayConfig, name: gw}}\n  listeners:\n  \
         - {{name: tcp, protocol: TCP, port: 30000, {ALL}}}\n  \
         - {{name: udp, protocol: UDP, port: 30000, {ALL}}}\n---\n\
         apiVersion: berth.dev/v1alpha1\nkind: GatewayConfig\nmetadata: {{name: gw, namespace: infra}}\n\
         spec: {{listeners: [{{name: tcp, endPort: 30009}}, {{name: udp, endPort: 30009}}]}}\n",
        addrs.join(", ")
    );
    for (kind, name, protocol, port, endpoints) in [
        ("TCPRoute", "web", "TCP", 80, web),
        ("UDPRoute", "dns", "UDP", 53, dns),
    ] {
        s.push_str(&format!(
            "---\napiVersion: gateway.networking.k8s.io/v1\nkind: {kind}\n\
             metadata: {{name: {name}, namespace: team}}\n\
             spec:\n  parentRefs: [{{name: gw, namespace: infra}}]\n  \
             rules: [{{backendRefs: [{{name: {name}, port: {port}}}]}}]\n---\n\
             apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: team}}\n\
             spec: {{ports: [{{name: p, port: {port}, protocol: {protocol}}}]}}\n"
        ));
        for (i, (kind, address)) in endpoints.iter().enumerate() {
            s.push_str(&format!(
                "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n\
                 metadata: {{name: {name}-{i}, namespace: team, labels: {{kubernetes.io/service-name: {name}}}}}\n\
                 addressType: {kind}\nendpoints: [{{addresses: [\"{address}\"]}}]\n\
                 ports: [{{name: p, port: 8000, protocol: {protocol}}}]\n"
            ));
        }
    }
    s
}

fn resolved_refs<'a>(plan: &'a Plan, name: &str) -> &'a Condition {
    let r = plan.routes.iter().find(|r| r.name == name).expect("route");
    find(&r.status.parents[0].conditions, "ResolvedRefs")
}

/// The backends of the datapath service at `addr`, protocol, port 30000.
fn backends_at(plan: &Plan, addr: &str, protocol: Protocol) -> Vec<String> {
    let service = ServiceAddr {
        addr: addr.parse().expect("ip"),
        protocol,
        port: 30000,
    };
    plan.datapath
        .services
        .get(&service)
        .unwrap_or_else(|| panic!("no service {service} in {:?}", plan.datapath))
        .iter()
        .map(|b| b.endpoint.to_string())
        .collect()
}

#[test]
fn an_ipv6_gateway_refuses_a_route_with_only_ipv4_endpoints_and_serves_the_other() {
    let plan = plan_of(
        &families_world(
            &["2001:db8::1"],
            &[("IPv6", "2001:db8:1::1")],
            &[("IPv4", "10.1.0.53")],
        ),
        &[],
    );
    let dns = resolved_refs(&plan, "dns");
    assert_eq!((&*dns.status, &*dns.reason), ("False", "IPFamilyMismatch"));
    assert_eq!(
        dns.message,
        "Gateway infra/gw serves IPv6 only; Service team/dns has only IPv4 endpoints \
         (there is no NAT64)"
    );
    // The refusal is the route's own: it keeps its port, the other route is served.
    assert_eq!(route_accepted(&plan, "dns").status, "True");
    let web = resolved_refs(&plan, "web");
    assert_eq!(
        (&*web.status, &*web.message),
        ("True", "all backend references resolved")
    );
    assert_eq!(
        backends_at(&plan, "2001:db8::1", Protocol::Tcp),
        ["[2001:db8:1::1]:8000"]
    );
    assert!(backends_at(&plan, "2001:db8::1", Protocol::Udp).is_empty());
    assert_eq!(plan.datapath.services.len(), 2, "{:?}", plan.datapath);
}

#[test]
fn a_dual_stack_gateway_serves_one_claim_on_both_families_with_their_own_endpoints() {
    let plan = plan_of(
        &families_world(
            &["10.0.0.1", "2001:db8::1"],
            &[("IPv4", "10.1.0.1"), ("IPv6", "2001:db8:1::1")],
            &[("IPv4", "10.1.0.53")],
        ),
        &[],
    );
    assert_eq!(
        plan.claims.len(),
        2,
        "one claim per route: {:?}",
        plan.claims
    );
    assert_eq!(
        gateway_status(&plan, "gw")
            .addresses
            .iter()
            .map(|a| a.value.as_str())
            .collect::<Vec<_>>(),
        ["10.0.0.1", "2001:db8::1"]
    );
    assert_eq!(
        backends_at(&plan, "10.0.0.1", Protocol::Tcp),
        ["10.1.0.1:8000"]
    );
    assert_eq!(
        backends_at(&plan, "2001:db8::1", Protocol::Tcp),
        ["[2001:db8:1::1]:8000"]
    );
    let owners: BTreeSet<&str> = plan.owners.values().map(|o| o.name.as_str()).collect();
    assert_eq!(owners, BTreeSet::from(["dns", "web"]));
    // dns has IPv4 endpoints only: served on IPv4, and the IPv6 side says why not.
    assert_eq!(
        backends_at(&plan, "10.0.0.1", Protocol::Udp),
        ["10.1.0.53:8000"]
    );
    assert!(backends_at(&plan, "2001:db8::1", Protocol::Udp).is_empty());
    let dns = resolved_refs(&plan, "dns");
    assert_eq!(dns.status, "True");
    assert!(
        dns.message.contains(
            "served on IPv4 only: Service team/dns has no IPv6 endpoints (IPv6 clients get \
             no backend)"
        ),
        "{}",
        dns.message
    );
}

#[test]
fn an_ipv6_endpoint_slice_is_read_and_its_weights_split_over_its_endpoints() {
    let plan = plan_of(
        &families_world(
            &["2001:db8::1"],
            &[("IPv6", "2001:db8:1::1"), ("IPv6", "2001:DB8:1::2")],
            &[],
        ),
        &[],
    );
    let service = ServiceAddr {
        addr: "2001:db8::1".parse().expect("ip"),
        protocol: Protocol::Tcp,
        port: 30000,
    };
    let backends: Vec<(String, u16)> = plan.datapath.services[&service]
        .iter()
        .map(|b| (b.endpoint.to_string(), b.weight))
        .collect();
    assert_eq!(
        backends,
        [
            ("[2001:db8:1::1]:8000".to_string(), 500),
            ("[2001:db8:1::2]:8000".to_string(), 500)
        ],
        "the backendRef's share is split over its IPv6 endpoints, whatever their slice"
    );
    assert_eq!(service.to_string(), "TCP/[2001:db8::1]:30000");
}

#[test]
fn a_service_named_twice_is_named_once_in_a_family_mismatch() {
    let text = families_world(&["2001:db8::1"], &[], &[("IPv4", "10.1.0.53")]).replace(
        "backendRefs: [{name: dns, port: 53}]",
        "backendRefs: [{name: dns, port: 53}, {name: dns, port: 53, weight: 2}]",
    );
    let plan = plan_of(&text, &[]);
    let dns = resolved_refs(&plan, "dns");
    assert_eq!(dns.reason, "IPFamilyMismatch");
    assert_eq!(
        dns.message.matches("Service team/dns").count(),
        1,
        "{}",
        dns.message
    );
}
