use std::{
    io::{Read, Write},
    net::TcpStream,
    path::Path,
    sync::Arc,
    time::Duration,
};

use super::*;
use crate::{datapath::held_back, manifests, model::ServiceAddr, planner};

/// What a daemon publishes for the golden case `name` (its plan, with the
/// services a datapath holds back).
fn published(name: &str) -> Published {
    published_with(name, Default::default())
}

/// `published` for a datapath of room `capacity` (the case's `PlannerClock`
/// document left out).
fn published_with(name: &str, capacity: crate::datapath::Capacity) -> Published {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden");
    let path = dir.join(format!("{name}.in.yaml"));
    let text = std::fs::read_to_string(&path).expect("golden input");
    let text: Vec<&str> = text
        .split("\n---\n")
        .filter(|doc| !doc.contains("kind: PlannerClock"))
        .collect();
    published_of(&path, &text.join("\n---\n"), capacity)
}

/// What a daemon publishes for the manifests `text` (read as file `path`).
fn published_of(path: &Path, text: &str, capacity: crate::datapath::Capacity) -> Published {
    let parsed = manifests::parse_file(path, text);
    assert!(parsed.errors.is_empty(), "{:?}", parsed.errors);
    let snapshot = manifests::snapshot([&parsed]);
    let plan = planner::plan(&planner::Input {
        snapshot: &snapshot,
        claims: &Default::default(),
        now: humantime::parse_rfc3339("2026-01-01T00:00:00Z").expect("time"),
        default_addresses: planner::DefaultAddresses::default(),
        ephemeral_ports: None,
        allocate: true,
        snat_ports: planner::DEFAULT_SNAT_PORTS,
        capacity,
    });
    let (_, held) = held_back::kernel_state(&plan.datapath, None);
    let mut p = crate::publish::effects(plan, None, &Published::default()).expect("effects");
    p.held_back = held;
    p
}

#[test]
fn the_routes_answers_written_row_by_row_are_the_json_and_the_table_of_the_rows() {
    let p = published_with(
        "a-full-datapath-serves-the-oldest-routes-and-the-rest-keep-their-ports-and-say-why",
        crate::datapath::Capacity {
            services: 2,
            ..Default::default()
        },
    );
    for namespace in [None, Some("team-a"), Some("nobody")] {
        let rows = route_rows(&p, namespace);
        assert_eq!(
            route_rows_json(&p, namespace),
            serde_json::to_string(&rows).expect("json"),
            "{namespace:?}"
        );
        assert_eq!(
            route_table_text(&p, namespace),
            crate::output::route_table(&rows),
            "{namespace:?}"
        );
    }
    assert!(!route_rows(&p, None).is_empty());
    assert_eq!(route_rows_json(&Published::default(), None), "[]");
    // Written a row a part, the parts make the same text.
    let p = Arc::new(p);
    for format in [RowFormat::Json, RowFormat::Table] {
        let mut parts = RouteRowParts::new(Arc::clone(&p), None, format);
        parts.part_bytes = 1;
        let parts: Vec<Vec<u8>> = std::iter::from_fn(|| parts.next_part()).collect();
        assert!(parts.len() > 3, "{format:?}: {} parts", parts.len());
        let whole = RouteRowParts::new(Arc::clone(&p), None, format).whole();
        assert_eq!(String::from_utf8(parts.concat()).expect("text"), whole);
    }
    let all = Resource::at("/api/v1/tables/routes", Endpoints::All);
    assert_eq!(all, Some(Resource::RouteTable(None)));
    let (code, _, text) = Resource::RouteTable(None).answer(&p, metrics::Detail::Aggregate);
    assert_eq!(code, StatusCode::OK);
    assert!(
        text.starts_with("NAMESPACE") && text.contains("oldest"),
        "{text}"
    );
    assert_eq!(
        Resource::at("/api/v1/tables/routes/team-a", Endpoints::All),
        Some(Resource::RouteTable(Some("team-a".into())))
    );
}

