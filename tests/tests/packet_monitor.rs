//! `berth monitor` against a running daemon carrying real traffic (issue 31): team A's
//! HTTP requests, which the kernel forwards into the backends' default veths, are
//! events (`kernel_forward_no_xdp_egress`, or `_no_neighbour` before the backend's
//! neighbour is resolved), and so are their replies into the client's default veth;
//! shown for `--route team-a/web` as JSON lines with their heads as they entered (to
//! the gateway's port) and left (to a backend); team B's DNS is not; the pcap written beside opens in tshark with both heads. A
//! second monitor is refused while one listens; a monitor printing text lines and
//! then killed with SIGKILL leaves the events on only until the daemon's next scan. Needs root, tshark.

use std::{
    io::{BufRead, BufReader},
    net::SocketAddrV4,
    process::{Child, Stdio},
    time::Duration,
};

use aya::maps::{Array, Map, MapData};
use berth_tests::{
    daemon::{berth_binary, Daemon, Dirs},
    netns::{unique, wait_until, Netns},
    topo::{dns_whoami_from, http_get, Topology, GW},
};
use gateway_common::{config, map_names};

/// `berth monitor ARGS` in the gateway's namespace, started and listening.
fn monitor(
    gateway: &Netns,
    dirs: &Dirs,
    args: &[&str],
) -> (Child, BufReader<std::process::ChildStderr>) {
    let mut child = gateway
        .command(&berth_binary())
        .arg("monitor")
        .arg("--pin-dir")
        .arg(&dirs.pins)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("berth monitor");
    let mut stderr = BufReader::new(child.stderr.take().expect("stderr"));
    let mut line = String::new();
    stderr.read_line(&mut line).expect("its first line");
    if !line.contains("listening to the datapath") {
        let _ = child.kill();
        let _ = child.wait();
        panic!("berth monitor did not start: {line}");
    }
    (child, stderr)
}

/// Who listens to the datapath's events (`config::MONITOR`).
fn listener(dirs: &Dirs) -> u32 {
    let data = MapData::from_pin(dirs.pins.join(map_names::CONFIG)).expect("config pin");
    let config: Array<MapData, u32> = Array::try_from(Map::Array(data)).expect("array");
    config.get(&config::MONITOR, 0).expect("slot")
}

/// A daemon on the examples whose team A route answers. Both of team A's backends
/// (the examples' 10.251.11.2 and .12.2): with one, a connection Maglev gives the other
/// is answered "network unreachable" by the gateway.
fn serving_team_a() -> (Topology, berth_tests::topo::Servers, Dirs, Daemon) {
    let topo = Topology::new(2);
    let servers = topo.start_servers();
    let dirs = Dirs::with_examples();
    // Every packet through the kernel (`--redirect never`): a request handed to TC, as
    // on these default veths otherwise, is the ordinary course of a flow and no event.
    let daemon = Daemon::start_with(
        &topo.gateway,
        &topo.gateway_ifaces,
        &dirs,
        &["--redirect", "never"],
    );
    let web = SocketAddrV4::new(GW, 30000);
    wait_until("team A's route to serve", Duration::from_secs(30), || {
        topo.client.enter(|| http_get(web).is_ok())
    });
    (topo, servers, dirs, daemon)
}

