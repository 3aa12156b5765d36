//! Kubernetes mode against Kubernetes' own binaries (built by `cargo xtask setup` at
//! the versions in `kube-toolchain`): a real kube-apiserver with RBAC and
//! kube-controller-manager's EndpointSlice controller (`berth_tests::kube`). The
//! Gateway API v1.6.1 CRDs come from `../shared` (never copied here); Berth's CRDs,
//! namespace, ServiceAccount, RBAC and GatewayClass from `deploy/`, applied as a user
//! applies them. Berth runs as its ServiceAccount, so a permission `deploy/rbac.yaml`
//! lacks fails these tests. Backends are Pods whose status the test sets (the kubelet's
//! part), so their EndpointSlices are the real controller's. Needs root.

use std::time::Duration;

use berth_tests::kube::{
    api_for, apply_files, apply_yaml, condition, delete, eventually, install, our_parent, repo,
    tail, Berth, ControlPlane, BERTH_USER, NODE,
};
use kube::{
    api::{DynamicObject, ListParams},
    Api, Client,
};
use serde_json::{json, Value};

/// The Gateway's TCP range.
const RANGE: std::ops::RangeInclusive<u64> = 30000..=30999;
/// How long Berth may take to settle after the objects exist (it lists every kind,
/// wins the Lease, plans and writes).
const SETTLE: Duration = Duration::from_secs(60);

/// The cluster's side of the scenario: a Node for the pods and the namespaces; then
/// `examples/gateway.yaml`, the operator's Gateway whose TCP and UDP listeners are
/// port ranges (GatewayConfig `shared-l4`, 30000-30999).
const CLUSTER: &str = r#"
apiVersion: v1
kind: Node
metadata:
  name: berth-test-node
---
apiVersion: v1
kind: Namespace
metadata: {name: infra}
---
apiVersion: v1
kind: Namespace
metadata: {name: team-a}
---
apiVersion: v1
kind: Namespace
metadata: {name: team-b}
"#;