/// The real admin server on a free loopback port, serving snapshot `p`; its address.
fn serve(p: Published) -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    let shared: crate::publish::Shared = Arc::new(std::sync::Mutex::new(Arc::new(p)));
    server::spawn(
        vec![(listener, Endpoints::All)],
        &addr,
        metrics::Detail::Aggregate,
        shared,
        Default::default(),
    )
    .expect("serve");
    addr
}

#[test]
fn a_namespace_with_routes_of_the_second_kind_only_gets_its_rows_in_parts() {
    // The examples: team-a has a TCPRoute, team-b a UDPRoute. Written in parts, the
    // rows of team-b once came out empty: the TCPRoutes' range of team-b is empty,
    // and an empty range ended the rows.
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
    let text: Vec<String> = ["gateway.yaml", "team-a.yaml", "team-b.yaml"]
        .iter()
        .map(|f| std::fs::read_to_string(dir.join(f)).expect("example"))
        .collect();
    let p = Arc::new(published_of(
        &dir.join("all.yaml"),
        &text.join("\n---\n"),
        Default::default(),
    ));
    let all = route_rows(&p, None);
    assert!(all
        .iter()
        .any(|r| r.kind == "UDPRoute" && r.namespace == "team-b"));
    for namespace in ["team-a", "team-b"] {
        let want: Vec<RouteRow> = all
            .iter()
            .filter(|r| r.namespace == namespace)
            .cloned()
            .collect();
        assert!(!want.is_empty(), "{namespace}");
        for part_bytes in [1, PART_BYTES] {
            let mut parts = RouteRowParts::new(Arc::clone(&p), Some(namespace), RowFormat::Json);
            parts.part_bytes = part_bytes;
            let json: Vec<u8> = std::iter::from_fn(|| parts.next_part()).flatten().collect();
            let rows: Vec<RouteRow> = serde_json::from_slice(&json).expect("json");
            assert_eq!(rows, want, "{namespace}, parts of {part_bytes} bytes");
        }
    }
}