#[test]
fn a_routes_kernel_path_packets_are_shown_with_both_heads_and_written_as_pcap() {
    let (topo, _servers, dirs, daemon) = serving_team_a();
    let web = SocketAddrV4::new(GW, 30000);
    let pcap = std::env::temp_dir().join(format!("{}.pcap", unique("monitor")));
    let (child, _stderr) = monitor(
        &topo.gateway,
        &dirs,
        &[
            "--route",
            "team-a/web",
            "-o",
            "json",
            "--pcap",
            pcap.to_str().unwrap(),
            "--count",
            "4",
            "--duration",
            "60s",
        ],
    );
    // A second monitor is refused while this one listens.
    let second = topo
        .gateway
        .command(&berth_binary())
        .args(["monitor", "--pin-dir"])
        .arg(&dirs.pins)
        .output()
        .expect("second monitor");
    let said = String::from_utf8_lossy(&second.stderr);
    assert!(
        !second.status.success() && said.contains("already listens"),
        "{said}"
    );

    // Team B's DNS first (filtered out), then team A's requests.
    for _ in 0..3 {
        let _ = topo
            .client
            .enter(|| dns_whoami_from(SocketAddrV4::new(GW, 30000), Duration::from_secs(1)));
    }
    for _ in 0..4 {
        topo.client.enter(|| http_get(web)).expect("team A answers");
    }
    let out = child
        .wait_with_output()
        .expect("monitor ends after --count");
    assert!(out.status.success());
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    assert_eq!(lines.len(), 4, "{lines:?}");
    let backends: Vec<String> = topo.backend_addrs.iter().map(|a| a.to_string()).collect();
    for l in &lines {
        // The first packet to a backend may find its neighbour unresolved.
        let reason = l["reason"].as_str().unwrap_or("");
        assert!(
            [
                "kernel_forward_no_xdp_egress",
                "kernel_forward_no_neighbour"
            ]
            .contains(&reason),
            "{l}"
        );
        assert_eq!(l["verdict"], "pass", "{l}");
        assert_eq!(l["entered"]["proto"], "tcp", "{l}");
        let (entered, left) = (&l["entered"], &l["left"]);
        let backend = |h: &serde_json::Value, end: &str| {
            backends.contains(&h[end].as_str().unwrap_or("").to_string())
        };
        if entered["dst"] == GW.to_string() {
            // A request: entered to team A's port, left to a backend.
            assert_eq!(entered["dport"], 30000, "{l}");
            assert!(backend(left, "dst") && left["dport"] == 8080, "{l}");
        } else {
            // A reply: goes up untranslated (the TC program translates it on egress).
            assert!(backend(entered, "src") && entered["sport"] == 8080, "{l}");
            assert_eq!(entered, left, "{l}");
        }
    }
    let requests = lines
        .iter()
        .filter(|l| l["entered"]["dst"] == GW.to_string())
        .count();
    assert!(requests > 0, "{lines:?}");
    assert_eq!(
        listener(&dirs),
        0,
        "the monitor turned the events off as it ended"
    );

    // tshark reads the pcap: each event as it entered and as it left.
    let read = std::process::Command::new("tshark")
        .args([
            "-r",
            pcap.to_str().unwrap(),
            "-T",
            "fields",
            "-e",
            "ip.dst",
            "-e",
            "tcp.dstport",
        ])
        .output()
        .expect("tshark (apt install tshark)");
    let _ = std::fs::remove_file(&pcap);
    let text = String::from_utf8_lossy(&read.stdout);
    assert!(
        read.status.success(),
        "{}",
        String::from_utf8_lossy(&read.stderr)
    );
    let rows: Vec<&str> = text.lines().collect();
    // A request as it entered and as it left; a reply once (unchanged).
    assert_eq!(rows.len(), 4 + requests, "{text}");
    let to_gateway = format!("{GW}\t30000");
    let count = |f: &dyn Fn(&str) -> bool| rows.iter().filter(|r| f(r)).count();
    assert_eq!(count(&|r| r == to_gateway), requests, "{text}");
    assert_eq!(count(&|r| r.ends_with("\t8080")), requests, "{text}");
    drop(daemon);
}

#[test]
fn a_killed_monitors_events_are_turned_off_by_the_daemon() {
    let (topo, _servers, dirs, daemon) = serving_team_a();
    let web = SocketAddrV4::new(GW, 30000);
    let (mut child, _stderr) = monitor(&topo.gateway, &dirs, &["--duration", "5m"]);
    assert_eq!(listener(&dirs), child.id());
    // Lines of text: the request as it entered and, after `=>`, as it left.
    topo.client.enter(|| http_get(web)).expect("team A answers");
    let mut first = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut first)
        .expect("a line");
    eprintln!("berth monitor printed: {first}");
    assert!(
        first.contains(" kernel_forward_")
            && first.contains(&format!("> {GW}:30000"))
            && first.contains(" => tcp "),
        "{first}"
    );
    child.kill().expect("SIGKILL");
    child.wait().expect("reaped");
    wait_until(
        "the daemon to turn the events off",
        Duration::from_secs(40),
        || listener(&dirs) == 0,
    );
    drop(daemon);
}
