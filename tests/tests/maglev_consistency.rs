//! Gateways behind ECMP share no state: a flow that moves to another gateway reaches
//! the same backend only because every gateway's Maglev table for the service is the
//! same. Two daemons are fed the same objects in different files, orders and
//! histories (endpoints added and removed one way on one node, all at once on the
//! other, a restart in between), and their pinned tables must map every slot to the
//! same backend endpoint. Needs root.

use std::{collections::BTreeMap, net::SocketAddr, time::Duration};

use berth::datapath::{pinned_tables, ServiceAddr};
use berth_tests::{
    daemon::{Daemon, Dirs},
    netns::{poll, Netns},
};

const GATEWAY: &str = "apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {name: berth}
spec: {controllerName: berth.dev/gateway-controller}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: shared, namespace: infra}
spec:
  gatewayClassName: berth
  addresses: [{type: IPAddress, value: 10.253.0.100}, {type: IPAddress, value: 'fd00:253::100'}]
  infrastructure:
    parametersRef: {group: berth.dev, kind: GatewayConfig, name: shared-l4}
  listeners:
  - {name: tcp-pool, protocol: TCP, port: 30000, allowedRoutes: {namespaces: {from: All}}}
  - {name: udp-pool, protocol: UDP, port: 30000, allowedRoutes: {namespaces: {from: All}}}
---
apiVersion: berth.dev/v1alpha1
kind: GatewayConfig
metadata: {name: shared-l4, namespace: infra}
spec:
  listeners:
  - {name: tcp-pool, endPort: 30999}
  - {name: udp-pool, endPort: 30999}
";

