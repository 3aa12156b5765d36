//! Golden files for the planner: `golden/NAME.in.yaml` (objects, existing PortClaims,
//! and optionally a `PlannerClock` document with `now`) → `golden/NAME.out.yaml`
//! (statuses, claims and the datapath plan). The `PlannerClock` document may also give
//! `ephemeralPorts: FIRST-LAST`, the host's ephemeral ports (none by default), and
//! `defaultAddresses: [IP, ...]`, the `--address` defaults (none by default), and
//! `maxServices: N` / `maxBackends: N`, the datapath's room (`--max-services`,
//! `--max-backends`; the daemon's defaults otherwise).
//! `BLESS=1 cargo test --test golden`
//! rewrites the outputs; review the diff.

use std::{path::Path, time::SystemTime};

use berth::{
    manifests,
    model::PortClaim,
    planner::{self, GatewayEntry},
};
use serde::Serialize;

const DEFAULT_NOW: &str = "2026-01-01T00:00:00Z";

#[derive(Serialize)]
struct Golden {
    gateways: Vec<GatewayEntry>,
    routes: berth::planner::RouteList,
    claims: berth::model::ClaimList,
    datapath: Vec<DatapathEntry>,
}

#[derive(Serialize)]
struct DatapathEntry {
    service: String,
    backends: Vec<String>,
    /// Source-NATed (`sourceNAT: true`): shown only where set.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    snat: bool,
}

fn run_case(input: &Path, memo: &mut planner::Memo) -> String {
    let text = std::fs::read_to_string(input).expect("read input");
    let mut claims = berth::model::ClaimList::new();
    let mut now = DEFAULT_NOW.to_string();
    let mut ephemeral_ports = None;
    let mut default_addresses = berth::planner::DefaultAddresses::default();
    let mut capacity = berth::datapath::Capacity::default();
    let mut manifest_docs = Vec::new();
    for de in serde_yaml::Deserializer::from_str(&text) {
        let value: serde_yaml::Value = serde::Deserialize::deserialize(de).expect("yaml");
        match value.get("kind").and_then(|k| k.as_str()) {
            Some("PortClaim") => claims.push_back(std::sync::Arc::new(
                serde_yaml::from_value::<PortClaim>(value).expect("PortClaim"),
            )),
            Some("PlannerClock") => {
                now = value["now"].as_str().unwrap_or(DEFAULT_NOW).to_string();
                ephemeral_ports = value["ephemeralPorts"].as_str().map(|r| {
                    let (first, last) = r.split_once('-').expect("ephemeralPorts: FIRST-LAST");
                    first.parse::<u16>().expect("first")..=last.parse::<u16>().expect("last")
                });
                let limit = |key: &str, default: u32| {
                    value[key]
                        .as_u64()
                        .map_or(default, |n| u32::try_from(n).expect("a limit fits 32 bits"))
                };
                capacity = berth::datapath::Capacity {
                    services: limit("maxServices", capacity.services),
                    backends: limit("maxBackends", capacity.backends),
                };
                if let Some(list) = value["defaultAddresses"].as_sequence() {
                    let ips: Vec<std::net::IpAddr> = list
                        .iter()
                        .map(|a| a.as_str().expect("an address").parse().expect("an IP"))
                        .collect();
                    default_addresses = berth::planner::DefaultAddresses::from_list(&ips)
                        .expect("at most one default address per family");
                }
            }
            _ => manifest_docs.push(serde_yaml::to_string(&value).expect("yaml")),
        }
    }
    let parsed = manifests::parse_file(input, &manifest_docs.join("---\n"));
    assert!(
        parsed.errors.is_empty(),
        "{}: {:?}",
        input.display(),
        parsed.errors
    );
    let snapshot = manifests::snapshot([&parsed]);
    let now: SystemTime = humantime::parse_rfc3339(&now).expect("now");
    let plan = planner::plan(&planner::Input {
        snapshot: &snapshot,
        claims: &claims,
        now,
        default_addresses,
        ephemeral_ports: ephemeral_ports.clone(),
        snat_ports: berth::planner::DEFAULT_SNAT_PORTS,
        capacity,
        allocate: true,
    });
    let again = planner::plan(&planner::Input {
        snapshot: &snapshot,
        claims: &claims,
        now,
        default_addresses,
        ephemeral_ports: ephemeral_ports.clone(),
        snat_ports: berth::planner::DEFAULT_SNAT_PORTS,
        capacity,
        allocate: true,
    });
    assert_eq!(
        plan,
        again,
        "{}: the planner is not deterministic",
        input.display()
    );
    // A memo changes nothing but the times it keeps: neither the plan that fills it
    // (holding the routes of the cases before this one: other objects, often routes
    // of the same names) nor the one that reuses it.
    let untimed = |p: &planner::Plan| {
        let mut p = p.clone();
        for r in &mut p.routes {
            for parent in &mut std::sync::Arc::make_mut(r).status.parents {
                for c in &mut parent.conditions {
                    c.last_transition_time = berth::model::Time::at(std::time::UNIX_EPOCH);
                }
            }
        }
        p
    };
    for round in ["filling", "reusing"] {
        let remembered = planner::plan_with(
            &planner::Input {
                snapshot: &snapshot,
                claims: &claims,
                now,
                default_addresses,
                ephemeral_ports: ephemeral_ports.clone(),
                snat_ports: berth::planner::DEFAULT_SNAT_PORTS,
                capacity,
                allocate: true,
            },
            memo,
        );
        assert_eq!(
            untimed(&plan),
            untimed(&remembered),
            "{}: {round} the memo",
            input.display()
        );
    }
    let golden = Golden {
        gateways: plan.gateways,
        routes: plan.routes,
        claims: plan.claims,
        datapath: plan
            .datapath
            .services
            .iter()
            .map(|(s, b)| DatapathEntry {
                service: s.to_string(),
                backends: b
                    .iter()
                    .map(|b| format!("{} weight {}", b.endpoint, b.weight))
                    .collect(),
                snat: plan.datapath.source_nat.contains(s),
            })
            .collect(),
    };
    serde_yaml::to_string(&golden).expect("yaml")
}

#[test]
fn planner_golden_files() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden");
    let bless = std::env::var_os("BLESS").is_some();
    let mut inputs: Vec<_> = std::fs::read_dir(&dir)
        .expect("golden dir")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.to_string_lossy().ends_with(".in.yaml"))
        .collect();
    inputs.sort();
    assert!(!inputs.is_empty(), "no golden inputs in {}", dir.display());
    let mut failures = Vec::new();
    let mut memo = planner::Memo::default();
    for input in &inputs {
        let out_path = input.to_string_lossy().replace(".in.yaml", ".out.yaml");
        let got = run_case(input, &mut memo);
        if bless {
            std::fs::write(&out_path, &got).expect("write golden");
            continue;
        }
        let want = std::fs::read_to_string(&out_path).unwrap_or_default();
        if got != want {
            failures.push(format!(
                "{}: output differs from {out_path}:\n{got}",
                input.display()
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} golden files differ (BLESS=1 to regenerate and review):\n{}",
        failures.len(),
        inputs.len(),
        failures.join("\n")
    );
}
