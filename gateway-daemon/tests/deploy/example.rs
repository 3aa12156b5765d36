//! The GatewayClass and the example: every route accepted, with a port.

use super::*;

pub(super) const CONTROLLER: &str = "berth.dev/gateway-controller";

pub(super) fn condition_true(conditions: &Value, kind: &str) -> Result<(), String> {
    let c = conditions
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == kind);
    match c {
        Some(c) if c["status"] == "True" => Ok(()),
        Some(c) => Err(format!(
            "{kind}={} ({}: {})",
            c["status"], c["reason"], c["message"]
        )),
        None => Err(format!("no {kind} condition")),
    }
}

pub(super) fn example_errors(d: &Deploy) -> Vec<String> {
    let mut e = Vec::new();
    let ours: BTreeSet<&str> = d
        .of_kind("GatewayClass")
        .filter(|c| c.str("/spec/controllerName") == CONTROLLER)
        .map(|c| c.name())
        .collect();
    if ours.is_empty() {
        e.push(format!(
            "no GatewayClass with controllerName {CONTROLLER} in deploy/"
        ));
    }
    for gw in d.of_kind("Gateway") {
        let class = gw.str("/spec/gatewayClassName");
        if !ours.contains(class) {
            e.push(format!(
                "{}: gatewayClassName {class} is not a GatewayClass of ours in deploy/",
                gw.at()
            ));
        }
    }

    // Plan the GatewayClasses and the example as `berth check` would.
    let mut files = Vec::new();
    for doc in d
        .docs
        .iter()
        .filter(|doc| doc.kind() == "GatewayClass" || doc.file.starts_with("example/"))
    {
        let text = serde_yaml::to_string(&doc.value).expect("YAML");
        let parsed = berth::manifests::parse_file(Path::new(&doc.file), &text);
        for err in &parsed.errors {
            e.push(format!("{}: berth cannot read it: {err}", doc.at()));
        }
        files.push(parsed);
    }
    let snapshot = berth::manifests::snapshot(&files);
    let plan = berth::planner::plan(&berth::planner::Input {
        snapshot: &snapshot,
        claims: &Default::default(),
        now: SystemTime::now(),
        default_addresses: berth::planner::DefaultAddresses::default(),
        ephemeral_ports: None,
        snat_ports: berth::planner::DEFAULT_SNAT_PORTS,
        capacity: Default::default(),
        allocate: true,
    });
    // Pods on every node are the backends: the example's routes are in SNAT mode.
    let services = &plan.datapath.services;
    let routed: Vec<String> = services
        .keys()
        .filter(|s| !plan.datapath.source_nat.contains(*s))
        .map(ToString::to_string)
        .collect();
    if services.is_empty() || !routed.is_empty() {
        e.push(format!(
            "the example's services must all be in SNAT mode (GatewayConfig sourceNAT: \
             true); of {} these are not: {routed:?}",
            services.len()
        ));
    }
    let state = serde_json::to_value(berth::state_document::document(&plan)).expect("state");
    let example = |kind: &'static str| -> Vec<&Doc> {
        d.of_kind(kind)
            .filter(|doc| doc.file.starts_with("example/"))
            .collect()
    };
    for gw in example("Gateway") {
        let Some(status) = state["gateways"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|g| {
                g["name"] == gw.name()
                    && Some(g["namespace"].as_str().unwrap_or("")) == gw.namespace()
            })
            .map(|g| &g["status"])
        else {
            e.push(format!("{}: berth does not handle it", gw.at()));
            continue;
        };
        for kind in ["Accepted", "Programmed"] {
            if let Err(why) = condition_true(&status["conditions"], kind) {
                e.push(format!("{}: {why}", gw.at()));
            }
        }
        for listener in status["listeners"].as_array().into_iter().flatten() {
            for kind in ["Accepted", "Programmed", "ResolvedRefs"] {
                if let Err(why) = condition_true(&listener["conditions"], kind) {
                    e.push(format!("{}: listener {}: {why}", gw.at(), listener["name"]));
                }
            }
        }
    }
    let routes: Vec<&Doc> = example("TCPRoute")
        .into_iter()
        .chain(example("UDPRoute"))
        .collect();
    if routes.is_empty() {
        e.push("the example has no TCPRoute or UDPRoute".to_string());
    }
    for route in routes {
        let entry = state["routes"].as_array().into_iter().flatten().find(|r| {
            r["kind"] == route.kind()
                && r["name"] == route.name()
                && Some(r["namespace"].as_str().unwrap_or("")) == route.namespace()
        });
        let parents = entry
            .and_then(|r| r["status"]["parents"].as_array())
            .cloned()
            .unwrap_or_default();
        let refs = route.value["spec"]["parentRefs"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        if parents.len() != refs.len() {
            e.push(format!(
                "{}: {} parentRefs but {} parent statuses from berth",
                route.at(),
                refs.len(),
                parents.len()
            ));
        }
        for parent in &parents {
            for kind in ["Accepted", "ResolvedRefs"] {
                if let Err(why) = condition_true(&parent["conditions"], kind) {
                    e.push(format!("{}: {why}", route.at()));
                }
            }
        }
        for r in &refs {
            let Some(port) = r["port"].as_u64() else {
                continue;
            };
            let granted = state["claims"].as_array().into_iter().flatten().any(|c| {
                c["route"]["name"] == route.name()
                    && c["route"]["kind"] == route.kind()
                    && c["port"] == port
            });
            if !granted {
                e.push(format!(
                    "{}: asks for port {port} but does not get it",
                    route.at()
                ));
            }
        }
    }
    e
}
