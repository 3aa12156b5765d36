use super::*;
use crate::{
    planner::{status::*, GatewayEntry},
    state_document::StateDocument,
};

#[test]
fn the_claims_table_tells_a_cooling_claim_from_a_bound_one() {
    use crate::model::{ClaimPhase, ClaimRoute, PortClaim, PortClaimSpec, PortClaimStatus};
    let claim = |port: u16, released_at: Option<&str>| {
        let mut c = PortClaim::bound(
            "infra",
            PortClaimSpec {
                gateway: "shared".into(),
                listener: "tcp-pool".into(),
                protocol: "TCP".into(),
                port,
                route: ClaimRoute {
                    group: "gateway.networking.k8s.io".into(),
                    kind: "TCPRoute".into(),
                    namespace: "team-a".into(),
                    name: format!("r{port}").into(),
                    uid: None,
                },
            },
        );
        if let Some(at) = released_at {
            c.status = Some(PortClaimStatus {
                phase: ClaimPhase::Released,
                released_at: crate::model::Time::parse(at),
            });
        }
        std::sync::Arc::new(c)
    };
    let table = claim_table(&imbl::vector![
        claim(30000, None),
        claim(30001, Some("2026-12-05T10:00:00Z")),
    ]);
    let rows: Vec<&str> = table.lines().collect();
    assert!(rows[0].contains("STATE"), "{table}");
    assert!(
        rows[1].contains(" Bound ") && !rows[1].contains("cooling"),
        "{table}"
    );
    assert!(
        rows[2].contains(" Released ")
            && rows[2].contains("(released 2026-12-05T10:00:00Z, cooling down)"),
        "{table}"
    );
    // The JSON keeps the phase; a bound claim has no release time.
    let released = claim(30001, Some("2026-12-05T10:00:00Z"));
    let json = serde_json::to_value(ClaimView::of(&released)).expect("json");
    assert_eq!(json["phase"], "Released");
    assert_eq!(json["releasedAt"], "2026-12-05T10:00:00Z");
    let json = serde_json::to_value(ClaimView::of(&claim(30000, None))).expect("json");
    assert_eq!(json["phase"], "Bound");
    assert!(json.get("releasedAt").is_none());
}

#[test]
fn the_gateways_table_shows_ipv4_and_ipv6_addresses_as_written_in_the_status() {
    let address = |value: &str| GatewayStatusAddress {
        kind: "IPAddress".into(),
        value: value.into(),
    };
    let gateway = |name: &str, addresses| GatewayEntry {
        namespace: "infra".into(),
        name: name.into(),
        status: GatewayStatus {
            addresses,
            conditions: Vec::new(),
            listeners: Vec::new(),
        },
    };
    let doc = StateDocument {
        gateways: vec![
            gateway("dual", vec![address("10.0.0.1"), address("2001:db8::1")]),
            gateway("none", vec![]),
        ],
        routes: Default::default(),
        claims: Default::default(),
        policies: Vec::new(),
    };
    let table = state_tables(&doc);
    let lines: Vec<&str> = table.lines().collect();
    assert!(lines[0].contains(" ADDRESSES "), "{table}");
    assert!(lines[1].contains(" 10.0.0.1,2001:db8::1 "), "{table}");
    assert!(lines[2].contains(" - "), "{table}");
}

fn status(state: crate::announce::State, addresses: &[&str]) -> Status {
    let reason = (!state.announcing()).then_some("addresses withdrawn by berth drain");
    Status::example(state, reason, addresses)
}

#[test]
fn drain_and_undrain_say_what_they_withdrew_or_announced_and_where() {
    use crate::announce::State::{Announced, Draining, NotReady};
    let both = ["10.0.0.1", "2001:db8::1"];
    let now = humantime::parse_rfc3339(crate::announce::EXAMPLE_SINCE).unwrap()
        + std::time::Duration::from_secs(12);
    let said = |r, before: &Status, after: &Status| drain_result(r, before, after, now);
    let (up, down) = (status(Announced, &both), status(Draining, &[]));
    assert_eq!(
        said(Request::Drain, &up, &down),
        "drained: withdrew 10.0.0.1, 2001:db8::1 (berth0, table 100); the datapath keeps \
         serving flows that still arrive (drained after --drain-timeout 30s)"
    );
    assert!(said(Request::Drain, &down, &down).starts_with(
        "drained: nothing more to withdraw (draining: addresses withdrawn by berth drain 12s ago)"
    ));
    assert_eq!(
        said(Request::Undrain, &down, &up),
        "undrained: announced 10.0.0.1, 2001:db8::1 (berth0, table 100)"
    );
    let mut still = status(NotReady, &[]);
    still.reason = Some("not ready (disk full)".into());
    assert_eq!(
        said(Request::Undrain, &down, &still),
        "undrained, but the addresses stay withdrawn: withdrawn-not-ready: not ready (disk \
         full) 12s ago"
    );
}
