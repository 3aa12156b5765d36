//! Cases that once said nothing (issue 31), each where the operator looks: native XDP
//! on an interface whose MTU its driver cannot take in one page (a 9000-byte MTU on a
//! veth) is refused naming the MTU and the way out, where the kernel said only
//! "Numerical result out of range"; a route given a port a host process listens on says
//! so in `berth get routes`; a restart asking for native XDP over a link an earlier run
//! attached in generic mode says it stays generic; a SNAT route whose backends are
//! reached out of an interface that is no `--interface` gets Berth's programs there
//! (its traffic was sent with the client's source, its replies found no socket).
//! Needs root.

use std::{
    collections::BTreeSet,
    net::{SocketAddrV4, TcpListener},
    time::Duration,
};

use berth_tests::{
    daemon::{Daemon, Dirs},
    netns::{poll, wait_until, Netns},
    topo::{http_get, http_request, kept_alive, tcp_peers, Topology, GW, HTTP_PORT},
};

#[test]
fn native_xdp_on_an_interface_with_a_9000_byte_mtu_is_refused_naming_the_mtu() {
    let topo = Topology::new(1);
    // Both ends: the kernel checks the peer's MTU, the largest frame that can arrive.
    topo.gateway.ip(&["link", "set", "c0", "mtu", "9000"]);
    topo.client.ip(&["link", "set", "eth0", "mtu", "9000"]);
    let dirs = Dirs::with_examples();
    let stderr = dirs.refused_start(&topo, &["--xdp-mode", "native"]);
    assert!(
        stderr.contains("interface c0 in native mode: its MTU (9000;")
            && stderr.contains("--xdp-mode skb"),
        "{stderr}"
    );
}

#[test]
fn a_route_on_a_port_a_host_process_listens_on_says_so() {
    let topo = Topology::new(2);
    let _servers = topo.start_servers();
    let dirs = Dirs::with_examples();
    // A host process of the gateway listens on team A's port (30000) on every address.
    let _host = topo
        .gateway
        .enter(|| TcpListener::bind("0.0.0.0:30000").expect("listen"));
    let daemon = Daemon::start(&topo, &dirs);
    let want = "a host process listens on TCP 0.0.0.0:30000";
    wait_until(
        "team A's route to say a host process listens on its port",
        Duration::from_secs(30),
        || {
            daemon.routes(&topo.gateway).iter().any(|r| {
                r.namespace == "team-a" && r.warning.as_deref().is_some_and(|w| w.contains(want))
            })
        },
    );
    let dns = daemon
        .routes(&topo.gateway)
        .into_iter()
        .find(|r| r.namespace == "team-b")
        .expect("team B's route");
    assert!(
        dns.warning
            .as_deref()
            .is_none_or(|w| !w.contains("host process")),
        "{dns:?}"
    );
    drop(daemon);
}

#[test]
fn a_restart_asking_native_xdp_over_a_generic_attach_says_it_stays_generic() {
    let topo = Topology::new(1);
    let dirs = Dirs::with_examples();
    let first = Daemon::start_with(
        &topo.gateway,
        &topo.gateway_ifaces,
        &dirs,
        &["--xdp-mode", "skb"],
    );
    // Killed by PID: the links stay pinned, as after a crash or an upgrade.
    drop(first);
    let log = std::env::temp_dir().join(format!("{}.log", berth_tests::netns::unique("native")));
    let child = dirs
        .berth_run(&topo.gateway)
        .args(["--xdp-mode", "native", "--admin-addr", "127.0.0.1:9479"])
        .args(
            topo.gateway_ifaces
                .iter()
                .flat_map(|i| ["--interface", i.as_str()]),
        )
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log file"))
        .spawn()
        .expect("berth run");
    let _second = berth_tests::netns::Proc::from_child(child, "berth run");
    let said = || std::fs::read_to_string(&log).unwrap_or_default();
    let want = "--xdp-mode native asked, but an earlier run attached this interface in generic";
    wait_until(
        "the restart to say the mode stays generic",
        Duration::from_secs(20),
        || said().contains(want),
    );
    let _ = std::fs::remove_file(&log);
    // And it does: the kernel lists a generic program on the interface.
    let link = topo
        .gateway
        .ip(&["-d", "link", "show", &topo.gateway_ifaces[0]]);
    assert!(
        String::from_utf8_lossy(&link.stdout).contains("xdpgeneric"),
        "{link:?}"
    );
}

