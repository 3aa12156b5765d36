//! Source NAT: the services of a Gateway in SNAT mode, and the SNAT ports left by
//! every listener.

use std::{net::Ipv4Addr, ops::RangeInclusive};

use super::test_support::{
    find, gateway, gateway_status, owner, plan_for, plan_of, route, ALL, CLASS,
};
use super::*;
use crate::{datapath::Capacity, model::Protocol};

/// The plan with `snat_ports` as the configured SNAT source ports.
fn plan_snat<'c>(
    text: &str,
    claims: impl IntoIterator<Item = &'c Arc<PortClaim>>,
    snat_ports: RangeInclusive<u16>,
) -> Plan {
    plan_for(text, claims, snat_ports, Capacity::default())
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
