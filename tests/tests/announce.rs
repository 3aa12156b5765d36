//! Announcing the gateway addresses for the operator's routing daemon, with the real
//! daemon: `berth run --announce-table 100` in a gateway namespace publishes the
//! example Gateway's address on `berth0` and as a route of protocol 251 in table 100;
//! `berth drain` withdraws both (kept across a restart) while the datapath serves on,
//! `berth undrain` announces them again; SIGTERM with `--drain-on-stop` withdraws at
//! once and exits after the drain timeout, without it exits at once leaving them
//! published; a daemon not ready for longer than `--not-ready-grace` withdraws them.
//! Needs root; everything lives in the test's namespaces and directories.

use std::{
    net::SocketAddrV4,
    process::Output,
    time::{Duration, Instant},
};

use berth_tests::{
    daemon::{berth_binary, metrics, sample, Daemon, Dirs},
    netns::{poll, wait_until, Netns},
    topo::{http_get, Topology, GW},
};

/// Team A's TCPRoute gets the first port of the example's TCP range.
const WEB_PORT: u16 = 30000;
/// The example Gateway's address.
const ADDR: &str = "10.251.0.100";
const ADMIN: &str = "127.0.0.1:9470";

/// `berth ARGS` in the gateway namespace (its admin endpoint is on the namespace's
/// loopback).
fn berth(gw: &Netns, args: &[&str]) -> Output {
    gw.command(&berth_binary())
        .args(args)
        .output()
        .expect("run berth")
}

