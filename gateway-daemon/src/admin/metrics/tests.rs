use super::*;
use crate::planner::ListenerUsage;

#[test]
fn label_values_with_quotes_backslashes_and_newlines_are_escaped() {
    let p = Published {
        usage: vec![ListenerUsage {
            namespace: "a\"b".into(),
            gateway: "c\\d".into(),
            listener: "e\nf".into(),
            first: 30000,
            size: 10,
            bound: 3,
            cooling: 1,
        }],
        ..Published::default()
    };
    let text = encode(&p, Detail::PerRoute);
    let line = text
        .lines()
        .find(|l| l.starts_with("berth_listener_ports{") && l.contains("used"))
        .unwrap_or_else(|| panic!("no berth_listener_ports sample:\n{text}"));
    assert_eq!(
        line,
        r#"berth_listener_ports{namespace="a\"b",gateway="c\\d",listener="e\nf",state="used"} 3"#
    );
    // Every line is a comment or one sample: no raw newline split a label value.
    assert!(
        text.lines()
            .all(|l| l.starts_with('#') || l.ends_with(|c: char| c.is_ascii_digit())),
        "{text}"
    );
}

#[test]
fn families_have_help_and_type_and_counters_end_in_total() {
    let p = Published {
        cycles: 7,
        counters: [("redirect", 5)].into_iter().collect(),
        ..Published::default()
    };
    let text = encode(&p, Detail::PerRoute);
    for want in [
        "# HELP berth_plans_total Plans made since start.",
        "# TYPE berth_plans_total counter",
        "berth_plans_total 7",
        "# TYPE berth_manifest_errors gauge",
        "berth_manifest_errors 0",
        "# TYPE berth_manifest_warnings gauge",
        "berth_manifest_warnings 0",
        "berth_cycle_failing 0",
        "# TYPE berth_datapath_packets_total counter",
        "berth_datapath_packets_total{reason=\"redirect\"} 5",
    ] {
        assert!(text.lines().any(|l| l == want), "no {want:?} in:\n{text}");
    }
}

#[test]
fn the_announce_state_is_one_of_five_with_the_published_count_and_the_reason() {
    use crate::announce::{State, Status};
    let status = |state: State, reason: Option<&str>, addresses: &[&str]| {
        Status::example(state, reason, addresses)
    };
    let text = |s: Status| {
        encode(
            &Published {
                announce: Some(std::sync::Arc::new(s)),
                ..Published::default()
            },
            Detail::Aggregate,
        )
    };
    let announced = text(status(State::Announced, None, &["10.0.0.1"]));
    for want in [
        "# TYPE berth_announced_addresses gauge",
        "berth_announced_addresses 1",
        "# TYPE berth_drain_state gauge",
        "berth_drain_state{state=\"announced\"} 1",
        "berth_drain_state{state=\"draining\"} 0",
        "berth_drain_state{state=\"drained\"} 0",
        "berth_drain_state{state=\"stopping\"} 0",
        "berth_drain_state{state=\"not_ready\"} 0",
    ] {
        assert!(
            announced.lines().any(|l| l == want),
            "no {want:?} in:\n{announced}"
        );
    }
    assert!(!announced.contains("berth_drain_reason"), "{announced}");
    let withdrawn = text(status(State::NotReady, Some("disk \"full\""), &[]));
    for want in [
        "berth_announced_addresses 0",
        "berth_drain_state{state=\"announced\"} 0",
        "berth_drain_state{state=\"not_ready\"} 1",
        r#"berth_drain_reason{state="not_ready",reason="disk \"full\""} 1"#,
    ] {
        assert!(
            withdrawn.lines().any(|l| l == want),
            "no {want:?} in:\n{withdrawn}"
        );
    }
    let before = encode(&Published::default(), Detail::Aggregate);
    assert!(
        !before.contains("berth_drain_state"),
        "nothing before a decision"
    );
}

#[test]
fn conntrack_occupancy_and_evictions_are_published_with_the_datapath_counters() {
    let p = Published {
        counters: [("flood_untracked", 3), ("ct_created", 5000)]
            .into_iter()
            .collect(),
        conntrack: Some(crate::publish::Conntrack {
            entries: 1000,
            capacity: 1024,
            created: 5000,
            evictions: 4000,
            ..Default::default()
        }),
        ..Published::default()
    };
    let text = encode(&p, Detail::PerRoute);
    for want in [
        "# TYPE berth_conntrack_entries gauge",
        "berth_conntrack_entries 1000",
        "# TYPE berth_conntrack_capacity gauge",
        "berth_conntrack_capacity 1024",
        "# TYPE berth_conntrack_evictions_total counter",
        "berth_conntrack_evictions_total 4000",
        "berth_datapath_packets_total{reason=\"flood_untracked\"} 3",
    ] {
        assert!(text.lines().any(|l| l == want), "no {want:?} in:\n{text}");
    }
    assert!(
        text.contains("# HELP berth_conntrack_evictions_total Estimated"),
        "{text}"
    );
    // Without a datapath there is no conntrack to describe.
    let text = encode(&Published::default(), Detail::Aggregate);
    assert!(!text.contains("berth_conntrack"), "{text}");
}