#[test]
fn the_routes_are_sent_as_written_to_http_1_0_and_chunked_to_http_1_1_clients() {
    let p = published("dynamic-routes-get-the-lowest-free-ports-in-source-order");
    let addr = serve(p.clone());
    let json = route_rows_json(&p, None);
    assert!(json.len() > 2, "{json}");
    // berth's own client asks in HTTP/1.0: the answer ends with the connection.
    assert_eq!(get(&addr, "/api/v1/routes").expect("routes"), json);
    assert_eq!(
        get(&addr, "/api/v1/tables/routes").expect("table"),
        route_table_text(&p, None)
    );
    // curl and Prometheus ask in HTTP/1.1: chunks.
    let mut s = TcpStream::connect(&addr).expect("connect");
    s.write_all(b"GET /api/v1/routes HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        .expect("request");
    let mut text = String::new();
    s.read_to_string(&mut text).expect("answer");
    let (head, mut rest) = text.split_once("\r\n\r\n").expect("head and body");
    assert!(
        head.to_ascii_lowercase()
            .contains("transfer-encoding: chunked"),
        "{head}"
    );
    let mut body = String::new();
    loop {
        let (size, after) = rest.split_once("\r\n").expect("chunk size");
        let size = usize::from_str_radix(size, 16).expect("hex size");
        if size == 0 {
            break;
        }
        body.push_str(&after[..size]);
        rest = after[size..].strip_prefix("\r\n").expect("chunk end");
    }
    assert_eq!(body, json);
}

#[test]
fn the_client_tells_a_path_the_daemon_does_not_serve_by_its_kind() {
    let addr = serve(Published::default());
    let table = get(&addr, "/api/v1/tables/routes").expect("the table");
    assert!(table.starts_with("NAMESPACE"), "{table}");
    let missing = get(&addr, "/api/v1/tables/nothing").expect_err("404");
    assert_eq!(missing.code(), Some(404), "{missing}");
    let unavailable = get(&addr, "/api/v1/state").expect_err("503: no plan yet");
    assert_eq!(unavailable.code(), Some(503), "{unavailable}");
}

#[test]
fn routes_waiting_for_room_in_the_datapath_are_warned_about_and_counted_and_it_is_ready() {
    let room = crate::datapath::Capacity {
        services: 2,
        ..Default::default()
    };
    let p = published_with(
        "a-full-datapath-serves-the-oldest-routes-and-the-rest-keep-their-ports-and-say-why",
        room,
    );
    let rows = route_rows(&p, Some("team-a"));
    let by = |name: &str| {
        rows.iter()
            .find(|r| r.name == name)
            .unwrap_or_else(|| panic!("no {name}: {rows:?}"))
    };
    assert_eq!(by("oldest").warning, None);
    assert_eq!(by("oldest").backends, 1);
    for name in ["third", "newest"] {
        let r = by(name);
        assert!(r.port.is_some() && r.accepted.starts_with("True"), "{r:?}");
        assert_eq!(r.backends, 0, "{r:?}");
        let w = r.warning.as_deref().unwrap_or_default();
        assert!(
            w.starts_with(
                "not programmed: the datapath holds at most 2 services (berth run \
                 --max-services)"
            ),
            "{r:?}"
        );
    }
    let table = crate::output::route_table(&rows);
    assert!(table.contains("  ↳ warning: not programmed"), "{table}");
    let text = metrics::encode(&p, metrics::Detail::Aggregate);
    for want in [
        "berth_routes_waiting_for_capacity{limit=\"services\"} 2",
        "berth_routes_waiting_for_capacity{limit=\"backends\"} 0",
    ] {
        assert!(text.contains(want), "no {want} in:\n{text}");
    }
    assert_eq!(readiness(&p, std::time::SystemTime::now()), None);
}

#[test]
fn the_node_view_counts_flows_picked_up_from_other_gateways_and_prints_a_row() {
    use gateway_common::Counter;
    let mut p = Published::default();
    for (c, n) in [
        (Counter::CtMissMidflow, 3),
        (Counter::CtMissReply, 5),
        (Counter::ReplyUntracked, 1),
        (Counter::ReplySpoofed, 7),
        (Counter::NewFlow, 99),
    ] {
        p.counters.insert(c.name(), n);
    }
    p.announce = Some(std::sync::Arc::new(crate::announce::Status::example(
        crate::announce::State::Draining,
        Some("addresses withdrawn by berth drain"),
        &[],
    )));
    let node = NodeView::of(&p);
    assert_eq!(
        (
            node.midflow_misses,
            node.reply_misses,
            node.replies_unmatched,
            node.replies_spoofed
        ),
        (3, 5, 1, 7)
    );
    let (status, _, body) = Resource::Node.answer(&p, metrics::Detail::Aggregate);
    assert_eq!(status, StatusCode::OK);
    assert_eq!(serde_json::from_str::<NodeView>(&body).expect("json"), node);
    let table = crate::output::node_table(&node);
    let row = table.lines().nth(1).expect("a row");
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(cells.first(), Some(&"DRAINING"), "{table}");
    assert_eq!(cells[cells.len() - 4..], ["3", "5", "1", "7"], "{table}");
    assert_eq!(
        Resource::at("/api/v1/node", Endpoints::Monitoring),
        None,
        "the node view is on the admin address only"
    );
}

#[test]
fn readiness_says_why_the_addresses_are_withdrawn_and_why_the_node_is_not_ready() {
    use crate::announce::{State, Status};
    let t0 = humantime::parse_rfc3339(crate::announce::EXAMPLE_SINCE).expect("time");
    let status = |state: State, reason: Option<&str>| Status::example(state, reason, &[]);
    let published = |announce: Option<Status>, last_error: Option<&str>| Published {
        cycles: 1,
        last_error: last_error.map(str::to_string),
        announce: announce.map(std::sync::Arc::new),
        ..Published::default()
    };
    let at = |secs| t0 + Duration::from_secs(secs);
    assert_eq!(readiness(&published(None, None), at(0)), None);
    let announced = published(Some(status(State::Announced, None)), None);
    assert_eq!(readiness(&announced, at(0)), None);
    let drained = Some(status(
        State::Draining,
        Some("addresses withdrawn by berth drain"),
    ));
    assert_eq!(
        readiness(&published(drained.clone(), Some("disk full")), at(12)).as_deref(),
        Some("draining: addresses withdrawn by berth drain 12s ago\nnot ready: disk full\n")
    );
    let not_ready = Some(status(State::NotReady, Some("not ready (disk full)")));
    assert_eq!(
        readiness(&published(not_ready, Some("disk full")), at(3)).as_deref(),
        Some("withdrawn-not-ready: not ready (disk full) 3s ago\n"),
        "the reason is said once"
    );
    let no_plan = Published::default();
    assert_eq!(
        readiness(&no_plan, at(0)).as_deref(),
        Some("not ready: no plan yet\n")
    );
}

#[test]
fn a_route_with_only_endpoints_of_a_family_its_gateway_does_not_serve_says_so() {
    // An IPv4 Gateway, a UDPRoute whose Service has only IPv6 endpoints: accepted,
    // no backend, and the row and the loss log say why (issue 31).
    let p =
        published("an-ipv4-gateway-refuses-a-route-with-only-ipv6-endpoints-and-serves-the-others");
    let rows = route_rows(&p, None);
    let dns = rows.iter().find(|r| r.name == "dns").expect("dns");
    assert_eq!(
        (dns.accepted.as_str(), dns.backends),
        ("True (Accepted)", 0)
    );
    assert_eq!(
        dns.warning.as_deref(),
        Some(
            "no backends: packets to it are dropped (Gateway infra/shared serves IPv4 \
             only; Service team-a/dns has only IPv6 endpoints (there is no NAT64))"
        )
    );
    let web = rows.iter().find(|r| r.name == "web").expect("web");
    assert_eq!((web.backends, web.warning.as_deref()), (1, None));
    assert_eq!(
        crate::publish::loss_routes(&p, &p, gateway_common::Counter::DropNoBackend),
        "UDPRoute/team-a/dns"
    );
}

#[test]
fn a_route_of_a_dual_stack_gateway_names_its_endpointless_family() {
    let p = published(
        "a-dual-stack-gateway-serves-a-route-with-only-ipv4-endpoints-on-ipv4-and-says-so",
    );
    assert!(p.held_back.is_empty(), "IPv6 is served: {:?}", p.held_back);
    let rows = route_rows(&p, None);
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0].backends, 1);
    assert_eq!(
        rows[0].warning.as_deref(),
        Some("no IPv6 endpoints: IPv6 clients of TCP/[2001:db8::1]:30000 get no backend")
    );
    let table = crate::output::route_table(&rows);
    assert!(table.contains("  ↳ warning: no IPv6 endpoints"), "{table}");
    let metrics = metrics::encode(&p, metrics::Detail::Aggregate);
    for want in [
        "berth_services_held_back{family=\"ipv4\"} 0",
        "berth_services_held_back{family=\"ipv6\"} 0",
    ] {
        assert!(
            metrics.lines().any(|l| l == want),
            "no {want:?} in:\n{metrics}"
        );
    }
}

