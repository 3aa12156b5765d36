//! Route attachment refusals: a listener takes only the route kinds and namespaces its
//! protocol and `allowedRoutes` allow.

use super::test_support::{gateway, plan_of, route, route_accepted, ALL, CLASS};

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
