//! `deploy/monitoring/` against a real Prometheus (Debian's `prometheus`): the alert
//! rules pass `promtool check rules`, and a Prometheus scraping a running daemon that
//! carries traffic answers every dashboard query and every alert's query (its
//! expression without the final comparison) with series carrying the labels the panel
//! names in its legend. Everything runs in the test's network namespaces. Needs root.

use std::{
    net::SocketAddrV4,
    path::{Path, PathBuf},
    time::Duration,
};

use berth_tests::{
    daemon::{Daemon, Dirs},
    netns::{poll, unique},
    topo::{fresh_answers, Flow, Topology, GW},
};

const TIMEOUT: Duration = Duration::from_secs(2);

/// Where Prometheus listens, in the gateway's namespace.
const PROMETHEUS: &str = "127.0.0.1:19090";

/// A TCP check of team A's web backends, so the health families exist.
const HEALTH: &str = "\
apiVersion: berth.dev/v1alpha1
kind: BackendHealthPolicy
metadata: {name: web-health, namespace: team-a}
spec:
  targetRefs: [{group: '', kind: Service, name: web}]
  check: {type: TCP}
  interval: 1s
  timeout: 500ms
";

fn monitoring() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/monitoring")
}

/// A scratch directory, removed on drop.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `s` percent-encoded for a URL's query.
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The series Prometheus answers `query` with (instant query), as label maps.
fn series(topo: &Topology, query: &str) -> Result<Vec<serde_json::Value>, String> {
    let path = format!("/api/v1/query?query={}", encode(query));
    let text = topo
        .gateway
        .enter(|| berth::admin::get(PROMETHEUS, &path))
        .map_err(|e| format!("{query}: {e}"))?;
    let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
    if v["status"] != "success" {
        return Err(format!("{query}: {text}"));
    }
    Ok(v["data"]["result"]
        .as_array()
        .map(|r| r.iter().map(|s| s["metric"].clone()).collect())
        .unwrap_or_default())
}

/// The labels a legend names (`{{address}} {{direction}}`).
fn legend_labels(legend: &str) -> Vec<String> {
    legend
        .split("{{")
        .skip(1)
        .filter_map(|s| s.split_once("}}").map(|(l, _)| l.trim().to_string()))
        .collect()
}

/// An alert's query: its expression without the final comparison with a threshold.
fn alert_query(expr: &str) -> String {
    let cut = [" == ", " > ", " < ", " >= ", " <= ", " != "]
        .iter()
        .filter_map(|op| expr.rfind(op))
        .max()
        .unwrap_or_else(|| panic!("no comparison in {expr}"));
    expr[..cut].to_string()
}

#[test]
fn the_alert_rules_check_and_every_dashboard_and_alert_query_returns_series() {
    let rules = monitoring().join("alerts.yaml");
    let out = std::process::Command::new("promtool")
        .args(["check", "rules"])
        .arg(&rules)
        .output()
        .expect("promtool (cargo xtask setup installs Debian's prometheus)");
    assert!(
        out.status.success(),
        "promtool check rules: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    let topo = Topology::new(3);
    let _servers = topo.start_servers();
    let dirs = Dirs::with_examples();
    std::fs::write(dirs.manifests.join("health.yaml"), HEALTH).expect("policy");
    let daemon = Daemon::start(&topo, &dirs);

    // Prometheus in the gateway's namespace, scraping the daemon every second.
    let scratch = Scratch(std::env::temp_dir().join(format!("berth-prometheus-{}", unique("p"))));
    std::fs::create_dir_all(scratch.0.join("data")).expect("scratch dir");
    let config = scratch.0.join("prometheus.yml");
    std::fs::write(
        &config,
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n\
         scrape_configs:\n\
         - job_name: berth\n  static_configs: [{targets: ['127.0.0.1:9470']}]\n",
    )
    .expect("config");
    let _prometheus = topo.gateway.spawn(&[
        "prometheus",
        &format!("--config.file={}", config.display()),
        &format!("--storage.tsdb.path={}", scratch.0.join("data").display()),
        &format!("--web.listen-address={PROMETHEUS}"),
        "--log.level=warn",
    ]);
    poll(
        "Prometheus to scrape the daemon",
        Duration::from_secs(30),
        || match series(&topo, "up{job=\"berth\"} == 1")?.len() {
            1 => Ok(()),
            n => Err(format!("{n} targets up")),
        },
    );

    // Traffic, for long enough that rates over a minute have two points.
    let web = SocketAddrV4::new(GW, 30000);
    let dns = SocketAddrV4::new(GW, 30053);
    for _ in 0..4 {
        let answered = fresh_answers(&topo, web, 10, TIMEOUT);
        assert!(
            answered.iter().all(|b| b.starts_with("backend-")),
            "{answered:?}"
        );
        let mut flow = topo.client.enter(|| Flow::new(dns, TIMEOUT));
        assert!(flow.ask().is_some(), "DNS through the gateway");
        std::thread::sleep(Duration::from_secs(2));
    }

    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(monitoring().join("dashboard.json")).expect("dashboard"),
    )
    .expect("dashboard JSON");
    let mut queries: Vec<(String, String, Vec<String>)> = Vec::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        for t in panel["targets"].as_array().expect("targets") {
            let expr = t["expr"].as_str().expect("expr");
            let legend = t["legendFormat"].as_str().unwrap_or_default();
            queries.push((
                format!("panel {:?}", panel["title"]),
                expr.replace("$__rate_interval", "1m"),
                legend_labels(legend),
            ));
        }
    }
    let alerts: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(&rules).expect("rules")).expect("YAML");
    for group in alerts["groups"].as_sequence().expect("groups") {
        for rule in group["rules"].as_sequence().expect("rules") {
            let expr = rule["expr"].as_str().expect("expr");
            queries.push((
                format!("alert {:?}", rule["alert"].as_str().unwrap_or_default()),
                alert_query(expr),
                Vec::new(),
            ));
        }
    }
    assert!(queries.len() >= 20, "{} queries", queries.len());
    for (what, query, labels) in &queries {
        let found = poll(
            &format!("{what} to return series: {query}"),
            Duration::from_secs(30),
            || {
                let found = series(&topo, query)?;
                if found.is_empty() {
                    return Err("no series".into());
                }
                Ok(found)
            },
        );
        for s in &found {
            for l in labels {
                assert!(
                    s.get(l).is_some(),
                    "{what}: a series without the label {l} its legend names: {s}"
                );
            }
        }
    }
    drop(daemon);
}
