//! Room in the datapath: services, backends and Gateway addresses beyond it wait,
//! oldest routes first.

use super::test_support::{find, gateway, plan_for, route, ALL, CLASS};
use super::*;
use crate::datapath::Capacity;

/// The plan for a datapath of room `capacity`.
fn plan_room(text: &str, capacity: Capacity) -> Plan {
    plan_for(text, &[], DEFAULT_SNAT_PORTS, capacity)
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
