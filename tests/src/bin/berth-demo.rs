//! `cargo xtask demo`: `berth run` on the example manifests, in network namespaces on
//! this machine, with real servers and clients: two teams share one gateway address,
//! each reaches its service on the port Berth assigned, over IPv4 and then also IPv6
//! (the Gateway made dual-stack live). Cleans up after itself.

use std::{
    path::{Path, PathBuf},
    process::{Child, Output, Stdio},
    time::{Duration, Instant},
};

use berth_tests::topo::Topology;

struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        // SAFETY: signalling the child we started, by PID.
        unsafe { libc::kill(self.0.id() as i32, libc::SIGTERM) };
        let _ = self.0.wait();
    }
}

struct Cleanup(Vec<PathBuf>);

impl Drop for Cleanup {
    fn drop(&mut self) {
        for p in &self.0 {
            let _ = std::fs::remove_dir_all(p).or_else(|_| std::fs::remove_file(p));
        }
    }
}

fn text(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

fn main() {
    let here = std::env::current_exe().expect("own path");
    let berth = here.parent().expect("target dir").join("berth");
    assert!(
        berth.exists(),
        "{} missing: build it with cargo build --release -p gateway-daemon",
        berth.display()
    );
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");

    println!(
        "Berth demo: one gateway address shared by two teams, one port each, assigned by Berth.\n"
    );
    println!("  client 10.251.1.2 ── gateway (berth run, XDP) ─┬─ backend 1  10.251.11.2  nginx    (team A)");
    println!("                                                  ├─ backend 2  10.251.12.2  nginx    (team A)");
    println!("                                                  └─ backend 3  10.251.13.2  dnsmasq  (team B)");
    println!(
        "  The gateway address 10.251.0.100 is Berth's: berth run puts it on its dummy interface berth0,\n  and its XDP program translates it. The veths are as the kernel makes them (GRO off).\n"
    );

    let topo = Topology::new(3);
    let _servers = topo.start_servers();
    let id = std::process::id();
    let manifests = std::env::temp_dir().join(format!("berth-demo-manifests-{id}"));
    let state = std::env::temp_dir().join(format!("berth-demo-state-{id}"));
    let pins = PathBuf::from(format!("/sys/fs/bpf/berth-demo-{id}"));
    let _cleanup = Cleanup(vec![
        manifests.clone(),
        state.clone(),
        state.with_extension("log"),
        pins.clone(),
    ]);
    std::fs::create_dir_all(&manifests).expect("manifest dir");
    for f in ["gateway.yaml", "team-a.yaml", "team-b.yaml"] {
        std::fs::copy(examples.join(f), manifests.join(f)).expect("copy example");
    }
    println!(
        "Manifests (copied from examples/): a Gateway with TCP and UDP port ranges 30000-30999,"
    );
    println!("team A's TCPRoute (any free port) and team B's UDPRoute (asking for 30053).\n");

    let mut run = topo.gateway.command(&berth);
    run.arg("run")
        .arg("--manifests")
        .arg(&manifests)
        .arg("--state-dir")
        .arg(&state)
        .arg("--pin-dir")
        .arg(&pins);
    for iface in &topo.gateway_ifaces {
        run.args(["--interface", iface]);
    }
    let log = std::fs::File::create(state.with_extension("log")).expect("log file");
    let _daemon = Daemon(
        run.stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start berth run"),
    );
    let get = |what: &str| {
        topo.gateway
            .command(&berth)
            .args(["get", what])
            .output()
            .expect("berth get")
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while !get("routes").status.success() {
        assert!(
            Instant::now() < deadline,
            "berth run did not come up; see {}",
            state.with_extension("log").display()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    println!("$ berth get routes");
    println!("{}\n", text(&get("routes")));

    // Team A's page over IPv4, on a new connection.
    let curl4 = || {
        text(&topo.client.try_exec(&[
            "curl",
            "-sS",
            "--max-time",
            "3",
            "http://10.251.0.100:30000/",
        ]))
    };
    println!("Team A's clients: curl http://10.251.0.100:30000/ (a new connection each time)");
    for _ in 0..6 {
        println!("  -> {}", curl4());
    }
    println!("\nTeam B's clients: dig @10.251.0.100 -p 30053 whoami.berth.test");
    let out = topo.client.try_exec(&[
        "dig",
        "+short",
        "+time=2",
        "+tries=2",
        "-p",
        "30053",
        "@10.251.0.100",
        "whoami.berth.test",
    ]);
    println!(
        "  -> {} (backend 3's dnsmasq answers 10.99.0.3)",
        text(&out)
    );

    println!("\nA third team adds a route file; within a second it has a port and traffic flows:");
    let team_a = std::fs::read_to_string(manifests.join("team-a.yaml")).expect("read");
    std::fs::write(
        manifests.join("team-c.yaml"),
        team_a.replace("team-a", "team-c"),
    )
    .expect("write team-c");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !text(&get("routes")).contains("team-c") {
        assert!(Instant::now() < deadline, "team C's route did not appear");
        std::thread::sleep(Duration::from_millis(50));
    }
    println!("$ berth get routes");
    println!("{}", text(&get("routes")));
    let out = topo.client.try_exec(&[
        "curl",
        "-sS",
        "--max-time",
        "3",
        "http://10.251.0.100:30001/",
    ]);
    println!("  curl http://10.251.0.100:30001/ -> {}", text(&out));

    println!(
        "\nDual stack: the operator adds the IPv6 address fd00:251::100 to the Gateway, teams A and B"
    );
    println!("add IPv6 EndpointSlices; the same ports now serve both families:");
    let gateway = std::fs::read_to_string(manifests.join("gateway.yaml")).expect("read");
    let v4 = "    value: 10.251.0.100\n";
    assert!(
        gateway.contains(v4),
        "examples/gateway.yaml names 10.251.0.100"
    );
    std::fs::write(
        manifests.join("gateway.yaml"),
        gateway.replace(
            v4,
            &format!("{v4}  - type: IPAddress\n    value: fd00:251::100\n"),
        ),
    )
    .expect("write gateway");
    for (team, service, port, addrs) in [
        ("team-a", "web", "http", "[fd00:251:11::2, fd00:251:12::2]"),
        ("team-b", "dns", "dns", "[fd00:251:13::2]"),
    ] {
        let (protocol, number) = if port == "http" {
            ("TCP", 8080)
        } else {
            ("UDP", 5353)
        };
        std::fs::write(
            manifests.join(format!("{team}-ipv6.yaml")),
            format!(
                "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  \
                 name: {service}-v6\n  namespace: {team}\n  labels:\n    \
                 kubernetes.io/service-name: {service}\naddressType: IPv6\nendpoints:\n\
                 - addresses: {addrs}\nports:\n- name: {port}\n  port: {number}\n  \
                 protocol: {protocol}\n"
            ),
        )
        .expect("write IPv6 EndpointSlice");
    }
    let curl6 = || {
        text(&topo.client.try_exec(&[
            "curl",
            "-6",
            "-sS",
            "--max-time",
            "3",
            "http://[fd00:251::100]:30000/",
        ]))
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut answer = curl6();
    while !answer.starts_with("backend-") && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
        answer = curl6();
    }
    println!("  curl -6 http://[fd00:251::100]:30000/ -> {answer}");
    for _ in 0..3 {
        println!("  curl -6 http://[fd00:251::100]:30000/ -> {}", curl6());
    }
    println!("  curl    http://10.251.0.100:30000/    -> {}", curl4());
    let out = topo.client.try_exec(&[
        "dig",
        "-6",
        "+short",
        "+time=2",
        "+tries=2",
        "-p",
        "30053",
        "@fd00:251::100",
        "whoami.berth.test",
        "AAAA",
    ]);
    println!(
        "  dig -6 @fd00:251::100 -p 30053 whoami.berth.test AAAA -> {} (backend 3 answers fd00:99::3)",
        text(&out)
    );

    println!(
        "\nWhat the XDP program counted per route (packets read every second, active flows every 10 s):"
    );
    let deadline = Instant::now() + Duration::from_secs(12);
    let counted = |rows: &str| {
        ["team-a", "team-b", "team-c"].iter().all(|team| {
            rows.lines().any(|l| {
                l.starts_with(team) && !l.contains(" 0 pkts") && !l.contains(" 0 active flows")
            })
        })
    };
    while !counted(&text(&get("routes"))) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    println!("$ berth get routes");
    println!("{}", text(&get("routes")));

    // A node of a tier: what the routing daemon (BIRD, FRR) would announce, and drain.
    let berth_cmd = |args: &[&str]| {
        let out = topo
            .gateway
            .command(&berth)
            .args(args)
            .output()
            .expect("berth");
        println!("$ berth {}", args.join(" "));
        println!("{}", text(&out));
    };
    println!(
        "\nBefore maintenance, the operator drains the node: its address leaves berth0 (and the\n\
         announce table, with --announce-table), so BIRD or FRR withdraw it, while flows that\n\
         still arrive are served:"
    );
    berth_cmd(&["drain"]);
    berth_cmd(&["get", "node"]);
    println!("  curl http://10.251.0.100:30000/ -> {}", curl4());
    berth_cmd(&["undrain"]);

    println!(
        "\nCleaning up: berth stopped, servers stopped, namespaces, pinned maps and state removed."
    );
}
