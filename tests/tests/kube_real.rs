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

/// Polls `check` every 200 ms for up to `SETTLE` (see `berth_tests::netns::settle`).
fn settle<T, E>(check: impl FnMut() -> Result<T, E>, why: impl FnOnce(E) -> String) -> T {
    berth_tests::netns::settle(SETTLE, Duration::from_millis(200), check, why)
}

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
    pod_running_with(client, namespace, name, &[ip], ready).await;
}

/// `pod_running` for a pod with an address of each of its families (`ips`).
async fn pod_running_with(client: &Client, namespace: &str, name: &str, ips: &[&str], ready: bool) {
    let ready = if ready { "True" } else { "False" };
    let (pods, _) = api_for(client, "v1", "Pod", Some(namespace))
        .await
        .expect("the pods API");
    let pod_ips: Vec<Value> = ips.iter().map(|ip| json!({"ip": ip})).collect();
    let status = json!({"status": {
        "phase": "Running",
        "hostIP": "192.0.2.1",
        "podIP": ips[0],
        "podIPs": pod_ips,
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
    settle(
        || {
            let (made, _) = berth_requests(&cp);
            let missing: Vec<&str> = WANT
                .iter()
                .filter(|w| !made.iter().any(|m| m.starts_with(*w)))
                .map(|w| w.trim())
                .collect();
            if missing.is_empty() {
                Ok(())
            } else {
                Err((missing, made))
            }
        },
        |(missing, made)| {
            format!("berth made no {missing:?} request in {SETTLE:?}; it made:\n{made:#?}")
        },
    );
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
    let log = berth.log.clone();
    settle(
        || {
            let rows = cp.berth_routes(berth).expect("berth get routes");
            let mut backends: Vec<(String, usize)> = rows
                .iter()
                .map(|r| (r.namespace.clone(), r.backends))
                .collect();
            backends.sort();
            if backends == want {
                Ok(())
            } else {
                Err(backends)
            }
        },
        |backends| {
            format!(
                "routes' backends (namespace, count) should be {want:?}: {backends:?}\n\
                 berth's log:\n{}",
                tail(&log, 30)
            )
        },
    );
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

/// A RouteTrafficPolicy of team A's route, and one with a bad value.
const POLICIES: &str = "\
apiVersion: berth.dev/v1alpha1
kind: RouteTrafficPolicy
metadata: {name: sticky, namespace: team-a}
spec:
  targetRefs: [{group: gateway.networking.k8s.io, kind: TCPRoute, name: echo}]
  sessionAffinity: {type: ClientIP}
---
apiVersion: berth.dev/v1alpha1
kind: RouteTrafficPolicy
metadata: {name: hasty, namespace: team-a}
spec:
  targetRefs: [{group: gateway.networking.k8s.io, kind: TCPRoute, name: echo}]
  tcpIdleTimeout: soon
";

/// Berth's policies report their status per target in a real cluster (server-side
/// applied by the allocator, as deploy/rbac.yaml allows): accepted, or why not, naming
/// the field.
#[test]
fn route_traffic_policies_report_their_status_per_target() {
    let (cp, _berth) = two_teams();
    cp.block_on(|client| async move {
        assigned_ports(&client).await;
        apply_yaml(&client, POLICIES).await;
        let (policies, _) = api_for(
            &client,
            "berth.dev/v1alpha1",
            "RouteTrafficPolicy",
            Some("team-a"),
        )
        .await
        .expect("the RouteTrafficPolicies API");
        for (name, want, message) in [
            ("sticky", ("True", "Accepted"), "session affinity"),
            (
                "hasty",
                ("False", "Invalid"),
                "spec.tcpIdleTimeout \"soon\"",
            ),
        ] {
            let policies = &policies;
            eventually(&format!("{name}'s status"), SETTLE, || async move {
                let p = policies.get(name).await.map_err(|e| e.to_string())?;
                let v = serde_json::to_value(&p).expect("JSON");
                let a = &v["status"]["ancestors"][0];
                let c = &a["conditions"][0];
                let ok = a["ancestorRef"]["name"] == "echo"
                    && a["controllerName"] == "berth.dev/gateway-controller"
                    && c["type"] == "Accepted"
                    && (c["status"].as_str(), c["reason"].as_str()) == (Some(want.0), Some(want.1))
                    && c["message"].as_str().is_some_and(|m| m.contains(message));
                ok.then_some(()).ok_or(format!("{}", v["status"]))
            })
            .await;
        }
    });
}

/// The holder of the allocators' Lease (`berth-system/berth-allocator`), if any.
async fn lease_holder(client: &Client) -> Option<String> {
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(client.clone(), "berth-system");
    let lease = leases.get_opt("berth-allocator").await.ok()??;
    lease.spec?.holder_identity
}

/// Two daemons (two nodes of a DaemonSet) elect one allocator through the Lease. The
/// leader killed (SIGKILL, as a node dies), its lease runs out and the other takes
/// over: the ports already in status stay, a new route gets one from the new leader,
/// and the survivor serves every route meanwhile.
#[test]
fn two_daemons_elect_one_allocator_and_the_survivor_takes_over() {
    let mut cp = two_teams_cluster("");
    let mut first = cp.start_berth();
    let leader = first.node.clone();
    cp.block_on(|client| async move {
        eventually("the first daemon holds the Lease", SETTLE, || async {
            match lease_holder(&client).await {
                Some(h) if h == leader => Ok(()),
                other => Err(format!("holder {other:?}")),
            }
        })
        .await;
    });
    let mut second = cp.start_berth_on(1);
    let ports = cp.block_on(|client| async move { assigned_ports(&client).await });
    // The follower programs what the leader's claims say.
    let want: Vec<u64> = ports.iter().map(|(_, p)| *p).collect();
    let log = second.log.clone();
    settle(
        || {
            let rows = cp.berth_routes(&mut second).unwrap_or_default();
            let served: Vec<u64> = rows.iter().filter_map(|r| r.port.map(u64::from)).collect();
            if want.iter().all(|p| served.contains(p)) {
                Ok(())
            } else {
                Err(served)
            }
        },
        |served| {
            format!(
                "the second daemon serves ports {served:?}, not {want:?}; its log:\n{}",
                tail(&log, 20)
            )
        },
    );
    let (holder, follower) = (first.node.clone(), second.node.clone());
    cp.block_on(|client| async move {
        assert_eq!(
            lease_holder(&client).await,
            Some(holder),
            "the Lease changed hands while its holder ran"
        );
    });

    first.kill();
    let killed = std::time::Instant::now();
    let after = cp.block_on(|client| async move {
        eventually("the second daemon holds the Lease", SETTLE, || async {
            match lease_holder(&client).await {
                Some(h) if h == follower => Ok(()),
                other => Err(format!("holder {other:?}")),
            }
        })
        .await;
        let took = killed.elapsed();
        apply_yaml(&client, SECOND_ROUTE).await;
        let new = eventually("the new route gets a port", SETTLE, || {
            port_in_status(&client, "team-a", "echo-2")
        })
        .await;
        (took, new, ports_in_status(&client).await)
    });
    let (took, new, kept) = after;
    eprintln!("the survivor held the Lease {took:?} after the leader was killed");
    assert_eq!(kept, Ok(ports.clone()), "ports after the takeover");
    assert!(
        RANGE.contains(&new) && ports.iter().all(|(_, p)| *p != new),
        "the new route's port {new} (the others hold {ports:?})"
    );
    cp.berth_routes(&mut second).expect("the survivor answers");
}

/// Team A's second application: a Service with two named ports and its Pod, and one
/// TCPRoute per Service port.
const MULTI: &str = r#"
apiVersion: v1
kind: Service
metadata: {name: multi, namespace: team-a}
spec:
  selector: {app: multi}
  ports:
  - {name: http, port: 80, targetPort: 8080, protocol: TCP}
  - {name: metrics, port: 81, targetPort: 9090, protocol: TCP}
---
apiVersion: v1
kind: Pod
metadata:
  name: multi-0
  namespace: team-a
  labels: {app: multi}
spec:
  nodeName: berth-test-node
  containers:
  - name: multi
    image: registry.invalid/multi:1
    ports: [{containerPort: 8080}, {containerPort: 9090}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: TCPRoute
metadata: {name: multi-http, namespace: team-a}
spec:
  parentRefs:
  - {name: shared, namespace: infra, sectionName: tcp-pool}
  rules:
  - backendRefs:
    - {name: multi, port: 80}
---
apiVersion: gateway.networking.k8s.io/v1
kind: TCPRoute
metadata: {name: multi-metrics, namespace: team-a}
spec:
  parentRefs:
  - {name: shared, namespace: infra, sectionName: tcp-pool}
  rules:
  - backendRefs:
    - {name: multi, port: 81}
"#;

/// The address of `multi-0`.
const MULTI_IP: &str = "10.244.1.20";

/// Polls until `berth`'s datapath sends new flows of each (gateway port, endpoints)
/// pair given to exactly those endpoints, and its `get routes` counts each (route,
/// backends) pair given; panics with both after `SETTLE`.
fn wait_datapath(
    cp: &mut ControlPlane,
    berth: &mut Berth,
    tables: &[(u64, Vec<String>)],
    routes: &[(&str, usize)],
) {
    settle(
        || {
            let have = berth.tables();
            let by_port = |port: u64| -> Vec<String> {
                have.iter()
                    .find(|(s, _)| u64::from(s.port) == port)
                    .map(|(_, e)| e.iter().map(|e| e.to_string()).collect())
                    .unwrap_or_default()
            };
            let rows = cp.berth_routes(berth).unwrap_or_default();
            let count = |name: &str| {
                rows.iter()
                    .find(|r| r.namespace == "team-a" && r.name == name)
                    .map(|r| r.backends)
            };
            let tables_ok = tables.iter().all(|(port, want)| &by_port(*port) == want);
            let routes_ok = routes.iter().all(|(name, n)| count(name) == Some(*n));
            if tables_ok && routes_ok {
                return Ok(());
            }
            let counts: Vec<(String, usize)> =
                rows.iter().map(|r| (r.name.clone(), r.backends)).collect();
            Err((have, counts))
        },
        |(have, counts)| {
            format!(
                "after {SETTLE:?}: tables {have:?} (want {tables:?}); routes {counts:?} \
                 (want {routes:?})"
            )
        },
    );
}

/// A Service with two named ports: each route gets the pod on its own target port
/// (the controller's EndpointSlice lists both). The pod deleted: while it terminates
/// and still serves (the controller marks it `terminating`, `serving`), it takes no new
/// flows (out of both tables; BACKENDS counts the backends taking new flows) and keeps
/// the flows it has (weight 0: `tests/tests/backends.rs` has the connections); once
/// gone, both routes have none.
#[test]
fn several_ports_and_a_terminating_pod() {
    let mut cp = two_teams_cluster("");
    let mut berth = cp.start_berth();
    let ports = cp.block_on(|client| async move {
        apply_yaml(&client, MULTI).await;
        pod_running(&client, "team-a", "multi-0", MULTI_IP, true).await;
        let mut ports = Vec::new();
        for route in ["multi-http", "multi-metrics"] {
            ports.push(
                eventually("the route gets a port", SETTLE, || {
                    port_in_status(&client, "team-a", route)
                })
                .await,
            );
        }
        ports
    });
    let (http, metrics) = (ports[0], ports[1]);
    wait_datapath(
        &mut cp,
        &mut berth,
        &[
            (http, vec![format!("{MULTI_IP}:8080")]),
            (metrics, vec![format!("{MULTI_IP}:9090")]),
        ],
        &[("multi-http", 1), ("multi-metrics", 1)],
    );

    cp.block_on(|client| async move {
        let (pods, _) = api_for(&client, "v1", "Pod", Some("team-a"))
            .await
            .expect("the pods API");
        // No kubelet confirms the deletion: the pod stays terminating.
        pods.delete("multi-0", &Default::default())
            .await
            .expect("deleting the pod");
        let (slices, _) = api_for(
            &client,
            "discovery.k8s.io/v1",
            "EndpointSlice",
            Some("team-a"),
        )
        .await
        .expect("the EndpointSlices API");
        eventually("the controller marks the pod terminating", SETTLE, || {
            let slices = slices.clone();
            async move {
                let list = slices
                    .list(&ListParams::default().labels("kubernetes.io/service-name=multi"))
                    .await
                    .map_err(|e| e.to_string())?;
                let v = serde_json::to_value(&list.items).expect("JSON");
                let conditions = &v[0]["endpoints"][0]["conditions"];
                (conditions["terminating"] == true && conditions["serving"] == true)
                    .then_some(())
                    .ok_or(format!("slices: {v}"))
            }
        })
        .await;
    });
    wait_datapath(
        &mut cp,
        &mut berth,
        &[(http, vec![]), (metrics, vec![])],
        &[("multi-http", 0), ("multi-metrics", 0)],
    );

    cp.block_on(|client| async move {
        let (pods, _) = api_for(&client, "v1", "Pod", Some("team-a"))
            .await
            .expect("the pods API");
        let now = kube::api::DeleteParams {
            grace_period_seconds: Some(0),
            ..Default::default()
        };
        pods.delete("multi-0", &now)
            .await
            .expect("deleting the pod at once");
    });
    wait_datapath(
        &mut cp,
        &mut berth,
        &[(http, vec![]), (metrics, vec![])],
        &[("multi-http", 0), ("multi-metrics", 0)],
    );
}

/// A dual-stack Gateway (an IPv4 and an IPv6 address; its own GatewayConfig) and team
/// B's dual-stack application: a Service requiring both families, its Pod with an
/// address of each (set by `pod_running_dual`), a TCPRoute to the Gateway's range.
const DUAL: &str = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: dual, namespace: infra}
spec:
  gatewayClassName: berth
  addresses:
  - {type: IPAddress, value: 10.251.0.110}
  - {type: IPAddress, value: "fd00:251::110"}
  infrastructure:
    parametersRef: {group: berth.dev, kind: GatewayConfig, name: dual-l4}
  listeners:
  - name: tcp-pool
    protocol: TCP
    port: 31000
    allowedRoutes: {namespaces: {from: All}}
---
apiVersion: berth.dev/v1alpha1
kind: GatewayConfig
metadata: {name: dual-l4, namespace: infra}
spec:
  listeners:
  - {name: tcp-pool, endPort: 31099}
---
apiVersion: v1
kind: Service
metadata: {name: dual, namespace: team-b}
spec:
  ipFamilyPolicy: RequireDualStack
  ipFamilies: [IPv4, IPv6]
  selector: {app: dual}
  ports:
  - {port: 80, targetPort: 8080, protocol: TCP}
---
apiVersion: v1
kind: Pod
metadata:
  name: dual-0
  namespace: team-b
  labels: {app: dual}
spec:
  nodeName: berth-test-node
  containers:
  - name: dual
    image: registry.invalid/dual:1
    ports: [{containerPort: 8080}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: TCPRoute
metadata: {name: dual, namespace: team-b}
spec:
  parentRefs:
  - {name: dual, namespace: infra, sectionName: tcp-pool}
  rules:
  - backendRefs:
    - {name: dual, port: 80}
"#;

/// A dual-stack Service's pod: the real controller writes one EndpointSlice per
/// family, and the route's port on each of the Gateway's addresses goes to the pod's
/// address of that family.
#[test]
fn a_dual_stack_service_is_served_on_both_families() {
    let (v4, v6) = ("10.244.2.30", "fd00:244:2::30");
    let mut cp = two_teams_cluster("");
    let mut berth = cp.start_berth();
    let port = cp.block_on(|client| async move {
        apply_yaml(&client, DUAL).await;
        pod_running_with(&client, "team-b", "dual-0", &[v4, v6], true).await;
        eventually("the dual-stack route gets a port", SETTLE, || {
            port_in_status(&client, "team-b", "dual")
        })
        .await
    });
    let want = |addr: &str, backend: String| (addr.parse::<std::net::IpAddr>().unwrap(), backend);
    let wants = [
        want("10.251.0.110", format!("{v4}:8080")),
        want("fd00:251::110", format!("[{v6}]:8080")),
    ];
    settle(
        || {
            let have = berth.tables();
            let served = |(addr, backend): &(std::net::IpAddr, String)| {
                have.iter().any(|(s, e)| {
                    s.addr == *addr
                        && u64::from(s.port) == port
                        && e.iter().map(|e| e.to_string()).collect::<Vec<_>>() == [backend.clone()]
                })
            };
            if wants.iter().all(served) {
                Ok(())
            } else {
                Err(have)
            }
        },
        |have| {
            format!(
                "after {SETTLE:?}: port {port} not served as {wants:?}; tables {have:?}; log:\n{}",
                tail(&berth.log, 20)
            )
        },
    );
    cp.berth_routes(&mut berth).expect("berth answers");
}

/// Whether a watch of team A's TCPRoutes from `version` is refused as expired (410
/// Gone: etcd compacted that revision), as Berth's watches from before will be.
async fn expired(client: &Client, version: &str) -> Result<(), String> {
    use futures::TryStreamExt;
    let routes = tcp_routes(client, "team-a").await;
    let params = kube::api::WatchParams::default().timeout(2);
    let events = routes.watch(&params, version).await;
    let first = match events {
        Err(kube::Error::Api(e)) if e.code == 410 => return Ok(()),
        Err(e) => return Err(e.to_string()),
        Ok(events) => std::pin::pin!(events).try_next().await,
    };
    match first {
        Ok(Some(kube::api::WatchEvent::Error(e))) if e.code == 410 => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 410 => Ok(()),
        other => Err(format!("a watch from {version} still answers: {other:?}")),
    }
}

/// Berth frozen while the API server restarts without its watch cache and etcd
/// compacts the revisions Berth's watches were at: resumed, each watch is refused as
/// expired (410 Gone), and Berth lists again, so a route created meanwhile gets its
/// port and the earlier ports stay.
#[test]
fn berth_recovers_from_watches_expired_by_compaction() {
    let (mut cp, mut berth) = two_teams();
    let before = cp.block_on(|client| async move { assigned_ports(&client).await });
    berth.freeze(true);
    // Every revision Berth has seen is at most the one a list returns now.
    let seen = cp.block_on(|client| async move {
        let routes = tcp_routes(&client, "team-a").await;
        let list = routes.list(&ListParams::default()).await.expect("a list");
        list.metadata.resource_version.expect("a resource version")
    });
    cp.restart_apiserver_with(&["--watch-cache=false", "--etcd-compaction-interval=2s"]);
    cp.block_on(|client| async move {
        apply_yaml(&client, SECOND_ROUTE).await;
        eventually(
            "etcd compacts what Berth's watches had seen",
            SETTLE,
            || expired(&client, &seen),
        )
        .await;
    });
    berth.freeze(false);
    let (after, new_port) = cp.block_on(|client| async move {
        let port = eventually("the route created meanwhile gets a port", SETTLE, || {
            port_in_status(&client, "team-a", "echo-2")
        })
        .await;
        (ports_in_status(&client).await, port)
    });
    assert_eq!(
        after,
        Ok(before.clone()),
        "ports across the expired watches"
    );
    assert!(
        before.iter().all(|(_, p)| *p != new_port),
        "the new route got port {new_port}, beside {before:?}"
    );
    // The path under test was taken: Berth's TCPRoute watch was refused as expired.
    let log = std::fs::read_to_string(&berth.log).unwrap_or_default();
    assert!(
        log.lines()
            .any(|l| l.contains("kind=\"TCPRoute\"") && l.contains("Expired")),
        "berth's TCPRoute watch was not refused as expired; its log:\n{}",
        tail(&berth.log, 30)
    );
}

/// Real traffic, router mode: a client namespace behind Berth's interface (`kgw1`
/// moved there) and a backend namespace per team holding its pod's address with
/// nginx on the pod's port, routed back through the gateway. A request to each
/// route's port on the Gateway address reaches that team's pod and no other.
#[test]
fn real_traffic_reaches_each_teams_pod_through_its_port() {
    use berth_tests::{
        netns::Netns,
        topo::{forward_both, http_get, start_servers, veth, Veth, GW},
    };
    let (mut cp, mut berth) = two_teams();
    let ports = cp.block_on(|client| async move { assigned_ports(&client).await });
    forward_both(&cp.ns);
    let client = Netns::new("krc");
    cp.ns.ip(&["link", "set", "kgw1", "netns", &client.name]);
    cp.ns.ip(&["addr", "add", "10.250.9.1/24", "dev", "kgw0"]);
    client.ip(&["addr", "add", "10.250.9.2/24", "dev", "kgw1"]);
    client.ip(&["link", "set", "kgw1", "up"]);
    client.exec(&["ethtool", "-K", "kgw1", "tx", "off", "rx", "off"]);
    client.ip(&["route", "add", &format!("{GW}/32"), "via", "10.250.9.1"]);
    let mut backends = Vec::new();
    for (i, (_, ip)) in TEAMS.iter().enumerate() {
        let ns = Netns::new("krb");
        let net = format!("10.244.{}", i + 1);
        let host = format!("kb{i}");
        veth(
            &cp.ns,
            &host,
            &[&format!("{net}.1/24")],
            &ns,
            "eth0",
            &[&format!("{ip}/24")],
            Veth::HOST_B,
        );
        ns.ip(&["route", "add", "default", "via", &format!("{net}.1")]);
        backends.push(ns);
    }
    let servers: Vec<(&Netns, Vec<std::net::IpAddr>)> = backends
        .iter()
        .zip(TEAMS)
        .map(|(ns, (_, ip))| (ns, vec![ip.parse().expect("an address")]))
        .collect();
    let _servers = start_servers(&servers);
    for (n, (namespace, port)) in ports.iter().enumerate() {
        let addr = std::net::SocketAddr::from((GW, *port as u16));
        let body = client.enter(|| http_get(addr));
        assert_eq!(
            body.as_deref().ok(),
            Some(format!("backend-{}\n", n + 1).as_str()),
            "{namespace}'s route at {addr}: {body:?}; berth's log:\n{}",
            tail(&berth.log, 20)
        );
    }
    // `get routes` shows the traffic each route's port carried (sampled, so polled).
    settle(
        || {
            let rows = cp.berth_routes(&mut berth).unwrap_or_default();
            let counted: Vec<(u64, u64)> = ports
                .iter()
                .map(|(namespace, _)| {
                    rows.iter()
                        .find(|r| &r.namespace == namespace && r.name == "echo")
                        .map_or((0, 0), |r| (r.packets, r.reply_packets))
                })
                .collect();
            if counted.iter().all(|&(p, r)| p > 0 && r > 0) {
                Ok(())
            } else {
                Err(counted)
            }
        },
        |counted| format!("packets and replies per route after {SETTLE:?}: {counted:?}"),
    );
}
