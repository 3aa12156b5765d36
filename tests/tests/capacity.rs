//! A datapath with less room than the routes (`berth run --max-services`), with the
//! real daemon and real traffic through namespaces: the oldest routes that fit are
//! served, the others keep their ports and say why (status, `berth get routes`,
//! `/metrics`), the daemon stays ready, a route leaving lets a waiting one in, and a
//! restart asking for another size is refused naming the option. Needs root.

use std::{net::SocketAddrV4, time::Duration};

use berth::admin::RouteRow;
use berth_tests::{
    daemon::{metrics, sample, Daemon, Dirs},
    netns::{wait_until, Netns},
    topo::{dns_whoami_from, http_get, Topology, GW},
};

const WAITING: &str = "berth_routes_waiting_for_capacity{limit=\"services\"}";

/// Example file `file` of namespace `ns`, moved to namespace `to`, its route (the
/// first object of the namespace) created at `created`.
fn example(file: &str, ns: &str, to: &str, created: &str) -> String {
    let text = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../examples")
            .join(file),
    )
    .expect("example");
    text.replace(ns, to).replacen(
        &format!("namespace: {to}\n"),
        &format!("namespace: {to}\n  creationTimestamp: \"{created}\"\n"),
        1,
    )
}

fn row<'a>(rows: &'a [RouteRow], ns: &str) -> &'a RouteRow {
    rows.iter()
        .find(|r| r.namespace == ns)
        .unwrap_or_else(|| panic!("no route in {ns}: {rows:?}"))
}

/// The body of a GET to the gateway address's `port` from the client (empty when it
/// fails: a port no route is served on is answered by the gateway's own stack).
fn web(topo: &Topology, port: u16) -> String {
    topo.client
        .enter(|| http_get(SocketAddrV4::new(GW, port)))
        .unwrap_or_default()
}

fn dns_answers(topo: &Topology) -> bool {
    topo.client
        .enter(|| dns_whoami_from(SocketAddrV4::new(GW, 30053), Duration::from_secs(1)))
        .is_some()
}

/// The conditions of route `ns`'s first parent in `/api/v1/state`.
fn conditions(gateway: &Netns, ns: &str) -> Vec<serde_json::Value> {
    let text = gateway
        .enter(|| berth::admin::get("127.0.0.1:9470", "/api/v1/state"))
        .expect("GET /api/v1/state");
    let doc: serde_json::Value = serde_json::from_str(&text).expect("state JSON");
    let route = doc["routes"]
        .as_array()
        .expect("routes")
        .iter()
        .find(|r| r["namespace"] == ns)
        .unwrap_or_else(|| panic!("no route in {ns}: {text}"))
        .clone();
    route["status"]["parents"][0]["conditions"]
        .as_array()
        .expect("conditions")
        .clone()
}