/// Whether `iface` in `ns` runs an XDP program (`ip -d link` lists it).
fn runs_xdp(ns: &Netns, iface: &str) -> bool {
    let link = ns.ip(&["-d", "link", "show", iface]);
    String::from_utf8_lossy(&link.stdout).contains("prog/xdp")
}

#[test]
fn a_snat_route_whose_backends_are_reached_out_of_an_unlisted_interface_gets_the_programs_there() {
    let topo = Topology::new(2);
    // The backends reach only their own subnet: only SNAT serves them, and only where
    // Berth's programs give their packets the node's source and take the replies back.
    for b in &topo.backends {
        b.ip(&["route", "del", "default"]);
    }
    let _servers = topo.start_servers();
    let dirs = Dirs::with_example_files(&["gateway.yaml", "team-a.yaml"]);
    let snat_on = "  releaseCooldown: 300s\n  sourceNAT: true\n";
    dirs.edit_manifest("gateway.yaml", "  releaseCooldown: 300s\n", snat_on);
    // Only the client's side is given: the backends are reached out of the others.
    let backend_sides = &topo.gateway_ifaces[1..];
    let mut daemon = Daemon::start_on(&topo.gateway, &topo.gateway_ifaces[..1], &dirs);
    wait_until(
        "the programs on the interfaces SNAT traffic leaves out of",
        Duration::from_secs(30),
        || backend_sides.iter().all(|i| runs_xdp(&topo.gateway, i)),
    );
    let web = SocketAddrV4::new(GW, 30000);
    let answer = poll(
        "a request through the SNAT gateway",
        Duration::from_secs(10),
        || {
            topo.client
                .enter(|| http_get(web))
                .map_err(|e| e.to_string())
        },
    );
    assert!(answer.starts_with("backend-"), "{answer:?}");
    let mut seen = BTreeSet::new();
    for _ in 0..20 {
        let body = topo
            .client
            .enter(|| http_get(web))
            .expect("a request answered");
        seen.insert(body);
    }
    assert_eq!(seen.len(), 2, "answers from {seen:?}");

    // A connection kept open across a kill -9 and a restart: the links attached for
    // SNAT stay pinned (the restart takes them over, it does not detach them).
    let (mut conn, _) = kept_alive(&topo.client, web);
    let peers: Vec<String> = topo
        .backends
        .iter()
        .flat_map(|b| tcp_peers(b, HTTP_PORT))
        .collect();
    assert!(
        !peers.is_empty() && peers.iter().all(|p| p.starts_with("10.251.1")),
        "backends see {peers:?}, not the gateway's address on their link"
    );
    daemon.kill9();
    let pins: Vec<String> = std::fs::read_dir(dirs.pins.join("links"))
        .expect("links/")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        pins.iter().filter(|p| p.starts_with("xdp-snat@")).count() == 2
            && pins.iter().filter(|p| p.starts_with("tc-snat@")).count() == 2,
        "{pins:?}"
    );
    let daemon = Daemon::start_on(&topo.gateway, &topo.gateway_ifaces[..1], &dirs);
    let body = http_request(&mut conn).expect("the kept connection after the restart");
    assert!(body.starts_with("backend-"), "{body:?}");
    assert!(backend_sides.iter().all(|i| runs_xdp(&topo.gateway, i)));
    drop(conn);

    // Router mode: no SNAT traffic leaves anywhere, the programs come off again.
    dirs.edit_manifest("gateway.yaml", snat_on, "  releaseCooldown: 300s\n");
    wait_until(
        "the programs off the interfaces no SNAT traffic leaves out of",
        Duration::from_secs(30),
        || backend_sides.iter().all(|i| !runs_xdp(&topo.gateway, i)),
    );
    assert!(runs_xdp(&topo.gateway, &topo.gateway_ifaces[0]));
    drop(daemon);
}