/// Team A's route: two Services weighted 1:3, static port 30080.
const ROUTE: &str = "apiVersion: gateway.networking.k8s.io/v1
kind: TCPRoute
metadata: {name: web, namespace: team-a}
spec:
  parentRefs: [{name: shared, namespace: infra, port: 30080}]
  rules: [{backendRefs: [{name: web, port: 80, weight: 1}, {name: web2, port: 80, weight: 3}]}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: UDPRoute
metadata: {name: dns, namespace: team-a}
spec:
  parentRefs: [{name: shared, namespace: infra, port: 30053}]
  rules: [{backendRefs: [{name: web, port: 53}]}]
";

fn services() -> String {
    ["web", "web2"]
        .iter()
        .map(|name| {
            format!(
                "apiVersion: v1
kind: Service
metadata: {{name: {name}, namespace: team-a}}
spec: {{ports: [{{name: http, port: 80, protocol: TCP}}, {{name: dns, port: 53, protocol: UDP}}]}}
---
"
            )
        })
        .collect()
}

/// An EndpointSlice of Service `service` with the given last bytes of 10.253.1.x
/// (IPv4) or fd00:253:1::x (IPv6).
fn slice(service: &str, name: &str, v6: bool, hosts: &[u8]) -> String {
    let endpoints: Vec<String> = hosts
        .iter()
        .map(|h| {
            if v6 {
                format!("- addresses: ['fd00:253:1::{h}']")
            } else {
                format!("- addresses: [10.253.1.{h}]")
            }
        })
        .collect();
    format!(
        "apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: {name}
  namespace: team-a
  labels: {{kubernetes.io/service-name: {service}}}
addressType: {}
endpoints:
{}
ports: [{{name: http, port: 8080, protocol: TCP}}, {{name: dns, port: 5353, protocol: UDP}}]
---
",
        if v6 { "IPv6" } else { "IPv4" },
        endpoints.join("\n")
    )
}

/// A namespace with a veth pair for `berth run` to attach to.
fn node(tag: &str) -> Netns {
    let ns = Netns::new(tag);
    ns.ip(&["link", "add", "e0", "type", "veth", "peer", "name", "e1"]);
    ns.ip(&["link", "set", "e0", "up"]);
    ns.ip(&["link", "set", "e1", "up"]);
    berth_tests::topo::forward_both(&ns);
    ns
}

fn write(dirs: &Dirs, file: &str, text: &str) {
    std::fs::write(dirs.manifests.join(file), text).expect("write manifest");
}

type Tables = BTreeMap<ServiceAddr, Vec<SocketAddr>>;

/// Polls both nodes' pinned tables until they are equal and cover `services`
/// services; returns them.
fn agreed(a: &Dirs, b: &Dirs, services: usize) -> Tables {
    poll(
        "both nodes' tables to agree",
        Duration::from_secs(10),
        || {
            let ta = pinned_tables(&a.pins).map_err(|e| format!("node 1: {e}"))?;
            let tb = pinned_tables(&b.pins).map_err(|e| format!("node 2: {e}"))?;
            if ta.len() != services || tb.len() != services {
                return Err(format!("{} and {} services", ta.len(), tb.len()));
            }
            for (svc, table) in &ta {
                if tb.get(svc) != Some(table) {
                    let differ = tb
                        .get(svc)
                        .map(|t| t.iter().zip(table).filter(|(x, y)| x != y).count());
                    return Err(format!("{svc:?}: slots differing: {differ:?}"));
                }
            }
            Ok(ta)
        },
    )
}

#[test]
fn gateways_fed_the_same_objects_in_different_orders_pin_the_same_maglev_tables() {
    let (n1, n2) = (node("m1"), node("m2"));
    let (d1, d2) = (Dirs::with_example_files(&[]), Dirs::with_example_files(&[]));

    // Node 1: one file, endpoints arriving over time (hosts 1-2, then 1-4, then
    // host 1 leaving and coming back), and a restart.
    let one_file = |v4: &[u8], v6: &[u8]| {
        format!(
            "{GATEWAY}---\n{ROUTE}---\n{}{}{}{}",
            services(),
            slice("web", "web-a", false, v4),
            slice("web", "web-b", true, v6),
            slice("web2", "web2-a", false, &[7, 8]),
        )
    };
    write(&d1, "all.yaml", &one_file(&[1, 2], &[1]));
    let mut daemon1 = Daemon::start_on(&n1, &["e0"], &d1);

    // Node 2: the objects reversed across files named the other way round, the
    // endpoints listed backwards and split over more slices, all at once.
    write(&d2, "a-slices.yaml", &{
        let mut s = slice("web2", "web2-z", false, &[8, 7]);
        s += &slice("web", "web-z6", true, &[3, 2, 1]);
        s += &slice("web", "web-y", false, &[4, 3]);
        s += &slice("web", "web-x", false, &[2, 1]);
        s
    });
    write(&d2, "b-services.yaml", &services());
    write(&d2, "c-routes.yaml", ROUTE);
    write(&d2, "d-gateway.yaml", GATEWAY);
    let _daemon2 = Daemon::start_on(&n2, &["e0"], &d2);

    write(&d1, "all.yaml", &one_file(&[1, 2, 3, 4], &[1, 2, 3]));
    write(&d1, "all.yaml", &one_file(&[2, 3, 4], &[1, 2, 3]));
    // A tracked ordering of the changes: wait for host 1 to be gone before it returns.
    poll("host 1 to leave node 1", Duration::from_secs(10), || {
        let t = pinned_tables(&d1.pins).map_err(|e| e.to_string())?;
        let gone = t
            .values()
            .flatten()
            .all(|e| e.ip().to_string() != "10.253.1.1");
        gone.then_some(()).ok_or_else(|| "still there".to_string())
    });
    daemon1.kill9();
    write(&d1, "all.yaml", &one_file(&[4, 3, 2, 1], &[3, 2, 1]));
    let _daemon1 = Daemon::start_on(&n1, &["e0"], &d1);

    // TCP and UDP on both addresses: four services.
    let tables = agreed(&d1, &d2, 4);
    for (svc, table) in &tables {
        let distinct: std::collections::BTreeSet<_> = table.iter().collect();
        assert_eq!(
            table.len(),
            gateway_common::maglev_size(distinct.len() as u32) as usize,
            "{svc:?}: a table of every slot, sized by its backends"
        );
        // web has hosts 1-4 (IPv4) and 1-3 (IPv6), web2 hosts 7-8 (IPv4 only); the
        // UDP route has web alone.
        let want = match (svc.addr.is_ipv6(), svc.port) {
            (true, _) => 3,
            (false, 30080) => 6,
            (false, _) => 4,
        };
        assert_eq!(distinct.len(), want, "{svc:?}: backends {distinct:?}");
    }
}