#[test]
fn routes_beyond_max_services_wait_with_their_ports_and_a_route_leaving_lets_one_in() {
    let topo = Topology::new(3);
    let _servers = topo.start_servers();
    let dirs = Dirs::with_example_files(&["gateway.yaml"]);
    // Oldest first: team A's web (TCP), team B's DNS (UDP, port 30053), team C's web
    // (TCP, a copy of team A's): with room for two services, team C waits.
    for (file, ns, to, created) in [
        ("team-a.yaml", "team-a", "team-a", "2024-01-01T00:00:00Z"),
        ("team-b.yaml", "team-b", "team-b", "2024-02-01T00:00:00Z"),
        ("team-a.yaml", "team-a", "team-c", "2024-03-01T00:00:00Z"),
    ] {
        let text = example(file, ns, to, created);
        std::fs::write(dirs.manifests.join(format!("{to}.yaml")), text).expect("write");
    }
    let args = ["--max-services", "2"];
    let mut daemon = Daemon::start_with(&topo.gateway, &topo.gateway_ifaces, &dirs, &args);
    wait_until("every route planned", Duration::from_secs(10), || {
        daemon.routes(&topo.gateway).len() == 3
    });
    let rows = daemon.routes(&topo.gateway);
    eprintln!("{}", berth::output::route_table(&rows));
    // Every route has its port: team C's claim is held while it waits.
    let (a, b, c) = (
        row(&rows, "team-a"),
        row(&rows, "team-b"),
        row(&rows, "team-c"),
    );
    assert_eq!(
        (a.port, b.port, c.port),
        (Some(30000), Some(30053), Some(30001))
    );
    for r in [a, b] {
        assert_eq!(r.warning, None, "{r:?}");
        assert!(r.backends > 0, "{r:?}");
    }
    assert!(c.accepted.starts_with("True"), "{c:?}");
    assert_eq!(c.backends, 0, "{c:?}");
    let warning = c.warning.as_deref().unwrap_or_default();
    assert!(
        warning.contains("not programmed")
            && warning.contains("at most 2 services")
            && warning.contains("--max-services"),
        "{c:?}"
    );
    let programmed: Vec<_> = conditions(&topo.gateway, "team-c")
        .into_iter()
        .filter(|c| c["type"] == "Programmed")
        .collect();
    assert_eq!(programmed.len(), 1, "{programmed:?}");
    assert_eq!(programmed[0]["status"], "False");
    assert_eq!(programmed[0]["reason"], "DatapathFull");
    assert!(
        conditions(&topo.gateway, "team-a")
            .iter()
            .all(|c| c["type"] != "Programmed"),
        "a route served has no Programmed condition"
    );
    // Ready, and counted.
    let ready = topo
        .gateway
        .enter(|| berth::admin::get("127.0.0.1:9470", "/readyz"));
    assert_eq!(ready.ok().as_deref(), Some("ready\n"));
    assert_eq!(sample(&metrics(&topo.gateway), WAITING), Some(1));
    // The routes served carry traffic; the waiting route's port is not served.
    assert!(
        web(&topo, 30000).starts_with("backend-"),
        "team A is served"
    );
    assert!(dns_answers(&topo), "team B is served");
    assert_eq!(web(&topo, 30001), "", "team C waits");

    // Team A leaves: team C is served on the port it kept.
    std::fs::remove_file(dirs.manifests.join("team-a.yaml")).expect("remove");
    wait_until("team C to be served", Duration::from_secs(10), || {
        let rows = daemon.routes(&topo.gateway);
        rows.iter().all(|r| r.namespace != "team-a") && row(&rows, "team-c").backends > 0
    });
    let rows = daemon.routes(&topo.gateway);
    let c = row(&rows, "team-c");
    assert_eq!((c.port, c.warning.as_deref()), (Some(30001), None), "{c:?}");
    assert!(
        conditions(&topo.gateway, "team-c")
            .iter()
            .all(|c| c["type"] != "Programmed"),
        "team C no longer says it waits"
    );
    assert_eq!(sample(&metrics(&topo.gateway), WAITING), Some(0));
    assert!(
        web(&topo, 30001).starts_with("backend-"),
        "team C is served"
    );
    assert!(dns_answers(&topo), "team B is still served");

    // A restart asking for another size is refused, naming the option and the size
    // the maps were pinned with; the same size adopts them.
    daemon.kill9();
    let stderr = dirs.refused_start(&topo, &["--max-services", "3"]);
    for want in [
        "berth_services",
        "holds 2 services",
        "asked for 3",
        "--max-services 2",
    ] {
        assert!(stderr.contains(want), "no {want:?} in:\n{stderr}");
    }
    assert!(
        web(&topo, 30001).starts_with("backend-"),
        "the pinned datapath serves on"
    );
    let daemon = Daemon::start_with(&topo.gateway, &topo.gateway_ifaces, &dirs, &args);
    let rows = daemon.routes(&topo.gateway);
    assert_eq!(row(&rows, "team-c").warning, None, "{rows:?}");
    assert!(web(&topo, 30001).starts_with("backend-"));
}
