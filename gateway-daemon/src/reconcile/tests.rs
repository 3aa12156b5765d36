//! `reconcile_once` over a claim store in memory: races, readers, a store that never
//! settles and a sink that fails, without files or an API server.

use std::{path::Path, sync::Arc};

use super::*;
use crate::{
    manifests,
    model::{ClaimRoute, PortClaim, PortClaimSpec, RouteKind},
};

const OBJECTS: &str = "\
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {name: berth}
spec: {controllerName: berth.dev/gateway-controller}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: gw, namespace: infra, creationTimestamp: \"2026-01-01T00:00:00Z\"}
spec:
  gatewayClassName: berth
  addresses: [{value: 10.0.0.1}]
  infrastructure:
    parametersRef: {group: berth.dev, kind: GatewayConfig, name: gw}
  listeners:
  - {name: pool, protocol: TCP, port: 30000, allowedRoutes: {namespaces: {from: All}}}
---
apiVersion: berth.dev/v1alpha1
kind: GatewayConfig
metadata: {name: gw, namespace: infra}
spec: {listeners: [{name: pool, endPort: 30009}]}
---
apiVersion: gateway.networking.k8s.io/v1
kind: TCPRoute
metadata: {name: app, namespace: team, creationTimestamp: \"2026-01-01T00:01:00Z\"}
spec:
  parentRefs: [{name: gw, namespace: infra}]
";

/// Claims in memory; the first `races` commits find a claim of port 30000 created by
/// another writer meanwhile.
#[derive(Default)]
struct Memory {
    claims: ClaimList,
    reader: bool,
    races: usize,
    reads: usize,
    commits: usize,
}

impl ClaimStore for Memory {
    type Error = &'static str;

    async fn read(&mut self) -> Result<Read, Self::Error> {
        self.reads += 1;
        Ok(Read {
            claims: self.claims.clone(),
            allocate: !self.reader,
        })
    }

    async fn commit(&mut self, _: Read, plan: &Plan) -> Result<Committed, Self::Error> {
        self.commits += 1;
        if self.races > 0 {
            self.races -= 1;
            let route = ClaimRoute::new(RouteKind::Tcp, "other", "thief", None);
            let taken = PortClaim::bound(
                "infra",
                PortClaimSpec::new("gw", "pool", "TCP", 30000, route),
            );
            self.claims.push_back(Arc::new(taken));
            return Ok(Committed::Raced("infra/gw-tcp-30000".into()));
        }
        self.claims = plan.claims.clone();
        Ok(Committed::Done)
    }
}

/// Counts the plans whose statuses it was given; fails when asked to.
#[derive(Default)]
struct Sink {
    writes: usize,
    fail: bool,
}

impl StatusSink for Sink {
    type Error = &'static str;

    async fn write(&mut self, _: &Plan) -> Result<(), Self::Error> {
        self.writes += 1;
        if self.fail {
            return Err("status write refused");
        }
        Ok(())
    }
}

fn run(
    store: &mut Memory,
    sink: &mut Sink,
) -> Result<Plan, ReconcileError<&'static str, &'static str>> {
    let parsed = manifests::parse_file(Path::new("objects.yaml"), OBJECTS);
    assert!(parsed.errors.is_empty(), "{:?}", parsed.errors);
    let snapshot = manifests::snapshot([&parsed]);
    let settings = planner::Settings::default();
    let cycle = Cycle {
        snapshot: &snapshot,
        now: humantime::parse_rfc3339("2026-01-01T01:00:00Z").expect("time"),
        settings: &settings,
        ephemeral_ports: None,
        health: Vec::new(),
    };
    now(reconcile_once(
        cycle,
        &mut planner::Memo::default(),
        store,
        sink,
    ))
}

/// The port `app` holds among `claims`.
fn port_of_app(claims: &ClaimList) -> Option<u16> {
    claims
        .iter()
        .find(|c| c.spec.route.name.as_str() == "app" && !c.is_released())
        .map(|c| c.spec.port)
}

#[test]
fn a_claim_taken_meanwhile_is_read_again_and_the_route_planned_around_it() {
    let (mut store, mut sink) = (
        Memory {
            races: 1,
            ..Memory::default()
        },
        Sink::default(),
    );
    let plan = run(&mut store, &mut sink).expect("cycle");
    assert_eq!((store.reads, store.commits, sink.writes), (2, 2, 1));
    assert_eq!(
        port_of_app(&plan.claims),
        Some(30001),
        "30000 was taken by the other writer"
    );
    assert_eq!(port_of_app(&store.claims), Some(30001));
}

#[test]
fn a_reader_plans_over_the_stored_claims_and_writes_nothing() {
    let (mut store, mut sink) = (
        Memory {
            reader: true,
            ..Memory::default()
        },
        Sink::default(),
    );
    let plan = run(&mut store, &mut sink).expect("cycle");
    assert_eq!((store.reads, store.commits, sink.writes), (1, 0, 0));
    assert_eq!(port_of_app(&plan.claims), None, "a reader assigns no port");
}

#[test]
fn claims_that_never_settle_end_the_cycle_unsettled_with_no_status_written() {
    let mut store = Memory {
        races: usize::MAX,
        ..Memory::default()
    };
    let mut sink = Sink::default();
    let err = run(&mut store, &mut sink).expect_err("never settles");
    assert!(matches!(err, ReconcileError::Unsettled(_)), "{err:?}");
    assert_eq!(
        (store.reads, store.commits, sink.writes),
        (MAX_RACES, MAX_RACES, 0)
    );
}

#[test]
fn a_status_that_cannot_be_written_fails_the_cycle_after_the_claims_are_stored() {
    let mut store = Memory::default();
    let mut sink = Sink {
        fail: true,
        ..Sink::default()
    };
    let err = run(&mut store, &mut sink).expect_err("status refused");
    assert!(
        matches!(err, ReconcileError::Status("status write refused")),
        "{err:?}"
    );
    assert_eq!(port_of_app(&store.claims), Some(30000));
}