/// One team's application: a Service with one port named `port_name` (`""`: unnamed,
/// as most Services have), a Pod behind it, and a TCPRoute to the Gateway's range
/// listener.
fn team(namespace: &str, port_name: &str) -> String {
    let name = if port_name.is_empty() {
        String::new()
    } else {
        format!("name: {port_name}\n    ")
    };
    format!(
        r#"
apiVersion: v1
kind: Service
metadata: {{name: echo, namespace: {namespace}}}
spec:
  selector: {{app: echo}}
  ports:
  - {name}port: 80
    targetPort: 8080
    protocol: TCP
---
apiVersion: v1
kind: Pod
metadata:
  name: echo-0
  namespace: {namespace}
  labels: {{app: echo}}
spec:
  nodeName: {NODE}
  containers:
  - name: echo
    image: registry.invalid/echo:1
    ports: [{{containerPort: 8080}}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: TCPRoute
metadata: {{name: echo, namespace: {namespace}}}
spec:
  parentRefs:
  - {{name: shared, namespace: infra, sectionName: tcp-pool}}
  rules:
  - backendRefs:
    - {{name: echo, port: 80}}
"#
    )
}

/// The teams and their pods' addresses.
const TEAMS: [(&str, &str); 2] = [("team-a", "10.244.1.10"), ("team-b", "10.244.2.10")];

/// Sets a pod's status as the kubelet would once its container runs, ready or not.
async fn pod_running(client: &Client, namespace: &str, name: &str, ip: &str, ready: bool) {
    let ready = if ready { "True" } else { "False" };
    let (pods, _) = api_for(client, "v1", "Pod", Some(namespace))
        .await
        .expect("the pods API");
    let status = json!({"status": {
        "phase": "Running",
        "hostIP": "192.0.2.1",
        "podIP": ip,
        "podIPs": [{"ip": ip}],
        "conditions": [
            {"type": "Initialized", "status": "True"},
            {"type": "ContainersReady", "status": ready},
            {"type": "Ready", "status": ready},
        ],
    }});
    pods.patch_status(
        name,
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(&status),
    )
    .await
    .unwrap_or_else(|e| panic!("setting the status of pod {namespace}/{name}: {e}"));
}

/// The scenario: a control plane with Berth installed, the Gateway, both teams'
/// Services (one unnamed port), running Pods and TCPRoutes, and `berth run
/// --kubernetes` started.
fn two_teams() -> (ControlPlane, Berth) {
    two_teams_with("")
}

/// `two_teams` with the Services' port named `port_name`.
fn two_teams_with(port_name: &'static str) -> (ControlPlane, Berth) {
    let mut cp = two_teams_cluster(port_name);
    let berth = cp.start_berth();
    (cp, berth)
}

/// The control plane and objects of `two_teams_with`, Berth not started.
fn two_teams_cluster(port_name: &'static str) -> ControlPlane {
    let cp = ControlPlane::start("kr");
    cp.block_on(|client| async move {
        install(&client).await;
        apply_yaml(&client, CLUSTER).await;
        apply_files(&client, &[repo().join("examples/gateway.yaml")]).await;
        for (namespace, ip) in TEAMS {
            // A Pod waits for its namespace's default ServiceAccount (the controller
            // manager creates it): `apply` retries.
            apply_yaml(&client, &team(namespace, port_name)).await;
            pod_running(&client, namespace, "echo-0", ip, true).await;
        }
    });
    cp
}

/// The TCPRoutes of `namespace`.
async fn tcp_routes(client: &Client, namespace: &str) -> Api<DynamicObject> {
    let (routes, _) = api_for(
        client,
        "gateway.networking.k8s.io/v1",
        "TCPRoute",
        Some(namespace),
    )
    .await
    .unwrap_or_else(|e| panic!("the TCPRoutes API: {e}"));
    routes
}

/// Our entry in route `namespace/name`'s `status.parents`.
async fn our_entry(client: &Client, namespace: &str, name: &str) -> Result<Value, String> {
    let route = tcp_routes(client, namespace)
        .await
        .get(name)
        .await
        .map_err(|e| e.to_string())?;
    let route = serde_json::to_value(&route).expect("JSON");
    our_parent(&route)
        .cloned()
        .ok_or(format!("{namespace}/{name}: no status of ours"))
}

/// Route `namespace/name`'s port, if it is Accepted with a port in status.
async fn port_in_status(client: &Client, namespace: &str, name: &str) -> Result<u64, String> {
    let entry = &our_entry(client, namespace, name).await?;
    let accepted = condition(entry, "Accepted").ok_or("no Accepted")?;
    if accepted["status"] != "True" {
        return Err(format!("{namespace}/{name}: {accepted}"));
    }
    entry["parentRef"]["port"]
        .as_u64()
        .ok_or(format!("{namespace}/{name}: no port in {entry}"))
}

/// Both routes' ports, if both are Accepted with a port in status.
async fn ports_in_status(client: &Client) -> Result<Vec<(String, u64)>, String> {
    let mut out = Vec::new();
    for (namespace, _) in TEAMS {
        out.push((
            namespace.to_string(),
            port_in_status(client, namespace, "echo").await?,
        ));
    }
    Ok(out)
}

/// Both routes' ports, once both are Accepted with a port in status.
async fn assigned_ports(client: &Client) -> Vec<(String, u64)> {
    eventually(
        "both TCPRoutes Accepted with a port in status",
        SETTLE,
        || ports_in_status(client),
    )
    .await
}

/// A request in the audit log, as `verb resource[/subresource] URI`.
fn request(e: &Value) -> String {
    let o = &e["objectRef"];
    let sub = o["subresource"]
        .as_str()
        .map(|s| format!("/{s}"))
        .unwrap_or_default();
    format!(
        "{} {}{} {}",
        e["verb"].as_str().unwrap_or_default(),
        o["resource"].as_str().unwrap_or_default(),
        sub,
        e["requestURI"].as_str().unwrap_or_default()
    )
}

/// The requests Berth's ServiceAccount made so far, and those of them refused.
fn berth_requests(cp: &ControlPlane) -> (Vec<String>, Vec<String>) {
    let audit = cp.audit();
    let berths = audit.iter().filter(|e| e["user"]["username"] == BERTH_USER);
    let made = berths.clone().map(request).collect();
    let denied = berths
        .filter(|e| e["responseStatus"]["code"] == 403)
        .map(request)
        .collect();
    (made, denied)
}

#[test]
fn routes_from_two_namespaces_get_ports_in_status_and_port_claims() {
    let (cp, berth) = two_teams();
    cp.block_on(|client| async move {
        let ports = assigned_ports(&client).await;
        for (namespace, port) in &ports {
            assert!(
                RANGE.contains(port),
                "{namespace}/echo got port {port}, outside the range"
            );
        }
        assert_ne!(
            ports[0].1, ports[1].1,
            "both routes got one port: {ports:?}"
        );

        // One PortClaim per route, named after the port, recording the route.
        let (claims, _) = api_for(&client, "berth.dev/v1alpha1", "PortClaim", Some("infra"))
            .await
            .expect("the PortClaims API");
        let list = claims
            .list(&ListParams::default())
            .await
            .expect("PortClaims");
        let mut seen: Vec<(String, u64, String, String)> = list
            .items
            .iter()
            .map(|c| {
                let v = serde_json::to_value(c).expect("JSON");
                (
                    v["metadata"]["name"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                    v["spec"]["port"].as_u64().unwrap_or_default(),
                    v["spec"]["route"]["namespace"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                    v["status"]["phase"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                )
            })
            .collect();
        seen.sort();
        let mut want: Vec<(String, u64, String, String)> = ports
            .iter()
            .map(|(ns, port)| {
                (
                    format!("shared-tcp-{port}"),
                    *port,
                    ns.clone(),
                    "Bound".into(),
                )
            })
            .collect();
        want.sort();
        assert_eq!(
            seen, want,
            "PortClaims (name, port, route namespace, phase)"
        );

        // The Gateway counts both routes on its range listener.
        let (gateways, _) = api_for(
            &client,
            "gateway.networking.k8s.io/v1",
            "Gateway",
            Some("infra"),
        )
        .await
        .expect("the Gateways API");
        let attached = eventually("the listener counts both routes", SETTLE, || async {
            let g = gateways.get("shared").await.map_err(|e| e.to_string())?;
            let g = serde_json::to_value(&g).expect("JSON");
            let n = g["status"]["listeners"][0]["attachedRoutes"].as_u64();
            (n == Some(2))
                .then_some(g)
                .ok_or(format!("attachedRoutes {n:?}"))
        })
        .await;
        let accepted = condition(&attached["status"], "Accepted").expect("Gateway Accepted");
        assert_eq!(accepted["status"], "True", "Gateway {accepted}");
    });
    drop(berth);
}

/// Every request `berth run --kubernetes` made as its ServiceAccount was allowed by
/// `deploy/rbac.yaml` (the API server's audit log says so), and it made the writes the
/// allocator makes: a PortClaim, route status, Gateway status, the Lease.
#[test]
fn berth_service_account_is_allowed_everything_berth_does() {
    let (cp, berth) = two_teams();
    // Until both routes have their ports; a refusal fails at once, naming the request.
    let (plane, daemon) = (&cp, &berth);
    cp.block_on(move |client| async move {
        let (cp, berth) = (plane, daemon);
        eventually(
            "both TCPRoutes Accepted with a port in status",
            SETTLE,
            || async {
                let (_, denied) = berth_requests(cp);
                assert!(
                    denied.is_empty(),
                    "deploy/rbac.yaml denies berth: {denied:#?}\nberth's log:\n{}",
                    tail(&berth.log, 20)
                );
                ports_in_status(&client).await
            },
        )
        .await
    });
    // Gateway and class status, the Lease and the watches follow the claims: wait until
    // the audit log shows every kind of request, then no refusal may be among them.
    const WANT: [&str; 6] = [
        "create portclaims ",
        "update tcproutes/status ",
        "patch gateways/status ",
        "patch gatewayclasses/status ",
        "create leases ",
        "watch endpointslices ",
    ];
    let deadline = std::time::Instant::now() + SETTLE;
    loop {
        let (made, _) = berth_requests(&cp);
        let missing: Vec<&str> = WANT
            .iter()
            .filter(|w| !made.iter().any(|m| m.starts_with(*w)))
            .map(|w| w.trim())
            .collect();
        if missing.is_empty() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "berth made no {missing:?} request in {SETTLE:?}; it made:\n{made:#?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let (_, denied) = berth_requests(&cp);
    assert!(
        denied.is_empty(),
        "deploy/rbac.yaml denies berth: {denied:#?}\nberth's log:\n{}",
        tail(&berth.log, 20)
    );
    // The API server's refusal says "forbidden" (a bare "403" would also match the
    // microseconds of a timestamp).
    let log = std::fs::read_to_string(&berth.log).unwrap_or_default();
    assert!(
        !log.to_lowercase().contains("forbidden"),
        "berth's log shows a refusal:\n{}",
        tail(&berth.log, 30)
    );
}

/// The real EndpointSlice controller names the port of a Service's one unnamed port
/// `""`; Berth must match it to the backendRef's port and program the pod.
#[test]
fn unnamed_service_port_gets_backends_from_the_real_endpoint_slice() {
    each_route_gets_its_pod_as_backend("");
}

/// A named Service port: the controller's EndpointSlice port carries the name (the
/// control for the unnamed case above: the same harness, one difference).
#[test]
fn named_service_port_gets_backends_from_the_real_endpoint_slice() {
    each_route_gets_its_pod_as_backend("tcp");
}

/// Both teams with their Services' port named `port_name`: the controller's
/// EndpointSlices hold the pod, ready, with that port name; Berth programs each route's
/// pod as its one backend.
fn each_route_gets_its_pod_as_backend(port_name: &'static str) {
    let (mut cp, mut berth) = two_teams_with(port_name);
    cp.block_on(|client| async move {
        assigned_ports(&client).await;
        for (namespace, ip) in TEAMS {
            let (slices, _) = api_for(
                &client,
                "discovery.k8s.io/v1",
                "EndpointSlice",
                Some(namespace),
            )
            .await
            .expect("the EndpointSlices API");
            let slice = eventually(
                "the controller's EndpointSlice with the pod",
                SETTLE,
                || {
                    let slices = slices.clone();
                    async move {
                        let list = slices
                            .list(&ListParams::default().labels("kubernetes.io/service-name=echo"))
                            .await
                            .map_err(|e| e.to_string())?;
                        let v = serde_json::to_value(&list.items).expect("JSON");
                        let has = v.as_array().into_iter().flatten().find(|s| {
                            s["endpoints"][0]["addresses"][0] == ip
                                && s["endpoints"][0]["conditions"]["ready"] == true
                        });
                        has.cloned().ok_or(format!("slices: {v}"))
                    }
                },
            )
            .await;
            assert_eq!(
                slice["ports"],
                json!([{"name": port_name, "port": 8080, "protocol": "TCP"}]),
                "{namespace}: the controller's EndpointSlice ports for Service port {port_name:?}"
            );
        }
    });
    wait_backends(&mut cp, &mut berth, &[("team-a", 1), ("team-b", 1)]);
}

/// Waits until `berth get routes` shows each route (by namespace) with the number of
/// backends given.
fn wait_backends(cp: &mut ControlPlane, berth: &mut Berth, want: &[(&str, usize)]) {
    let want: Vec<(String, usize)> = want.iter().map(|(ns, n)| (ns.to_string(), *n)).collect();
    let deadline = std::time::Instant::now() + SETTLE;
    loop {
        let rows = cp.berth_routes(berth).expect("berth get routes");
        let mut backends: Vec<(String, usize)> = rows
            .iter()
            .map(|r| (r.namespace.clone(), r.backends))
            .collect();
        backends.sort();
        if backends == want {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "routes' backends (namespace, count) should be {want:?}: {backends:?}\nberth's log:\n{}",
            tail(&berth.log, 30)
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// A pod turning not ready leaves its EndpointSlice as not ready (the real controller
/// keeps it, `ready: false`), and Berth takes it out of its route's backends; the other
/// team's route is untouched.
#[test]
fn pod_turning_not_ready_leaves_its_route_without_backends() {
    let (mut cp, mut berth) = two_teams_with("tcp");
    wait_backends(&mut cp, &mut berth, &[("team-a", 1), ("team-b", 1)]);
    let (namespace, ip) = TEAMS[0];
    cp.block_on(|client| async move {
        pod_running(&client, namespace, "echo-0", ip, false).await;
    });
    wait_backends(&mut cp, &mut berth, &[("team-a", 0), ("team-b", 1)]);
}

/// Another controller's entry in a route's `status.parents` (there before Berth
/// starts, as another Gateway implementation would have written it) is kept when
/// Berth adds its own: the list is atomic, so a careless write would drop it.
#[test]
fn another_controllers_status_entry_is_kept() {
    let mut cp = two_teams_cluster("");
    let other = json!({
        "parentRef": {"group": "gateway.networking.k8s.io", "kind": "Gateway",
                      "name": "other", "namespace": "infra"},
        "controllerName": "example.com/other-controller",
        "conditions": [{
            "type": "Accepted", "status": "True", "reason": "Accepted",
            "message": "accepted by another implementation", "observedGeneration": 1,
            "lastTransitionTime": "2026-01-01T00:00:00Z",
        }],
    });
    let written = other.clone();
    cp.block_on(|client| async move {
        let status = json!({"status": {"parents": [written]}});
        tcp_routes(&client, "team-a")
            .await
            .patch_status(
                "echo",
                &Default::default(),
                &kube::api::Patch::Merge(&status),
            )
            .await
            .expect("writing the other controller's status");
    });
    let _berth = cp.start_berth();
    cp.block_on(|client| async move {
        assigned_ports(&client).await;
        let route = tcp_routes(&client, "team-a").await.get("echo").await;
        let route = serde_json::to_value(route.expect("the route")).expect("JSON");
        let kept = route["status"]["parents"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|p| p["controllerName"] == other["controllerName"]);
        assert_eq!(
            kept,
            Some(&other),
            "the other controller's entry, after Berth wrote its own: {}",
            route["status"]
        );
    });
}

/// A second TCPRoute of team A to the range listener, to the same Service.
const SECOND_ROUTE: &str = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: TCPRoute
metadata: {name: echo-2, namespace: team-a}
spec:
  parentRefs:
  - {name: shared, namespace: infra, sectionName: tcp-pool}
  rules:
  - backendRefs:
    - {name: echo, port: 80}
"#;

/// kube-apiserver killed and started again under a running Berth: its watches
/// reconnect, the ports it assigned stay, and a route created afterwards gets a port
/// of its own. (Seen here: for a moment after it is ready the new API server refuses
/// Berth's watches with 403, its RBAC caches not yet filled; Berth retries.)
#[test]
fn berth_carries_on_after_the_api_server_restarts() {
    let (mut cp, berth) = two_teams();
    let before = cp.block_on(|client| async move { assigned_ports(&client).await });
    cp.restart_apiserver();
    let (after, new_port) = cp.block_on(|client| async move {
        apply_yaml(&client, SECOND_ROUTE).await;
        let port = eventually("the new route Accepted with a port", SETTLE, || {
            port_in_status(&client, "team-a", "echo-2")
        })
        .await;
        (ports_in_status(&client).await, port)
    });
    assert_eq!(after, Ok(before.clone()), "ports across the restart");
    let taken: Vec<u64> = before.iter().map(|(_, p)| *p).collect();
    assert!(
        RANGE.contains(&new_port) && !taken.contains(&new_port),
        "the new route got port {new_port}, beside {taken:?}; berth's log:\n{}",
        tail(&berth.log, 20)
    );
}

/// Team B's route to team A's Service (a cross-namespace backendRef).
const CROSS_ROUTE: &str = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: TCPRoute
metadata: {name: cross, namespace: team-b}
spec:
  parentRefs:
  - {name: shared, namespace: infra, sectionName: tcp-pool}
  rules:
  - backendRefs:
    - {name: echo, namespace: team-a, port: 80}
"#;

/// Team A's grant: TCPRoutes of team B may name its Services.
const GRANT: &str = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: ReferenceGrant
metadata: {name: from-team-b, namespace: team-a}
spec:
  from:
  - {group: gateway.networking.k8s.io, kind: TCPRoute, namespace: team-b}
  to:
  - {group: "", kind: Service}
"#;

/// Route `namespace/name`'s ResolvedRefs condition (status, reason) in our entry.
async fn resolved_refs(
    client: &Client,
    namespace: &str,
    name: &str,
) -> Result<(String, String), String> {
    let entry = our_entry(client, namespace, name).await?;
    let c = condition(&entry, "ResolvedRefs").ok_or("no ResolvedRefs")?;
    Ok((
        c["status"].as_str().unwrap_or_default().to_string(),
        c["reason"].as_str().unwrap_or_default().to_string(),
    ))
}

/// Waits until route `namespace/name` says ResolvedRefs `want` (status, reason).
async fn wait_resolved_refs(client: &Client, namespace: &str, name: &str, want: (&str, &str)) {
    let what = format!("{namespace}/{name} ResolvedRefs {want:?}");
    eventually(&what, SETTLE, || async {
        let got = resolved_refs(client, namespace, name).await?;
        (got.0 == want.0 && got.1 == want.1)
            .then_some(())
            .ok_or(format!("{got:?}"))
    })
    .await
}

/// A cross-namespace backendRef is refused (RefNotPermitted) until the Service's
/// namespace grants it with a ReferenceGrant, resolved once the grant is there, and
/// refused again once it is deleted; the route keeps its port throughout.
#[test]
fn reference_grant_added_and_removed() {
    let (cp, _berth) = two_teams();
    cp.block_on(|client| async move {
        apply_yaml(&client, CROSS_ROUTE).await;
        wait_resolved_refs(&client, "team-b", "cross", ("False", "RefNotPermitted")).await;
        let port = port_in_status(&client, "team-b", "cross")
            .await
            .expect("a route refused its backend still holds its port");
        apply_yaml(&client, GRANT).await;
        wait_resolved_refs(&client, "team-b", "cross", ("True", "ResolvedRefs")).await;
        delete(
            &client,
            "gateway.networking.k8s.io/v1",
            "ReferenceGrant",
            Some("team-a"),
            "from-team-b",
        )
        .await;
        wait_resolved_refs(&client, "team-b", "cross", ("False", "RefNotPermitted")).await;
        assert_eq!(
            port_in_status(&client, "team-b", "cross").await,
            Ok(port),
            "the route's port after the grant came and went"
        );
    });
}