#[test]
fn a_route_of_a_dual_stack_gateway_with_both_families_counts_the_endpoints_of_each() {
    let mut p = published("a-dual-stack-gateway-serves-both-families-on-the-same-port");
    let rows = route_rows(&p, None);
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0].port, Some(30000));
    assert_eq!(rows[0].backends, 3, "two IPv4 endpoints and one IPv6");
    assert_eq!(rows[0].warning, None, "{rows:?}");
    // A service the datapath holds back is named with the reason.
    let v6 = *p
        .datapath
        .services
        .keys()
        .find(|s| s.addr.is_ipv6())
        .expect("an IPv6 service");
    p.held_back = vec![held_back::HeldBack {
        service: v6,
        why: held_back::Why::MixedFamilies,
    }];
    assert_eq!(
        route_rows(&p, None)[0].warning.as_deref(),
        Some(
            "TCP/[2001:db8::1]:30000 is held back: a backend of the other IP family \
             (there is no NAT64)"
        )
    );
}

#[test]
fn a_kernel_path_all_of_an_addresss_routes_share_is_said_once_per_address() {
    // Routes on one address, all forwarded by the kernel for one reason: the rows
    // say PATH kernel, the reason is said once, per address (issue 31).
    let mut p = published("the-namespace-quota-refuses-the-extra-route-only");
    let services: Vec<ServiceAddr> = p.datapath.services.keys().copied().collect();
    let n = services.len();
    assert!(n >= 2, "{services:?}");
    for s in &services {
        let mut traffic = crate::datapath::Traffic::default();
        traffic.stats.packets = 10;
        traffic.stats.kernel_packets = 10;
        traffic.stats.kernel_reason = gateway_common::Counter::KernelNoXdpEgress as u32 + 1;
        std::sync::Arc::make_mut(&mut p.traffic).insert(*s, traffic);
    }
    p.address_paths = Arc::new(
        addresses::sums(&p)
            .into_iter()
            .filter_map(|(k, s)| Some((k, s.traffic.path()?)))
            .collect(),
    );
    let rows = addresses::rows(&p);
    assert_eq!(rows.len(), 1, "{rows:?}");
    let all = 10 * n as u64;
    assert_eq!(
        (rows[0].routes, rows[0].packets, rows[0].kernel_packets),
        (n as u64, all, all)
    );
    assert_eq!(rows[0].path, "kernel: egress takes no XDP frames");
    let table = crate::output::address_table(&rows);
    assert_eq!(
        table.matches("forwarded by the kernel").count(),
        1,
        "{table}"
    );

    let routes = RouteRowParts::new(Arc::new(p), None, RowFormat::Table).whole();
    assert_eq!(
        routes.matches("egress takes no XDP frames").count(),
        1,
        "{routes}"
    );
    assert_eq!(
        routes.matches(" kernel ").count(),
        n,
        "every row's PATH: {routes}"
    );
}

