//! Gateways sharing an address: a newer listener overlapping an older one's ports
//! serves only the ports left to it, and says why.

use super::test_support::{
    claim, find, gateway, gateway_status, listener, owner, plan_of, range_gateway, route,
    route_accepted, ALL, CLASS,
};

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
