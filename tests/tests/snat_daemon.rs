//! SNAT mode end to end with the real daemon: `berth run` on the example manifests
//! with `sourceNAT: true` in the GatewayConfig, in a network where the backends have
//! no route back to the client (only their own subnet), so that only SNAT mode can
//! serve them. Needs root.

use std::{net::SocketAddrV4, net::TcpStream, time::Duration};

use berth_tests::{
    daemon::{metrics, sample, Daemon, Dirs},
    netns::poll,
    topo::{http_get, http_request, kept_alive, tcp_peers, Topology, GW, HTTP_PORT},
};

/// Team A's TCPRoute gets the first port of the example's TCP range.
const WEB_PORT: u16 = 30000;

/// The example Gateway and team A's web route (backends 1 and 2), in SNAT mode.
fn snat_manifests() -> Dirs {
    let dirs = Dirs::with_example_files(&["gateway.yaml", "team-a.yaml"]);
    dirs.edit_manifest(
        "gateway.yaml",
        "  releaseCooldown: 300s\n",
        "  releaseCooldown: 300s\n  sourceNAT: true\n",
    );
    dirs
}

/// The peer addresses of the connections established to nginx in `ns`.
fn nginx_peers(ns: &berth_tests::netns::Netns) -> Vec<String> {
    tcp_peers(ns, HTTP_PORT)
}

#[test]
fn a_snat_gateway_serves_backends_without_a_route_back_and_counts_snat_flows() {
    let topo = Topology::new(2);
    // The backends reach only their own subnet: replies to the client's address have
    // nowhere to go, replies to the gateway's address on their link do.
    for b in &topo.backends {
        b.ip(&["route", "del", "default"]);
    }
    let servers = topo.start_servers();
    let dirs = snat_manifests();
    let daemon = Daemon::start(&topo, &dirs);
    let web = SocketAddrV4::new(GW, WEB_PORT);

    let row = poll(
        "the web route in SNAT mode",
        Duration::from_secs(10),
        || {
            let rows = daemon.route_values(&topo.gateway);
            rows.into_iter()
                .find(|r| r["namespace"] == "team-a" && r["mode"] == "snat")
                .ok_or_else(|| "no team-a route with mode snat".to_string())
        },
    );
    assert_eq!(row["port"], WEB_PORT, "{row}");

    // curl, as a client would.
    let url = format!("http://{web}/");
    let body = poll(
        "curl through the SNAT gateway",
        Duration::from_secs(10),
        || {
            let out = topo
                .client
                .try_exec(&["curl", "-sS", "--max-time", "2", &url]);
            if out.status.success() {
                Ok(String::from_utf8_lossy(&out.stdout).to_string())
            } else {
                Err(String::from_utf8_lossy(&out.stderr).to_string())
            }
        },
    );
    assert!(
        body == "backend-1\n" || body == "backend-2\n",
        "the web port answered {body:?}"
    );
    // Both backends serve (the flows are balanced over both).
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..40 {
        if let Ok(b) = topo.client.enter(|| http_get(web)) {
            seen.insert(b);
        }
    }
    assert_eq!(seen.len(), 2, "answers from {seen:?}");

    // A kept-open connection: the backend sees the gateway's address on its link, and
    // the route counts it as an active SNAT flow.
    let (mut conn, body) = kept_alive(&topo.client, web);
    assert!(body.starts_with("backend-"), "{body:?}");
    let peers: Vec<String> = topo.backends.iter().flat_map(nginx_peers).collect();
    assert!(!peers.is_empty(), "no connection established at a backend");
    for p in &peers {
        assert!(
            p.starts_with("10.251.11.1:") || p.starts_with("10.251.12.1:"),
            "a backend sees {p}, not the gateway's address on its link"
        );
    }
    let snat_flows = poll(
        "an active SNAT flow counted",
        Duration::from_secs(30),
        || {
            // Keep the connection busy: it stays active whatever the refresh period.
            http_request(&mut conn).map_err(|e| format!("kept-alive GET: {e}"))?;
            let rows = daemon.route_values(&topo.gateway);
            let row = rows
                .iter()
                .find(|r| r["namespace"] == "team-a")
                .ok_or_else(|| "no team-a route".to_string())?;
            match row["snat_flows"].as_u64() {
                Some(n) if n >= 1 => Ok(n),
                other => Err(format!("snat_flows {other:?} in {row}")),
            }
        },
    );
    assert!(snat_flows >= 1);
    // /metrics names the SNAT counters and the route's active SNAT flows.
    let m = metrics(&topo.gateway);
    let new_flows = sample(&m, "berth_datapath_packets_total{reason=\"snat_new_flow\"}");
    assert!(new_flows >= Some(1), "snat_new_flow {new_flows:?}");
    // These veths take no XDP frames: the kernel forwards, TC gives the source.
    let masq = sample(
        &m,
        "berth_datapath_packets_total{reason=\"tc_masq_translated\"}",
    );
    assert!(masq >= Some(1), "tc_masq_translated {masq:?}");
    for reason in [
        "snat_port_retry",
        "drop_snat_ports_exhausted",
        "drop_snat_no_source",
    ] {
        let series = format!("berth_datapath_packets_total{{reason=\"{reason}\"}}");
        assert!(sample(&m, &series).is_some(), "no {series} in /metrics");
    }
    assert!(
        m.lines()
            .any(|l| l.starts_with("berth_address_snat_flows{") && !l.ends_with(" 0")),
        "no berth_address_snat_flows sample above 0 in /metrics"
    );
    drop(conn);

    // The gateway's address toward backend 1 changes: the daemon follows it (it asks
    // again every few seconds), and new flows to backend 1 come from the new address.
    // (Deleting a primary address deletes its secondaries: delete first, then add.)
    topo.gateway
        .ip(&["addr", "del", "10.251.11.1/24", "dev", "b1"]);
    topo.gateway
        .ip(&["addr", "add", "10.251.11.9/24", "dev", "b1"]);
    let peer = poll(
        "a new flow to backend 1 from the gateway's new address",
        Duration::from_secs(30),
        || {
            let mut s = topo
                .client
                .enter(|| TcpStream::connect_timeout(&web.into(), Duration::from_secs(1)))
                .map_err(|e| format!("connect: {e}"))?;
            s.set_read_timeout(Some(Duration::from_secs(1)))
                .map_err(|e| e.to_string())?;
            let body = http_request(&mut s).map_err(|e| format!("GET: {e}"))?;
            if body != "backend-1\n" {
                return Err(format!("answered by {body:?}"));
            }
            nginx_peers(&topo.backends[0])
                .into_iter()
                .find(|p| p.starts_with("10.251.11.9:"))
                .ok_or_else(|| "backend 1 sees no connection from 10.251.11.9".to_string())
        },
    );
    assert!(peer.starts_with("10.251.11.9:"), "{peer}");
    drop(daemon);
    drop(dirs);
    drop(servers);
}