#[test]
fn routes_of_a_fixed_listener_show_its_name_port_backends_and_traffic() {
    let mut p =
        published("two-routes-on-a-fixed-listener-are-both-accepted-and-only-the-oldest-serves");
    let service = *p
        .datapath
        .services
        .keys()
        .next()
        .expect("the listener's service");
    let mut traffic = crate::datapath::Traffic::default();
    traffic.stats.packets = 7;
    traffic.stats.reply_packets = 3;
    traffic.active_flows = 2;
    std::sync::Arc::make_mut(&mut p.traffic).insert(service, traffic);
    let rows = route_rows(&p, None);
    let row = |name: &str| rows.iter().find(|r| r.name == name).expect("a row");
    let (old, new) = (row("old"), row("new"));
    assert_eq!(
        (old.listener.as_str(), old.port, old.backends),
        ("tcp-80", Some(80), 1),
        "{old:?}"
    );
    assert_eq!((old.packets, old.active_flows), (10, 2), "{old:?}");
    assert_eq!(old.warning, None, "{old:?}");
    // The newer route is accepted but not served: said, with no traffic of its own.
    assert_eq!(
        (new.listener.as_str(), new.port, new.backends, new.packets),
        ("tcp-80", Some(80), 0, 0),
        "{new:?}"
    );
    assert!(
        new.warning
            .as_deref()
            .is_some_and(|w| w.starts_with("an older route, team-a/old, gets the traffic")),
        "{new:?}"
    );
}

#[test]
fn a_served_route_without_any_backend_is_warned_about() {
    let p = published(
        "service-ports-match-endpoint-slice-ports-by-name-an-unnamed-one-by-the-empty-name",
    );
    let rows = route_rows(&p, None);
    let row = |name: &str| rows.iter().find(|r| r.name == name).expect("a row");
    let unnamed = row("unnamed");
    assert_eq!(
        unnamed.backends, 2,
        "an IPv4 and an IPv6 endpoint: {unnamed:?}"
    );
    assert_eq!(unnamed.warning, None, "{unnamed:?}");
    assert_eq!(row("named").backends, 2, "{rows:?}");
    let mismatched = row("mismatched");
    assert_eq!(mismatched.backends, 0);
    let warning = mismatched.warning.as_deref().unwrap_or_default();
    assert!(
        warning.starts_with("no backends: packets to it are dropped")
            && warning.contains("has no TCP port named \"\""),
        "{warning}"
    );
    let table = crate::output::route_table(&rows);
    assert!(table.contains("  ↳ warning: no backends"), "{table}");
}
