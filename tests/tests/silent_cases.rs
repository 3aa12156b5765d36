//! Cases that once said nothing (issue 31), each where the operator looks: native XDP
//! on an interface whose MTU its driver cannot take in one page (a 9000-byte MTU on a
//! veth) is refused naming the MTU and the way out, where the kernel said only
//! "Numerical result out of range"; a route given a port a host process listens on says
//! so in `berth get routes`; a restart asking for native XDP over a link an earlier run
//! attached in generic mode says it stays generic; a SNAT route whose backend is reached
//! out of an interface Berth is not attached to names it. Needs root.

use std::{net::TcpListener, time::Duration};

use berth_tests::{
    daemon::{Daemon, Dirs},
    netns::wait_until,
    topo::Topology,
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

#[test]
fn a_snat_route_whose_backends_are_reached_out_of_an_unattached_interface_says_so() {
    let topo = Topology::new(1);
    let _servers = topo.start_servers();
    let dirs = Dirs::with_example_files(&["gateway.yaml", "team-a.yaml"]);
    dirs.edit_manifest(
        "gateway.yaml",
        "  releaseCooldown: 300s\n",
        "  releaseCooldown: 300s\n  sourceNAT: true\n",
    );
    // Only the client's side is given: the backend is reached out of the other
    // interface, where no program of Berth's gives SNAT traffic the node's source.
    let backend_side = topo.gateway_ifaces[1].clone();
    let daemon = Daemon::start_on(&topo.gateway, &topo.gateway_ifaces[..1], &dirs);
    let want = format!("leaves out of {backend_side}, where Berth's programs do not run");
    wait_until(
        "team A's SNAT route to name the interface its traffic leaves out of",
        Duration::from_secs(30),
        || {
            daemon.routes(&topo.gateway).iter().any(|r| {
                r.namespace == "team-a" && r.warning.as_deref().is_some_and(|w| w.contains(&want))
            })
        },
    );
    drop(daemon);
}