/// The TCP service of gateway address 10.0.0.`addr` on `port`.
fn service(addr: u8, port: u16) -> crate::datapath::ServiceAddr {
    crate::datapath::ServiceAddr {
        addr: std::net::Ipv4Addr::new(10, 0, 0, addr).into(),
        protocol: crate::datapath::Protocol::Tcp,
        port,
    }
}

/// TCPRoute team/`name`.
fn route(name: &str) -> std::sync::Arc<crate::model::RouteKey> {
    std::sync::Arc::new(crate::model::RouteKey {
        kind: crate::model::RouteKind::Tcp,
        namespace: "team".into(),
        name: name.into(),
    })
}

#[test]
fn each_family_has_its_samples_together_with_many_routes() {
    use std::collections::BTreeSet;

    // The hand-written text wrote each route's samples of every family in turn,
    // after all six HELP and TYPE lines: a family's samples must be one group.
    let service = |port| service(1, port);
    let p = Published {
        owners: [(service(1), route("a")), (service(2), route("b"))]
            .into_iter()
            .collect(),
        // Read, and neither service counted anything (so neither is listed).
        traffic_at: Some(std::time::Instant::now()),
        ..Published::default()
    };
    let text = encode(&p, Detail::PerRoute);
    let mut seen = BTreeSet::new();
    let mut last = "";
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let name = line.split(['{', ' ']).next().unwrap_or_default();
        if name != last {
            assert!(
                seen.insert(name),
                "{name}'s samples are not together:\n{text}"
            );
            last = name;
        }
    }
    assert!(
        text.lines().any(|l| l
            == "berth_route_packets_total{kind=\"TCPRoute\",namespace=\"team\",name=\"b\",\
                address=\"10.0.0.1\",port=\"2\",direction=\"reply\"} 0"),
        "{text}"
    );
}

#[test]
fn by_default_traffic_is_summed_per_address_without_a_series_per_route() {
    use std::sync::Arc;

    use crate::datapath::Traffic;
    let traffic = |packets, active_flows| {
        let mut t = Traffic {
            active_flows,
            ..Traffic::default()
        };
        t.stats.packets = packets;
        t
    };
    let services = [service(1, 1), service(1, 2), service(2, 1)];
    let p = Published {
        owners: services
            .iter()
            .zip(["a", "b", "c"])
            .map(|(s, name)| (*s, route(name)))
            .collect(),
        traffic: Arc::new(
            services
                .iter()
                .zip([traffic(3, 1), traffic(4, 2), traffic(5, 0)])
                .map(|(s, t)| (*s, t))
                .collect(),
        ),
        traffic_at: Some(std::time::Instant::now()),
        ..Published::default()
    };
    let text = encode(&p, Detail::Aggregate);
    for want in [
        "# TYPE berth_address_routes gauge",
        "berth_address_routes{address=\"10.0.0.1\",protocol=\"TCP\"} 2",
        "berth_address_routes{address=\"10.0.0.2\",protocol=\"TCP\"} 1",
        "# TYPE berth_address_packets_total counter",
        "berth_address_packets_total{address=\"10.0.0.1\",protocol=\"TCP\",direction=\"forward\"} 7",
        "berth_address_packets_total{address=\"10.0.0.2\",protocol=\"TCP\",direction=\"forward\"} 5",
        "berth_address_active_flows{address=\"10.0.0.1\",protocol=\"TCP\"} 3",
        "berth_address_unanswered_routes{address=\"10.0.0.1\",protocol=\"TCP\"} 0",
    ] {
        assert!(text.lines().any(|l| l == want), "no {want:?} in:\n{text}");
    }
    assert!(!text.contains("berth_route_"), "{text}");
    // With the flag, the per-route series come besides the sums.
    let text = encode(&p, Detail::PerRoute);
    assert!(text.contains("berth_address_packets_total{"), "{text}");
    assert!(text.contains("berth_route_packets_total{"), "{text}");
}