/// `berth ARGS`, which must succeed; its standard output.
fn berth_ok(gw: &Netns, args: &[&str]) -> String {
    let out = berth(gw, args);
    assert!(
        out.status.success(),
        "berth {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Table 100's routes, protocols and scopes as numbers (`ip -N`: iproute2 names 251
/// after the host's rt_protos files, which a test does not install).
fn table_100(gw: &Netns) -> String {
    let out = gw.ip(&["-N", "route", "show", "table", "100"]);
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Whether table 100 holds the route Berth announces the address with.
fn routed(gw: &Netns) -> bool {
    table_100(gw)
        .lines()
        .any(|l| l.starts_with(&format!("{ADDR} dev berth0 proto 251 scope 253")))
}

/// Whether berth0 holds the address.
fn on_berth0(gw: &Netns) -> bool {
    let out = gw.ip(&["-o", "-4", "addr", "show", "dev", "berth0"]);
    String::from_utf8_lossy(&out.stdout).contains(&format!("inet {ADDR}/32"))
}

/// `/api/v1/announce`.
fn announce(gw: &Netns) -> serde_json::Value {
    let text = gw
        .enter(|| berth::admin::get(ADMIN, "/api/v1/announce"))
        .expect("GET /api/v1/announce");
    serde_json::from_str(&text).expect("announce JSON")
}

/// `/readyz`: Ok(body) when 200, Err(what the client says: status and body) else.
fn readyz(gw: &Netns) -> Result<String, String> {
    gw.enter(|| berth::admin::get(ADMIN, "/readyz"))
        .map_err(|e| e.to_string())
}

/// Waits until the address is published (berth0 and table 100) or withdrawn from both,
/// and the announce status says so: the announcer's status follows the datapath's
/// publication on its next pass (a CI run under load read `berth_announced_addresses 0`
/// just after the address appeared on berth0).
fn wait_published(gw: &Netns, published: bool) {
    let what = if published { "published" } else { "withdrawn" };
    let said = |gw: &Netns| {
        announce(gw)["addresses"]
            .as_array()
            .is_some_and(|a| a.is_empty() != published)
    };
    wait_until(
        &format!("{ADDR} {what} on berth0, in table 100 and in the announce status"),
        Duration::from_secs(10),
        || routed(gw) == published && on_berth0(gw) == published && said(gw),
    );
}

/// `berth_drain_state{state="STATE"}`.
fn drain_state(gw: &Netns, state: &str) -> Option<u64> {
    sample(
        &metrics(gw),
        &format!("berth_drain_state{{state=\"{state}\"}}"),
    )
}

/// The example Gateway and team A's web route (backends 1 and 2).
fn manifests() -> Dirs {
    Dirs::with_example_files(&["gateway.yaml", "team-a.yaml"])
}

#[test]
fn a_drained_node_withdraws_its_address_serves_on_stays_drained_across_a_restart_and_undrains() {
    let topo = Topology::new(2);
    let _servers = topo.start_servers();
    let dirs = manifests();
    let gw = &topo.gateway;
    let args = ["--announce-table", "100", "--drain-timeout", "5s"];
    let mut daemon = Daemon::start_with(gw, &topo.gateway_ifaces, &dirs, &args);
    wait_published(gw, true);
    assert_eq!(announce(gw)["state"], "announced");
    assert_eq!(readyz(gw).as_deref(), Ok("ready\n"));
    let m = metrics(gw);
    assert_eq!(sample(&m, "berth_announced_addresses"), Some(1), "{m}");
    assert_eq!(drain_state(gw, "announced"), Some(1));
    assert_eq!(drain_state(gw, "draining"), Some(0));

    let said = berth_ok(gw, &["drain"]);
    assert!(
        said.starts_with(&format!(
            "drained: withdrew {ADDR} (berth0, table 100); the datapath keeps serving"
        )),
        "berth drain said {said:?}"
    );
    // `berth drain` returns once the loop applied it: withdrawn already.
    assert!(
        !routed(gw),
        "table 100 after berth drain:\n{}",
        table_100(gw)
    );
    assert!(!on_berth0(gw), "berth0 still holds {ADDR}");
    let ready = readyz(gw).expect_err("503 while drained");
    assert!(
        ready.contains("503") && ready.contains("draining: addresses withdrawn by berth drain"),
        "{ready}"
    );
    let table = berth_ok(gw, &["get", "routes"]);
    let first = table.lines().next().unwrap_or_default();
    assert!(
        first.starts_with("NODE DRAINING (berth drain, ")
            && first.ends_with(&format!("): {ADDR} withdrawn; existing flows are served")),
        "{table}"
    );
    assert_eq!(drain_state(gw, "draining"), Some(1));
    assert_eq!(drain_state(gw, "announced"), Some(0));
    assert_eq!(sample(&metrics(gw), "berth_announced_addresses"), Some(0));
    // The datapath serves whatever still arrives (the client routes to the gateway).
    let web = SocketAddrV4::new(GW, WEB_PORT);
    let body = topo
        .client
        .enter(|| http_get(web))
        .expect("the web port while drained");
    assert!(body.starts_with("backend-"), "{body:?}");
    assert!(
        dirs.state.join("drain").exists(),
        "the drain is kept in the state directory"
    );

    // After --drain-timeout: drained, still withdrawn.
    wait_until(
        "drained after the drain timeout",
        Duration::from_secs(15),
        || announce(gw)["state"] == "drained",
    );
    assert_eq!(drain_state(gw, "drained"), Some(1));
    assert!(readyz(gw).is_err_and(|e| e.contains("drained: addresses withdrawn")));

    // kill -9 and start again: still drained, from the start.
    daemon.kill9();
    let daemon = Daemon::start_with(gw, &topo.gateway_ifaces, &dirs, &args);
    let status = poll(
        "the announce state after a restart",
        Duration::from_secs(10),
        || {
            gw.enter(|| berth::admin::get(ADMIN, "/api/v1/announce"))
                .map_err(|e| e.to_string())
        },
    );
    let status: serde_json::Value = serde_json::from_str(&status).expect("json");
    assert_eq!(status["state"], "drained", "{status}");
    assert_eq!(status["operatorDrain"], true, "{status}");
    assert!(
        !routed(gw) && !on_berth0(gw),
        "a restarted drained node publishes nothing"
    );

    let said = berth_ok(gw, &["undrain"]);
    assert_eq!(
        said.trim(),
        format!("undrained: announced {ADDR} (berth0, table 100)")
    );
    assert!(
        routed(gw) && on_berth0(gw),
        "published again once undrain returns"
    );
    assert_eq!(readyz(gw).as_deref(), Ok("ready\n"));
    assert_eq!(drain_state(gw, "announced"), Some(1));
    assert!(
        !dirs.state.join("drain").exists(),
        "berth undrain removes the drain file"
    );
    let table = berth_ok(gw, &["get", "routes"]);
    assert!(
        table.starts_with("NAMESPACE"),
        "no banner while announced:\n{table}"
    );
    drop(daemon);
}

#[test]
fn drain_requests_are_posts_to_the_admin_address_only_and_refused_from_web_pages() {
    let topo = Topology::new(1);
    let dirs = manifests();
    let gw = &topo.gateway;
    let args = ["--metrics-addr", "127.0.0.1:9471"];
    let _daemon = Daemon::start_with(gw, &topo.gateway_ifaces, &dirs, &args);
    let ask = |addr: &'static str, request: &'static str| -> String {
        gw.enter(move || {
            use std::io::{Read, Write};
            let mut s = std::net::TcpStream::connect(addr).expect("connect");
            s.write_all(request.as_bytes()).expect("send");
            let mut text = String::new();
            s.read_to_string(&mut text).expect("read");
            text
        })
    };
    let get = ask(ADMIN, "GET /api/v1/drain HTTP/1.0\r\n\r\n");
    assert!(
        get.starts_with("HTTP/1.0 405") && get.to_ascii_lowercase().contains("allow: post"),
        "{get}"
    );
    let metrics_post = ask("127.0.0.1:9471", "POST /api/v1/drain HTTP/1.0\r\n\r\n");
    assert!(metrics_post.starts_with("HTTP/1.0 404"), "{metrics_post}");
    let cross_site = ask(
        ADMIN,
        "POST /api/v1/drain HTTP/1.0\r\nOrigin: http://evil.example\r\n\r\n",
    );
    assert!(cross_site.starts_with("HTTP/1.0 403"), "{cross_site}");
    assert_eq!(announce(gw)["state"], "announced", "nothing was drained");
    let post = ask(ADMIN, "POST /api/v1/drain HTTP/1.0\r\n\r\n");
    assert!(
        post.starts_with("HTTP/1.0 202") && post.contains("\"request\": 1"),
        "{post}"
    );
    wait_until("drained by a bare POST", Duration::from_secs(5), || {
        announce(gw)["state"] == "draining"
    });
}

#[test]
fn sigterm_with_drain_on_stop_withdraws_at_once_serves_on_and_exits_after_the_drain_timeout() {
    let topo = Topology::new(1);
    let dirs = manifests();
    let gw = &topo.gateway;
    let args = [
        "--announce-table",
        "100",
        "--drain-on-stop",
        "--drain-timeout",
        "2s",
    ];
    let mut daemon = Daemon::start_with(gw, &topo.gateway_ifaces, &dirs, &args);
    wait_published(gw, true);
    let signalled = Instant::now();
    daemon.terminate();
    wait_published(gw, false);
    let withdrawn = signalled.elapsed();
    assert!(
        daemon.exited().is_none(),
        "the daemon serves on while it drains"
    );
    assert!(
        withdrawn < Duration::from_secs(2),
        "withdrawn {withdrawn:?} after SIGTERM"
    );
    let ready = readyz(gw).expect_err("503 while stopping");
    assert!(
        ready.contains("stopping: addresses withdrawn on SIGTERM"),
        "{ready}"
    );
    assert_eq!(drain_state(gw, "stopping"), Some(1));
    let status = poll("the daemon to exit", Duration::from_secs(10), || {
        daemon.exited().ok_or_else(|| "still running".to_string())
    });
    let ran = signalled.elapsed();
    assert!(status.success(), "exit status {status}");
    assert!(
        ran >= Duration::from_millis(1900) && ran < Duration::from_secs(6),
        "exited {ran:?} after SIGTERM, with --drain-timeout 2s"
    );
    assert!(
        !dirs.state.join("drain").exists(),
        "a stopping drain is not kept: the next start announces"
    );

    // A second signal ends the drain at once.
    let long = [
        "--announce-table",
        "100",
        "--drain-on-stop",
        "--drain-timeout",
        "60s",
    ];
    let mut daemon = Daemon::start_with(gw, &topo.gateway_ifaces, &dirs, &long);
    wait_published(gw, true);
    daemon.terminate();
    wait_published(gw, false);
    let again = Instant::now();
    daemon.terminate();
    let status = poll(
        "the daemon to exit on a second SIGTERM",
        Duration::from_secs(5),
        || daemon.exited().ok_or_else(|| "still running".to_string()),
    );
    assert!(status.success(), "exit status {status}");
    assert!(
        again.elapsed() < Duration::from_secs(3),
        "{:?}",
        again.elapsed()
    );
}

#[test]
fn sigterm_without_drain_on_stop_exits_at_once_and_leaves_the_address_published() {
    let topo = Topology::new(1);
    let dirs = manifests();
    let gw = &topo.gateway;
    let mut daemon = Daemon::start_with(
        gw,
        &topo.gateway_ifaces,
        &dirs,
        &["--announce-table", "100"],
    );
    wait_published(gw, true);
    let signalled = Instant::now();
    daemon.terminate();
    let status = poll("the daemon to exit", Duration::from_secs(5), || {
        daemon.exited().ok_or_else(|| "still running".to_string())
    });
    assert!(status.success(), "exit status {status}");
    assert!(
        signalled.elapsed() < Duration::from_secs(2),
        "{:?}",
        signalled.elapsed()
    );
    assert!(
        routed(gw),
        "the route stays in table 100:\n{}",
        table_100(gw)
    );
    assert!(on_berth0(gw), "the address stays on berth0");
}

#[test]
fn a_node_not_ready_for_longer_than_the_grace_withdraws_and_announces_again_when_ready() {
    let topo = Topology::new(1);
    let dirs = manifests();
    let gw = &topo.gateway;
    let args = ["--announce-table", "100", "--not-ready-grace", "1s"];
    let _daemon = Daemon::start_with(gw, &topo.gateway_ifaces, &dirs, &args);
    wait_published(gw, true);
    // A manifest directory moved away makes the daemon not ready (its last state
    // stays in force): after the grace, the addresses are withdrawn.
    let away = dirs.manifests.with_extension("away");
    std::fs::rename(&dirs.manifests, &away).expect("move the manifests away");
    let moved_back = scopeguard(&away, &dirs.manifests);
    wait_published(gw, false);
    let status = announce(gw);
    assert_eq!(status["state"], "withdrawn-not-ready", "{status}");
    assert!(
        status["reason"]
            .as_str()
            .is_some_and(|r| r.contains("--not-ready-grace 1s")),
        "{status}"
    );
    assert_eq!(drain_state(gw, "not_ready"), Some(1));
    drop(moved_back);
    wait_published(gw, true);
    assert_eq!(announce(gw)["state"], "announced");
}

/// Renames `from` back to `to` when dropped (also when the test fails).
fn scopeguard(from: &std::path::Path, to: &std::path::Path) -> impl Drop {
    struct Back(std::path::PathBuf, std::path::PathBuf);
    impl Drop for Back {
        fn drop(&mut self) {
            let _ = std::fs::rename(&self.0, &self.1);
        }
    }
    Back(from.to_path_buf(), to.to_path_buf())
}
