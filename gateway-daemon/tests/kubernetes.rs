//! Kubernetes mode against a scripted API server.
//!
//! What a real API server does on every run (lists, watches, claims, status, RBAC) is
//! tested against Kubernetes' own binaries in `tests/tests/kube_real.rs`; what it does
//! only by chance (races, conflicts, errors) is scripted here: the controller
//! talks through a `tower-test` mock service, and each test plays the server, checking
//! every request's method, path, query and body and answering with realistic objects
//! and `Status` errors (409 AlreadyExists, 409 Conflict, 500). The planner's semantics
//! are tested on their own (unit, property and golden tests); these tests cover the
//! edge that turns plans into API calls and watch events into plans.

use std::{
    sync::Arc,
    time::{Duration, Instant, SystemTime},
};

use berth::{
    kubernetes::{
        claims::{self, Change, ClaimError, Recent},
        lease::{Elector, Leadership, LeaseConfig},
        sources::{self, Held, Kind, Versions, View},
        status, Controller,
    },
    model::{ClaimPhase, ClaimRoute, PortClaim, PortClaimSpec, CONTROLLER_NAME},
    planner::status::{Condition, RouteParentStatus},
};
use http::{Method, Request, Response};
use kube::{api::DynamicObject, client::Body, Client};
use serde_json::{json, Value};
use tokio::sync::Notify;

type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;
type Reply = tower_test::mock::SendResponse<Response<Body>>;

fn mock() -> (Client, Handle) {
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    (Client::new(service, "default"), handle)
}

/// One request as the server saw it.
#[derive(Debug, Clone)]
struct Seen {
    method: Method,
    path: String,
    query: String,
    content_type: String,
    body: Value,
}

impl Seen {
    fn is(&self, method: &Method, path: &str) -> bool {
        self.method == method && self.path == path
    }
}

/// The next request, read in full (panics after 10 s: a test that hangs says why).
async fn next(handle: &mut Handle) -> (Seen, Reply) {
    let (request, reply) = tokio::time::timeout(Duration::from_secs(10), handle.next_request())
        .await
        .expect("the controller sent no request within 10 s")
        .expect("the client was dropped");
    let (parts, body) = request.into_parts();
    let bytes = body.collect_bytes().await.expect("request body");
    let body = if bytes.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&bytes).unwrap_or_else(|_| {
            // Server-side apply bodies are YAML; JSON is valid YAML, so we send JSON.
            Value::String(String::from_utf8_lossy(&bytes).into_owned())
        })
    };
    let seen = Seen {
        method: parts.method.clone(),
        path: parts.uri.path().to_string(),
        query: parts.uri.query().unwrap_or_default().to_string(),
        content_type: parts
            .headers
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string(),
        body,
    };
    (seen, reply)
}

/// The result of the task under test (panics after 10 s).
async fn finish<T>(task: tokio::task::JoinHandle<T>) -> T {
    tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("the controller did not finish within 10 s (a request left unanswered?)")
        .expect("the controller task panicked")
}

fn respond(reply: Reply, code: u16, body: &Value) {
    reply.send_response(
        Response::builder()
            .status(code)
            .header("content-type", "application/json")
            .body(Body::from(serde_json::to_vec(body).unwrap()))
            .unwrap(),
    );
}

/// A Kubernetes `Status` error body.
fn status_error(code: u16, reason: &str, message: &str) -> Value {
    json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure", "message": message, "reason": reason, "code": code
    })
}

/// The object a create or update returns: the body, stamped by the "server".
fn stored(mut body: Value, rv: &str) -> Value {
    body["metadata"]["resourceVersion"] = json!(rv);
    body["metadata"]["uid"] = json!(format!("uid-{rv}"));
    body["metadata"]["creationTimestamp"] = json!("2026-01-01T00:00:00Z");
    body
}

/// Answers requests until `done` returns true for the log, each with `answer`; panics on
/// a request `answer` does not expect. Returns every request seen, in order.
async fn serve(
    handle: &mut Handle,
    mut answer: impl FnMut(&Seen, &[Seen]) -> (u16, Value),
    done: impl Fn(&[Seen]) -> bool,
) -> Vec<Seen> {
    let mut log: Vec<Seen> = Vec::new();
    while !done(&log) {
        let (seen, reply) = next(handle).await;
        let (code, body) = answer(&seen, &log);
        respond(reply, code, &body);
        log.push(seen);
    }
    log
}

fn obj(v: Value) -> Arc<DynamicObject> {
    Arc::new(serde_json::from_value(v).expect("fixture is a Kubernetes object"))
}

const GW: &str = "/apis/gateway.networking.k8s.io/v1";
const CLAIMS: &str = "/apis/berth.dev/v1alpha1/namespaces/infra/portclaims";

/// GatewayClass, Gateway `infra/gw` (address 192.0.2.10, TCP listener `pool` made the
/// range 30000..=`end` by GatewayConfig `infra/shared`, routes from all namespaces).
fn gateway_objects(end: u16) -> Vec<(Kind, Arc<DynamicObject>)> {
    vec![
        (
            Kind::GatewayClass,
            obj(json!({
                "apiVersion": "gateway.networking.k8s.io/v1", "kind": "GatewayClass",
                "metadata": {"name": "berth", "uid": "c1", "resourceVersion": "1"},
                "spec": {"controllerName": CONTROLLER_NAME}
            })),
        ),
        (
            Kind::Gateway,
            obj(json!({
                "apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
                "metadata": {"name": "gw", "namespace": "infra", "uid": "g1",
                             "generation": 2, "resourceVersion": "2"},
                "spec": {
                    "gatewayClassName": "berth",
                    "addresses": [{"type": "IPAddress", "value": "192.0.2.10"}],
                    "infrastructure": {"parametersRef":
                        {"group": "berth.dev", "kind": "GatewayConfig", "name": "shared"}},
                    "listeners": [{"name": "pool", "port": 30000, "protocol": "TCP",
                                   "allowedRoutes": {"namespaces": {"from": "All"}}}]
                }
            })),
        ),
        (
            Kind::GatewayConfig,
            obj(json!({
                "apiVersion": "berth.dev/v1alpha1", "kind": "GatewayConfig",
                "metadata": {"name": "shared", "namespace": "infra", "resourceVersion": "3"},
                "spec": {"listeners": [{"name": "pool", "endPort": end}], "releaseCooldown": "300s"}
            })),
        ),
    ]
}

/// TCPRoute `team/<name>` attached to `infra/gw`, created at `created`.
fn route(name: &str, created: &str, status: Option<Value>) -> (Kind, Arc<DynamicObject>) {
    let mut v = json!({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "TCPRoute",
        "metadata": {"name": name, "namespace": "team", "uid": format!("uid-{name}"),
                     "generation": 1, "resourceVersion": "7", "creationTimestamp": created},
        "spec": {"parentRefs": [{"name": "gw", "namespace": "infra"}],
                 "rules": [{"backendRefs": [{"name": name, "port": 80}]}]}
    });
    if let Some(s) = status {
        v["status"] = s;
    }
    (Kind::TcpRoute, obj(v))
}

fn claim_json(port: u16, route: &str, phase: &str, rv: &str) -> Value {
    json!({
        "apiVersion": "berth.dev/v1alpha1", "kind": "PortClaim",
        "metadata": {"name": format!("gw-tcp-{port}"), "namespace": "infra",
                     "uid": format!("claim-{port}"), "resourceVersion": rv,
                     "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {"gateway": "gw", "listener": "pool", "protocol": "TCP", "port": port,
                 "route": {"group": "gateway.networking.k8s.io", "kind": "TCPRoute",
                           "namespace": "team", "name": route, "uid": format!("uid-{route}")}},
        "status": {"phase": phase}
    })
}

fn claim(port: u16, route: &str) -> std::sync::Arc<PortClaim> {
    let route = ClaimRoute::new(
        berth::model::RouteKind::Tcp,
        "team",
        route,
        Some(format!("uid-{route}").into()),
    );
    std::sync::Arc::new(PortClaim::bound(
        "infra",
        PortClaimSpec::new("gw", "pool", "TCP", port, route),
    ))
}

fn our_parent(port: u16, accepted: bool, time: &str) -> RouteParentStatus {
    let cond = |kind: &'static str, ok: bool, reason: &'static str, message: &str| Condition {
        kind: kind.into(),
        status: if ok { "True" } else { "False" }.into(),
        reason: reason.into(),
        message: message.to_string().into(),
        last_transition_time: berth::model::Time::parse(time).expect("a time"),
        observed_generation: Some(1),
    };
    RouteParentStatus {
        parent_ref: berth::model::ParentRef {
            name: "gw".into(),
            namespace: Some("infra".into()),
            port: Some(port),
            ..Default::default()
        },
        controller_name: CONTROLLER_NAME.into(),
        conditions: vec![
            cond(
                "Accepted",
                accepted,
                if accepted {
                    "Accepted"
                } else {
                    "PortUnavailable"
                },
                &format!("assigned port {port}"),
            ),
            cond("ResolvedRefs", true, "ResolvedRefs", ""),
        ],
    }
}

fn other_controllers_entry() -> Value {
    json!({
        "parentRef": {"name": "mesh", "kind": "Service", "group": ""},
        "controllerName": "example.com/mesh-controller",
        "conditions": [{"type": "Accepted", "status": "True", "reason": "Accepted",
                        "message": "", "lastTransitionTime": "2025-06-01T00:00:00Z",
                        "observedGeneration": 1}]
    })
}

fn our_entries(body: &Value) -> Vec<Value> {
    body.pointer("/status/parents")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|p| p["controllerName"] == CONTROLLER_NAME)
        .cloned()
        .collect()
}

#[tokio::test]
async fn a_claim_is_created_under_its_deterministic_name_then_marked_bound() {
    let (client, mut handle) = mock();
    let want = imbl::vector![claim(30000, "web")];
    let task = tokio::spawn(async move {
        let mut recent = Recent::default();
        let mut done = Vec::new();
        let r = claims::commit(
            &client,
            &Leadership::always(),
            &Held::default(),
            &want,
            &mut recent,
            &mut done,
        )
        .await;
        (r, done)
    });
    let log = serve(
        &mut handle,
        |s, _| match (&s.method, s.path.as_str()) {
            (&Method::POST, CLAIMS) => {
                assert_eq!(s.body["metadata"]["name"], "gw-tcp-30000");
                assert_eq!(s.body["spec"]["port"], 30000);
                assert_eq!(s.body["spec"]["route"]["name"], "web");
                (201, stored(s.body.clone(), "10"))
            }
            (&Method::PATCH, p) if p == format!("{CLAIMS}/gw-tcp-30000/status") => {
                assert_eq!(s.content_type, "application/merge-patch+json");
                assert_eq!(s.body, json!({"status": {"phase": "Bound"}}));
                (200, claim_json(30000, "web", "Bound", "11"))
            }
            _ => panic!("unexpected request {s:?}"),
        },
        |log| log.len() == 2,
    )
    .await;
    let (result, done) = finish(task).await;
    result.expect("commit succeeds");
    assert!(log[0].is(&Method::POST, CLAIMS), "create first: {log:?}");
    assert_eq!(done, vec![Change::Created(claim(30000, "web"))]);
}

/// One cycle over `view` as the leader (node-a).
fn spawn_leader_cycle(
    client: Client,
    view: View,
) -> tokio::task::JoinHandle<Result<berth::planner::Plan, berth::kubernetes::CycleError>> {
    tokio::spawn(async move {
        let leader = Leadership::always();
        let mut c = Controller::new(
            client,
            Versions::default(),
            leader,
            "node-a",
            Default::default(),
        );
        c.reconcile(&view, SystemTime::now(), Vec::new()).await
    })
}

#[tokio::test]
async fn a_cooled_down_claim_is_deleted_only_at_the_version_read() {
    // Claim 30002 was released long ago; the plan drops it. Meanwhile another writer
    // changed it (resourceVersion 6): our delete at version 5 fails and we read again.
    let mut objects = gateway_objects(30009);
    let mut released = claim_json(30002, "gone", "Released", "5");
    released["status"]["releasedAt"] = json!("2025-01-01T00:00:00Z");
    objects.push((Kind::PortClaim, obj(released)));
    let view = View::new(objects);
    let plan = berth::planner::plan(&berth::planner::Input {
        snapshot: &view.snapshot,
        claims: &view.held.list(),
        now: SystemTime::now(),
        default_addresses: berth::planner::DefaultAddresses::default(),
        ephemeral_ports: None,
        snat_ports: berth::planner::DEFAULT_SNAT_PORTS,
        capacity: Default::default(),
        allocate: true,
    });
    assert!(plan.claims.is_empty(), "cooled down: no longer wanted");
    let (client, mut handle) = mock();
    let held = view.held.clone();
    let task = tokio::spawn(async move {
        let mut recent = Recent::default();
        let mut done = Vec::new();
        let leader = Leadership::always();
        let r = claims::commit(
            &client,
            &leader,
            &held,
            &plan.claims,
            &mut recent,
            &mut done,
        )
        .await;
        let mut after = held.clone();
        recent.overlay(&mut after);
        (r, done, after)
    });
    let path = format!("{CLAIMS}/gw-tcp-30002");
    let log = serve(
        &mut handle,
        |s, log| match (&s.method, log.len()) {
            (&Method::DELETE, 0) => {
                assert_eq!(s.path, path);
                assert_eq!(s.body["preconditions"]["resourceVersion"], "5", "{s:?}");
                (409, status_error(409, "Conflict", "Precondition failed: UID in precondition: claim-30002, ResourceVersion in precondition: 5"))
            }
            (&Method::GET, 1) => (200, claim_json(30002, "gone", "Bound", "6")),
            _ => panic!("unexpected request {s:?}"),
        },
        |log| log.len() == 2,
    )
    .await;
    let (result, done, after) = finish(task).await;
    assert!(
        matches!(result, Err(ClaimError::Raced { .. })),
        "{result:?}"
    );
    assert!(done.is_empty());
    assert_eq!(log.len(), 2);
    let (c, rv) = &after.claims[&("infra".to_string(), "gw-tcp-30002".to_string())];
    assert_eq!(
        (rv.as_str(), c.status.as_ref().unwrap().phase),
        ("6", ClaimPhase::Bound),
        "the next plan sees the fresh claim"
    );
}

#[tokio::test]
async fn a_port_taken_meanwhile_is_reread_and_the_route_gets_another_without_a_duplicate() {
    // `web` is older than `other`; a stale allocator already gave 30000 to `other`,
    // which our reflector has not shown yet.
    let mut objects = gateway_objects(30009);
    objects.push(route("web", "2026-01-01T00:00:00Z", None));
    objects.push(route("other", "2026-01-02T00:00:00Z", None));
    let view = View::new(objects);
    assert!(view.errors.is_empty(), "{:?}", view.errors);
    let (client, mut handle) = mock();
    let task = spawn_leader_cycle(client, view);
    let events = "/apis/events.k8s.io/v1/namespaces/team/events";
    let log = serve(
        &mut handle,
        |s, log| {
            let creates = log.iter().filter(|l| l.is(&Method::POST, CLAIMS)).count();
            match (&s.method, s.path.as_str()) {
                (&Method::POST, CLAIMS) if creates == 0 => {
                    assert_eq!(s.body["metadata"]["name"], "gw-tcp-30000");
                    assert_eq!(s.body["spec"]["route"]["name"], "web");
                    (
                        409,
                        status_error(
                            409,
                            "AlreadyExists",
                            "portclaims.berth.dev \"gw-tcp-30000\" already exists",
                        ),
                    )
                }
                (&Method::GET, p) if p == format!("{CLAIMS}/gw-tcp-30000") => {
                    (200, claim_json(30000, "other", "Bound", "20"))
                }
                (&Method::POST, CLAIMS) => {
                    assert_eq!(s.body["metadata"]["name"], "gw-tcp-30001", "{s:?}");
                    assert_eq!(s.body["spec"]["route"]["name"], "web");
                    (201, stored(s.body.clone(), "21"))
                }
                (&Method::PATCH, p) if p.starts_with(CLAIMS) => {
                    let port: u16 = p
                        .trim_end_matches("/status")
                        .rsplit('-')
                        .next()
                        .unwrap()
                        .parse()
                        .unwrap();
                    (200, claim_json(port, "web", "Bound", "22"))
                }
                (&Method::POST, p) if p == events => {
                    assert_eq!(s.body["reason"], "PortAssigned");
                    assert_eq!(s.body["regarding"]["name"], "web");
                    (201, stored(s.body.clone(), "23"))
                }
                (&Method::PATCH, p)
                    if p == format!("{GW}/namespaces/infra/gateways/gw/status")
                        || p == format!("{GW}/gatewayclasses/berth/status") =>
                {
                    (200, s.body.clone())
                }
                (&Method::PUT, p) if p.starts_with(&format!("{GW}/namespaces/team/tcproutes/")) => {
                    (200, s.body.clone())
                }
                _ => panic!("unexpected request {s:?}"),
            }
        },
        |log| log.iter().filter(|l| l.method == Method::PUT).count() == 2,
    )
    .await;
    let plan = task
        .await
        .unwrap()
        .expect("the cycle succeeds after the race");
    let creates: Vec<_> = log.iter().filter(|l| l.is(&Method::POST, CLAIMS)).collect();
    assert_eq!(creates.len(), 2, "one lost create, one retry: {log:?}");
    let ports: Vec<(String, u16)> = plan
        .claims
        .iter()
        .map(|c| (c.spec.route.name.to_string(), c.spec.port))
        .collect();
    assert_eq!(ports, vec![("other".into(), 30000), ("web".into(), 30001)]);
    for l in log.iter().filter(|l| l.method == Method::PUT) {
        let name = l.body["metadata"]["name"].as_str().unwrap();
        let port = if name == "web" { 30001 } else { 30000 };
        assert_eq!(our_entries(&l.body)[0]["parentRef"]["port"], port, "{name}");
    }
}

#[tokio::test]
async fn repair_releases_the_claim_of_a_gone_route_and_gives_a_route_its_lost_port_back() {
    // Claim 30002 belongs to a route that no longer exists; `web`'s claim for 30005 was
    // deleted by hand, but its status still shows the port.
    let mut objects = gateway_objects(30009);
    let web_status = json!({"parents": [serde_json::to_value(our_parent(30005, true, "2026-01-01T00:00:00Z")).unwrap()]});
    objects.push(route("web", "2026-01-01T00:00:00Z", Some(web_status)));
    objects.push((
        Kind::PortClaim,
        obj(claim_json(30002, "gone", "Bound", "5")),
    ));
    let view = View::new(objects);
    let (client, mut handle) = mock();
    let task = spawn_leader_cycle(client, view);
    let log = serve(
        &mut handle,
        |s, _| match (&s.method, s.path.as_str()) {
            (&Method::PUT, p) if p == format!("{CLAIMS}/gw-tcp-30002/status") => {
                assert_eq!(
                    s.body["metadata"]["resourceVersion"], "5",
                    "conditional on the read version"
                );
                assert_eq!(s.body["status"]["phase"], "Released");
                assert!(s.body["status"]["releasedAt"].is_string());
                (200, stored(s.body.clone(), "6"))
            }
            (&Method::POST, CLAIMS) => {
                assert_eq!(
                    s.body["metadata"]["name"], "gw-tcp-30005",
                    "the lost port, not the lowest free"
                );
                (201, stored(s.body.clone(), "30"))
            }
            (&Method::PATCH, p) if p == format!("{CLAIMS}/gw-tcp-30005/status") => {
                (200, claim_json(30005, "web", "Bound", "31"))
            }
            (&Method::POST, p) if p.ends_with("/events") => (201, stored(s.body.clone(), "40")),
            (&Method::PATCH, p) if p.ends_with("/gateways/gw/status") => (200, s.body.clone()),
            (&Method::PATCH, p) if p == format!("{GW}/gatewayclasses/berth/status") => {
                assert_eq!(s.content_type, "application/apply-patch+yaml");
                assert_eq!(s.body["status"]["conditions"][0]["type"], "Accepted");
                (200, s.body.clone())
            }
            (&Method::PUT, p) if p.ends_with("/tcproutes/web/status") => (200, s.body.clone()),
            _ => panic!("unexpected request {s:?}"),
        },
        // The route status changes too (its backend Service does not exist).
        |log| {
            log.iter().any(|l| l.path.ends_with("/gateways/gw/status"))
                && log
                    .iter()
                    .any(|l| l.path.ends_with("/tcproutes/web/status"))
        },
    )
    .await;
    let plan = finish(task).await.expect("repair cycle");
    let release = log
        .iter()
        .position(|l| l.path.ends_with("gw-tcp-30002/status"))
        .expect("released");
    let create = log
        .iter()
        .position(|l| l.is(&Method::POST, CLAIMS))
        .expect("re-requested");
    assert!(release < create, "releases before creations: {log:?}");
    let reasons: Vec<_> = log
        .iter()
        .filter(|l| l.path.ends_with("/events"))
        .map(|l| l.body["reason"].clone())
        .collect();
    assert!(
        reasons.contains(&json!("PortReleased")) && reasons.contains(&json!("PortAssigned")),
        "{reasons:?}"
    );
    let gone = plan
        .claims
        .iter()
        .find(|c| c.spec.port == 30002)
        .expect("kept while cooling down");
    assert_eq!(gone.status.as_ref().unwrap().phase, ClaimPhase::Released);
}

/// Writes our entries of TCPRoute team/web, starting from `cached`, as the leader.
fn spawn_write_route(
    client: Client,
    ours: Vec<RouteParentStatus>,
    cached: Arc<DynamicObject>,
) -> tokio::task::JoinHandle<Result<Option<status::Merged>, status::StatusError>> {
    tokio::spawn(async move {
        let resource = Versions::default().route(berth::model::RouteKind::Tcp);
        let leader = Leadership::always();
        status::write_route(
            &client,
            &leader,
            &resource,
            "team",
            "web",
            &ours,
            Some(&cached),
        )
        .await
    })
}

#[tokio::test]
async fn route_status_replaces_our_entry_and_keeps_another_controllers_entry_as_it_was() {
    let (client, mut handle) = mock();
    let old_ours = serde_json::to_value(our_parent(30001, false, "2026-01-01T00:00:00Z")).unwrap();
    let (_, cached) = route(
        "web",
        "2026-01-01T00:00:00Z",
        Some(json!({"parents": [other_controllers_entry(), old_ours]})),
    );
    let ours = vec![our_parent(30001, true, "2026-03-03T00:00:00Z")];
    let task = spawn_write_route(client, ours, cached);
    let log = serve(
        &mut handle,
        |s, _| {
            assert!(
                s.is(
                    &Method::PUT,
                    &format!("{GW}/namespaces/team/tcproutes/web/status")
                ),
                "{s:?}"
            );
            (200, s.body.clone())
        },
        |log| log.len() == 1,
    )
    .await;
    let merged = finish(task).await.expect("written").expect("changed");
    let body = &log[0].body;
    assert_eq!(
        body["metadata"]["resourceVersion"], "7",
        "written at the version read"
    );
    assert_eq!(body["apiVersion"], "gateway.networking.k8s.io/v1");
    let parents = body["status"]["parents"].as_array().unwrap();
    assert_eq!(parents.len(), 2);
    assert_eq!(
        parents[0],
        other_controllers_entry(),
        "the other controller's entry is untouched"
    );
    assert_eq!(parents[1]["conditions"][0]["status"], "True");
    // Accepted changed: new transition time; ResolvedRefs did not: old time kept.
    assert_eq!(
        parents[1]["conditions"][0]["lastTransitionTime"],
        "2026-03-03T00:00:00Z"
    );
    assert_eq!(
        parents[1]["conditions"][1]["lastTransitionTime"],
        "2026-01-01T00:00:00Z"
    );
    assert_eq!(merged.old.len(), 1);
}

#[tokio::test]
async fn a_resource_version_conflict_is_retried_on_a_fresh_read_keeping_the_newer_entries() {
    let (client, mut handle) = mock();
    let (_, cached) = route("web", "2026-01-01T00:00:00Z", None);
    let ours = vec![our_parent(30001, true, "2026-03-03T00:00:00Z")];
    let task = spawn_write_route(client, ours, cached);
    let path = format!("{GW}/namespaces/team/tcproutes/web");
    let log = serve(
        &mut handle,
        |s, log| match (&s.method, log.len()) {
            (&Method::PUT, 0) => {
                assert_eq!(s.body["metadata"]["resourceVersion"], "7");
                (409, status_error(409, "Conflict", "the object has been modified; please apply your changes to the latest version and try again"))
            }
            (&Method::GET, 1) => {
                assert_eq!(s.path, path);
                let (_, fresh) = route("web", "2026-01-01T00:00:00Z", Some(json!({"parents": [other_controllers_entry()]})));
                let mut fresh = serde_json::to_value(&*fresh).unwrap();
                fresh["metadata"]["resourceVersion"] = json!("8");
                (200, fresh)
            }
            (&Method::PUT, 2) => (200, s.body.clone()),
            _ => panic!("unexpected request {s:?} after {log:?}"),
        },
        |log| log.len() == 3,
    )
    .await;
    task.await
        .unwrap()
        .expect("written after one conflict")
        .expect("changed");
    let last = &log[2].body;
    assert_eq!(
        last["metadata"]["resourceVersion"], "8",
        "written at the fresh version"
    );
    assert_eq!(
        last["status"]["parents"][0],
        other_controllers_entry(),
        "the entry written meanwhile survives"
    );
    assert_eq!(our_entries(last).len(), 1);
}

/// The plan of `view` with no claims yet (ports allocated).
fn plan_of(view: &View) -> berth::planner::Plan {
    berth::planner::plan(&berth::planner::Input {
        snapshot: &view.snapshot,
        claims: &Default::default(),
        now: SystemTime::now(),
        default_addresses: berth::planner::DefaultAddresses::default(),
        ephemeral_ports: None,
        snat_ports: berth::planner::DEFAULT_SNAT_PORTS,
        capacity: Default::default(),
        allocate: true,
    })
}

/// Applies the status `plan` gives the first Gateway of `view`; the one request the
/// server saw.
async fn apply_gateway_status(plan: &berth::planner::Plan, view: &View) -> Seen {
    let (client, mut handle) = mock();
    let entry = plan.gateways[0].clone();
    let current = view.gateways.values().next().cloned();
    let task = tokio::spawn(async move {
        status::apply_gateway(&client, &Leadership::always(), &entry, current.as_deref()).await
    });
    let mut log = serve(
        &mut handle,
        |s, _| (200, s.body.clone()),
        |log| log.len() == 1,
    )
    .await;
    assert!(finish(task).await.expect("applied"));
    log.remove(0)
}

#[tokio::test]
async fn gateway_status_is_server_side_applied_with_our_field_manager() {
    let mut objects = gateway_objects(30009);
    objects.push(route("web", "2026-01-01T00:00:00Z", None));
    let view = View::new(objects);
    let plan = plan_of(&view);
    let s = &apply_gateway_status(&plan, &view).await;
    assert_eq!(s.method, Method::PATCH);
    assert_eq!(s.path, format!("{GW}/namespaces/infra/gateways/gw/status"));
    assert_eq!(s.content_type, "application/apply-patch+yaml");
    let query: Vec<&str> = s.query.split('&').collect();
    assert!(
        query.contains(&"fieldManager=berth.dev%2Fgateway-controller"),
        "{}",
        s.query
    );
    assert!(query.contains(&"force=true"), "{}", s.query);
    assert_eq!(s.body["apiVersion"], "gateway.networking.k8s.io/v1");
    assert_eq!(s.body["kind"], "Gateway");
    assert_eq!(
        s.body["metadata"],
        json!({"name": "gw", "namespace": "infra"})
    );
    assert_eq!(s.body["status"]["listeners"][0]["name"], "pool");
    assert_eq!(s.body["status"]["conditions"][0]["observedGeneration"], 2);
    // Unchanged status: nothing is written.
    let mut applied = (*view.gateways.values().next().unwrap()).as_ref().clone();
    applied.data["status"] = s.body["status"].clone();
    assert!(status::gateway_status(&plan.gateways[0], Some(&applied)).is_none());
    // Our GatewayClass: Accepted once per generation.
    let mut class = (*view.classes["berth"]).clone();
    let class_status =
        status::gateway_class_status(&class, "2026-01-01T00:00:00Z").expect("not shown yet");
    class.data["status"] = class_status;
    assert!(status::gateway_class_status(&class, "2026-02-02T00:00:00Z").is_none());
}

/// The dual-stack objects as the API server serves them: Gateway `infra/gw` with an
/// IPv4 and an IPv6 address, TCPRoute `team/web` to Service `team/web`, whose endpoints
/// come in one EndpointSlice per family.
fn dual_stack_objects() -> Vec<(Kind, Arc<DynamicObject>)> {
    let mut objects: Vec<_> = gateway_objects(30009)
        .into_iter()
        .map(|(kind, o)| {
            let mut v = serde_json::to_value(&*o).unwrap();
            if kind == Kind::Gateway {
                v["spec"]["addresses"] = json!([
                    {"type": "IPAddress", "value": "192.0.2.10"},
                    {"type": "IPAddress", "value": "2001:DB8:0:0::10"}
                ]);
            }
            (kind, obj(v))
        })
        .collect();
    objects.push(route("web", "2026-01-01T00:00:00Z", None));
    objects.push((
        Kind::Service,
        obj(json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "web", "namespace": "team", "resourceVersion": "8"},
            "spec": {"ipFamilies": ["IPv4", "IPv6"], "ipFamilyPolicy": "RequireDualStack",
                     "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}
        })),
    ));
    for (name, family, address) in [
        ("web-v4", "IPv4", "10.0.0.5"),
        ("web-v6", "IPv6", "fd00::5"),
    ] {
        objects.push(web_slice(name, family, address, "http"));
    }
    objects
}

/// EndpointSlice `team/<name>` of Service `team/web`: one ready endpoint at `address`,
/// port 8080 named `port_name`.
fn web_slice(
    name: &str,
    family: &str,
    address: &str,
    port_name: &str,
) -> (Kind, Arc<DynamicObject>) {
    (
        Kind::EndpointSlice,
        obj(json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": name, "namespace": "team", "resourceVersion": "9",
                         "labels": {"kubernetes.io/service-name": "web"}},
            "addressType": family,
            "endpoints": [{"addresses": [address], "conditions": {"ready": true}}],
            "ports": [{"name": port_name, "port": 8080, "protocol": "TCP"}]
        })),
    )
}

#[tokio::test]
async fn a_dual_stack_gateway_serves_each_family_its_own_slice_and_applies_both_addresses() {
    let view = View::new(dual_stack_objects());
    let plan = plan_of(&view);
    // One port, served on both addresses, each with its own family's endpoint.
    let services: Vec<(String, Vec<String>)> = plan
        .datapath
        .services
        .iter()
        .map(|(s, b)| {
            let b = b.iter().map(|b| b.endpoint.to_string()).collect();
            (s.to_string(), b)
        })
        .collect();
    assert_eq!(
        services,
        [
            (
                "TCP/192.0.2.10:30000".to_string(),
                vec!["10.0.0.5:8080".to_string()]
            ),
            (
                "TCP/[2001:db8::10]:30000".to_string(),
                vec!["[fd00::5]:8080".to_string()]
            ),
        ],
        "{:?}",
        plan.routes
    );
    let parent = &plan.routes[0].status.parents[0];
    assert_eq!(parent.parent_ref.port, Some(30000));
    let resolved = parent
        .conditions
        .iter()
        .find(|c| c.kind == "ResolvedRefs")
        .expect("ResolvedRefs");
    assert_eq!(resolved.status, "True", "{resolved:?}");

    // The Gateway's status names both addresses, IPv6 in its canonical text.
    let applied = apply_gateway_status(&plan, &view).await;
    assert_eq!(
        applied.body["status"]["addresses"],
        json!([
            {"type": "IPAddress", "value": "192.0.2.10"},
            {"type": "IPAddress", "value": "2001:db8::10"}
        ])
    );
}

/// As a cluster serves them: Gateway `infra/gw` with only an HTTP listener beside a
/// fixed TCP listener, TCPRoute `team/web` to a Service with one unnamed port, and the
/// EndpointSlice the EndpointSlice controller writes for it (port named `""`).
fn unnamed_port_objects() -> Vec<(Kind, Arc<DynamicObject>)> {
    let mut objects: Vec<_> = gateway_objects(30009)
        .into_iter()
        .filter(|(kind, _)| *kind != Kind::GatewayConfig)
        .map(|(kind, o)| {
            let mut v = serde_json::to_value(&*o).unwrap();
            if kind == Kind::Gateway {
                v["spec"]["infrastructure"] = Value::Null;
                v["spec"]["listeners"] = json!([
                    {"name": "http", "port": 80, "protocol": "HTTP"},
                    {"name": "pg", "port": 5432, "protocol": "TCP",
                     "allowedRoutes": {"namespaces": {"from": "All"}}}
                ]);
            }
            (kind, obj(v))
        })
        .collect();
    objects.push(route("web", "2026-01-01T00:00:00Z", None));
    objects.push((
        Kind::Service,
        obj(json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "web", "namespace": "team", "resourceVersion": "8"},
            "spec": {"ports": [{"port": 80, "protocol": "TCP", "targetPort": 8080}]}
        })),
    ));
    objects.push(web_slice("web-abcde", "IPv4", "10.0.0.5", ""));
    objects
}

#[tokio::test]
async fn an_unnamed_service_port_on_a_fixed_listener_is_served_and_its_gateway_accepted() {
    let view = View::new(unnamed_port_objects());
    let plan = plan_of(&view);
    let applied = apply_gateway_status(&plan, &view).await;
    let conditions = &applied.body["status"]["conditions"];
    assert_eq!(
        (
            &conditions[0]["type"],
            &conditions[0]["status"],
            &conditions[0]["reason"]
        ),
        (
            &json!("Accepted"),
            &json!("True"),
            &json!("ListenersNotValid")
        ),
        "{conditions:#}"
    );
    assert_eq!(
        (&conditions[1]["type"], &conditions[1]["status"]),
        (&json!("Programmed"), &json!("True")),
        "{conditions:#}"
    );
    let http = &applied.body["status"]["listeners"][0];
    assert_eq!(
        http["conditions"][0]["reason"], "UnsupportedProtocol",
        "{http:#}"
    );
    assert_eq!(http["supportedKinds"], json!([]), "{http:#}");
    // `berth get routes`: the fixed listener's name and port, the backend.
    let p = berth::publish::effects(plan, None, &Default::default()).expect("effects");
    let rows = berth::admin::route_rows(&p, None);
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(
        (rows[0].listener.as_str(), rows[0].port, rows[0].backends),
        ("pg", Some(5432), 1),
        "{rows:?}"
    );
    assert_eq!(rows[0].warning, None, "{rows:?}");
}

#[tokio::test]
async fn losing_the_lease_stops_writes_at_once() {
    let (client, mut handle) = mock();
    let leadership = Leadership::default();
    let lease = "/apis/coordination.k8s.io/v1/namespaces/berth-system/leases";
    let mut elector = Elector::new(
        client.clone(),
        LeaseConfig::new("berth-system", "node-a"),
        leadership.clone(),
    );
    let server = tokio::spawn(async move {
        serve(
            &mut handle,
            |s, log| match (&s.method, log.len()) {
                // First step: no Lease yet, we create it and lead.
                (&Method::GET, 0) => (404, status_error(404, "NotFound", "leases.coordination.k8s.io \"berth-allocator\" not found")),
                (&Method::POST, 1) => {
                    assert_eq!(s.path, lease);
                    assert_eq!(s.body["spec"]["holderIdentity"], "node-a");
                    assert_eq!(s.body["spec"]["leaseDurationSeconds"], 15);
                    (201, stored(s.body.clone(), "100"))
                }
                // Second step: our renewal loses to a writer that got there first.
                (&Method::GET, 2) => {
                    let mut l = json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                        "metadata": {"name": "berth-allocator", "namespace": "berth-system", "resourceVersion": "100"},
                        "spec": {"holderIdentity": "node-a", "leaseDurationSeconds": 15,
                                 "renewTime": "2026-01-01T00:00:00.000000Z", "leaseTransitions": 0}});
                    l["metadata"]["resourceVersion"] = json!("100");
                    (200, l)
                }
                (&Method::PUT, 3) => {
                    assert_eq!(s.body["metadata"]["resourceVersion"], "100");
                    (409, status_error(409, "Conflict", "the object has been modified"))
                }
                _ => panic!("unexpected request {s:?}"),
            },
            |log| log.len() == 4,
        )
        .await;
        handle
    });
    assert!(
        elector.step().await.expect("first step"),
        "created the Lease: leader"
    );
    assert!(leadership.is_leader());
    assert!(
        !elector.step().await.expect("second step"),
        "lost the renewal race"
    );
    assert!(
        !leadership.is_leader(),
        "leadership ends with the lost renewal"
    );
    let mut handle = server.await.unwrap();

    // A pending claim is not written, and nothing reaches the server.
    let mut done = Vec::new();
    let r = claims::commit(
        &client,
        &leadership,
        &Held::default(),
        &imbl::vector![claim(30000, "web")],
        &mut Recent::default(),
        &mut done,
    )
    .await;
    assert!(matches!(r, Err(ClaimError::NotLeader(_))), "{r:?}");
    assert!(done.is_empty());
    let r = status::write_route(
        &client,
        &leadership,
        &Versions::default().route(berth::model::RouteKind::Tcp),
        "team",
        "web",
        &[our_parent(30000, true, "2026-01-01T00:00:00Z")],
        Some(&route("web", "2026-01-01T00:00:00Z", None).1),
    )
    .await;
    assert!(matches!(r, Err(status::StatusError::NotLeader(_))), "{r:?}");
    drop((client, elector));
    assert!(
        handle.next_request().await.is_none(),
        "no request after losing the lease"
    );
}

#[tokio::test]
async fn a_lease_is_taken_over_only_after_its_record_stood_still_for_its_duration() {
    let (client, mut handle) = mock();
    let leadership = Leadership::default();
    let mut elector = Elector::new(
        client,
        LeaseConfig::new("berth-system", "node-a"),
        leadership.clone(),
    );
    let held_by_b = json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": "berth-allocator", "namespace": "berth-system", "resourceVersion": "50"},
        "spec": {"holderIdentity": "node-b", "leaseDurationSeconds": 1,
                 "acquireTime": "2026-01-01T00:00:00.000000Z",
                 "renewTime": "2026-01-01T00:00:00.000000Z", "leaseTransitions": 3}});
    let server = tokio::spawn(async move {
        serve(
            &mut handle,
            move |s, log| match (&s.method, log.len()) {
                (&Method::GET, 0 | 1) => (200, held_by_b.clone()),
                (&Method::PUT, 2) => {
                    assert_eq!(s.body["metadata"]["resourceVersion"], "50");
                    assert_eq!(s.body["spec"]["holderIdentity"], "node-a");
                    assert_eq!(s.body["spec"]["leaseTransitions"], 4);
                    (200, stored(s.body.clone(), "51"))
                }
                _ => panic!("unexpected request {s:?}"),
            },
            |log| log.len() == 3,
        )
        .await
    });
    // node-b's record is judged on our clock, from when we first saw it: live for now.
    assert!(!elector.step().await.expect("first step"));
    assert!(!leadership.is_leader());
    // The lease's duration passes on our clock without node-b renewing.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert!(
        elector.step().await.expect("second step"),
        "took over the expired lease"
    );
    assert!(leadership.is_leader());
    finish(server).await;
}

#[test]
fn a_lost_port_is_offered_back_only_while_no_one_else_holds_it() {
    let status = json!({"parents": [serde_json::to_value(our_parent(30005, true, "2026-01-01T00:00:00Z")).unwrap()]});
    let mut objects = gateway_objects(30009);
    objects.push(route("web", "2026-01-01T00:00:00Z", Some(status)));
    let hints = berth::kubernetes::repair::hints(&View::new(objects.clone()));
    assert_eq!(hints.len(), 1);
    assert_eq!(
        (
            hints[0].metadata.name.as_str(),
            hints[0].spec.route.name.as_str()
        ),
        ("gw-tcp-30005", "web")
    );
    objects.push((Kind::PortClaim, obj(claim_json(30005, "api", "Bound", "9"))));
    assert!(
        berth::kubernetes::repair::hints(&View::new(objects)).is_empty(),
        "30005 is api's now"
    );
}

#[test]
fn a_refusal_is_announced_once_as_a_warning() {
    let web = berth::model::RouteKey {
        kind: berth::model::RouteKind::Tcp,
        namespace: "team".into(),
        name: "web".into(),
    };
    let refused = our_parent(30005, false, "2026-01-01T00:00:00Z");
    let merge = |old: Vec<RouteParentStatus>, new: Vec<RouteParentStatus>| {
        let current: Vec<Value> = old
            .iter()
            .map(|p| serde_json::to_value(p).unwrap())
            .collect();
        status::merge_parents(&current, &new)
    };
    let first = berth::kubernetes::events::from_status(
        web.clone(),
        None,
        &merge(
            vec![our_parent(30005, true, "2025-12-31T00:00:00Z")],
            vec![refused.clone()],
        ),
    );
    assert_eq!(first.len(), 1);
    assert!(first[0].warning);
    assert_eq!(first[0].reason, "PortUnavailable");
    assert!(
        first[0].note.starts_with("Gateway infra/gw: "),
        "{}",
        first[0].note
    );
    let again = berth::kubernetes::events::from_status(
        web,
        None,
        &merge(vec![refused.clone()], vec![refused]),
    );
    assert!(again.is_empty(), "no new event while the refusal stands");
}

#[tokio::test]
async fn a_follower_writes_nothing_and_programs_only_stored_claims() {
    let mut objects = gateway_objects(30009);
    objects.push(route("web", "2026-01-01T00:00:00Z", None));
    objects.push(route("api", "2026-01-02T00:00:00Z", None));
    objects.push((Kind::PortClaim, obj(claim_json(30000, "web", "Bound", "5"))));
    let view = View::new(objects);
    let (client, mut handle) = mock();
    let mut c = Controller::new(
        client,
        Versions::default(),
        Leadership::default(),
        "node-b",
        Default::default(),
    );
    let plan = c
        .reconcile(&view, SystemTime::now(), Vec::new())
        .await
        .expect("follower cycle");
    let ports: Vec<u16> = plan.datapath.services.keys().map(|s| s.port).collect();
    assert_eq!(
        ports,
        vec![30000],
        "api's port is not stored yet: not programmed"
    );
    let claimed: Vec<&str> = plan
        .claims
        .iter()
        .map(|c| c.spec.route.name.as_str())
        .collect();
    assert_eq!(claimed, vec!["web"], "only stored claims are shown");
    let api = plan
        .routes
        .iter()
        .find(|r| r.name == "api")
        .expect("api's status");
    let accepted = api.status.parents[0]
        .conditions
        .iter()
        .find(|k| k.kind == "Accepted")
        .expect("Accepted");
    assert_eq!(
        (&*accepted.status, &*accepted.reason),
        ("False", "Pending"),
        "{accepted:?}"
    );
    drop(c);
    assert!(
        handle.next_request().await.is_none(),
        "a follower sends nothing"
    );
}

#[tokio::test]
async fn a_watch_that_fails_is_restarted_and_its_store_catches_up() {
    let (client, mut handle) = mock();
    let changed = Arc::new(Notify::new());
    let resource = Versions::default().resource(Kind::TcpRoute);
    let (store, task) = sources::reflect(client, resource, changed.clone());
    let list_path = format!("{GW}/tcproutes");
    let route_a = serde_json::to_value(&*route("a", "2026-01-01T00:00:00Z", None).1).unwrap();
    let mut route_b = serde_json::to_value(&*route("b", "2026-01-02T00:00:00Z", None).1).unwrap();
    route_b["metadata"]["resourceVersion"] = json!("12");

    // The initial list.
    let (s, reply) = next(&mut handle).await;
    assert!(
        s.is(&Method::GET, &list_path) && !s.query.contains("watch=true"),
        "{s:?}"
    );
    respond(
        reply,
        200,
        &json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "TCPRouteList",
        "metadata": {"resourceVersion": "10"}, "items": [route_a]}),
    );
    // The watch fails with a server error...
    let (s, reply) = next(&mut handle).await;
    assert!(
        s.query.contains("watch=true") && s.query.contains("resourceVersion=10"),
        "{s:?}"
    );
    respond(
        reply,
        500,
        &status_error(500, "InternalError", "etcdserver: leader changed"),
    );
    // ...and is started again from the same version after a backoff.
    let (s, reply) = next(&mut handle).await;
    assert!(
        s.query.contains("watch=true") && s.query.contains("resourceVersion=10"),
        "restarted from the version listed: {s:?}"
    );
    let event = json!({"type": "ADDED", "object": route_b});
    reply.send_response(
        Response::builder()
            .status(200)
            .body(Body::from(format!("{event}\n").into_bytes()))
            .unwrap(),
    );

    let deadline = Instant::now() + Duration::from_secs(10);
    while store.state().len() < 2 {
        assert!(
            Instant::now() < deadline,
            "the store never showed the route added after the restart"
        );
        changed.notified().await;
    }
    let mut names: Vec<String> = store
        .state()
        .iter()
        .map(|o| o.metadata.name.clone().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, vec!["a", "b"]);
    task.abort();
}

#[tokio::test]
async fn routes_fall_back_to_v1alpha2_when_v1_does_not_serve_them() {
    let (client, mut handle) = mock();
    let task = tokio::spawn(async move { sources::discover(&client).await });
    let (s, reply) = next(&mut handle).await;
    assert!(s.is(&Method::GET, GW), "{s:?}");
    respond(
        reply,
        200,
        &json!({"kind": "APIResourceList", "apiVersion": "v1",
        "groupVersion": "gateway.networking.k8s.io/v1", "resources": [
            {"name": "gateways", "singularName": "gateway", "namespaced": true, "kind": "Gateway", "verbs": ["list", "watch"]},
            {"name": "gatewayclasses", "singularName": "gatewayclass", "namespaced": false, "kind": "GatewayClass", "verbs": ["list", "watch"]}
        ]}),
    );
    let v = finish(task).await;
    assert_eq!(
        (
            v.tcp_route.as_str(),
            v.udp_route.as_str(),
            v.reference_grant.as_str()
        ),
        ("v1alpha2", "v1alpha2", "v1beta1")
    );
    assert_eq!(
        v.route(berth::model::RouteKind::Tcp).api_version,
        "gateway.networking.k8s.io/v1alpha2"
    );
}

#[test]
fn a_bad_object_is_left_out_and_named_with_its_field() {
    let mut objects = gateway_objects(30009);
    let (_, mut bad) = route("web", "2026-01-01T00:00:00Z", None);
    Arc::make_mut(&mut bad).data["spec"]["parentRefs"][0]["port"] = json!("eighty");
    objects.push((Kind::TcpRoute, bad));
    let view = View::new(objects);
    assert!(view.snapshot.routes.is_empty());
    assert_eq!(view.errors.len(), 1);
    assert!(
        view.errors[0].starts_with("TCPRoute team/web: field spec.parentRefs[0].port"),
        "{}",
        view.errors[0]
    );
}

/// A list response for `items`.
fn list(kind: &str, items: Vec<Value>) -> Value {
    json!({"apiVersion": "v1", "kind": format!("{kind}List"),
           "metadata": {"resourceVersion": "100"}, "items": items})
}

#[tokio::test]
async fn the_daemon_lists_every_kind_then_leads_allocates_and_publishes_its_state() {
    let (client, mut handle) = mock();
    let fixtures: Vec<Value> = gateway_objects(30009)
        .into_iter()
        .chain([route("web", "2026-01-01T00:00:00Z", None)])
        .map(|(_, o)| serde_json::to_value(&*o).unwrap())
        .collect();
    let of_kind = move |kind: &str| -> Vec<Value> {
        fixtures
            .iter()
            .filter(|o| o["kind"] == kind)
            .cloned()
            .collect()
    };
    let log = Arc::new(std::sync::Mutex::new(Vec::<Seen>::new()));
    let server_log = log.clone();
    let server = tokio::spawn(async move {
        // Watches are held open (never answered) for the whole test.
        let mut watches = Vec::new();
        let mut lease: Option<Value> = None;
        loop {
            let Some((request, reply)) = handle.next_request().await else {
                return;
            };
            let (parts, body) = request.into_parts();
            let bytes = body.collect_bytes().await.unwrap();
            let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
            let (method, path) = (parts.method.clone(), parts.uri.path().to_string());
            let query = parts.uri.query().unwrap_or_default().to_string();
            let (code, answer) = match (method.as_str(), path.as_str()) {
                _ if query.contains("watch=true") => {
                    watches.push(reply);
                    continue;
                }
                ("GET", GW) => (
                    200,
                    json!({"kind": "APIResourceList", "apiVersion": "v1",
                    "groupVersion": "gateway.networking.k8s.io/v1", "resources": [
                    {"name": "tcproutes", "singularName": "tcproute", "namespaced": true, "kind": "TCPRoute", "verbs": ["list"]},
                    {"name": "udproutes", "singularName": "udproute", "namespaced": true, "kind": "UDPRoute", "verbs": ["list"]},
                    {"name": "referencegrants", "singularName": "referencegrant", "namespaced": true, "kind": "ReferenceGrant", "verbs": ["list"]}]}),
                ),
                ("GET", p) if p == format!("{GW}/gatewayclasses") => {
                    (200, list("GatewayClass", of_kind("GatewayClass")))
                }
                ("GET", p) if p == format!("{GW}/gateways") => {
                    (200, list("Gateway", of_kind("Gateway")))
                }
                ("GET", p) if p == format!("{GW}/tcproutes") => {
                    (200, list("TCPRoute", of_kind("TCPRoute")))
                }
                ("GET", "/apis/berth.dev/v1alpha1/gatewayconfigs") => {
                    (200, list("GatewayConfig", of_kind("GatewayConfig")))
                }
                ("GET", p)
                    if p == format!("{GW}/udproutes")
                        || p == format!("{GW}/referencegrants")
                        || p == "/api/v1/services"
                        || p == "/api/v1/namespaces"
                        || p == "/apis/discovery.k8s.io/v1/endpointslices"
                        || p == "/apis/berth.dev/v1alpha1/portclaims"
                        || p == "/apis/berth.dev/v1alpha1/backendhealthpolicies"
                        || p == "/apis/berth.dev/v1alpha1/routetrafficpolicies" =>
                {
                    (200, list("Any", vec![]))
                }
                ("GET", p) if p.ends_with("/leases/berth-allocator") => match &lease {
                    Some(l) => (200, l.clone()),
                    None => (404, status_error(404, "NotFound", "not found")),
                },
                ("POST", p) if p.ends_with("/leases") => {
                    lease = Some(stored(body.clone(), "200"));
                    (201, lease.clone().unwrap())
                }
                ("PUT", p) if p.ends_with("/leases/berth-allocator") => {
                    lease = Some(stored(body.clone(), "201"));
                    (200, lease.clone().unwrap())
                }
                ("POST", CLAIMS) => (201, stored(body.clone(), "201")),
                ("PATCH", p) if p.starts_with(CLAIMS) => {
                    (200, claim_json(30000, "web", "Bound", "202"))
                }
                ("POST", p) if p.ends_with("/events") => (201, stored(body.clone(), "203")),
                ("PATCH", p) if p.ends_with("/status") => (200, body.clone()),
                ("PUT", p) if p.ends_with("/tcproutes/web/status") => (200, body.clone()),
                _ => panic!("unexpected request {method} {path}?{query}"),
            };
            // Logged before the answer: whoever sees the answer sees the log entry.
            server_log.lock().unwrap().push(Seen {
                method,
                path,
                query,
                content_type: String::new(),
                body,
            });
            respond(reply, code, &answer);
        }
    });
    let shared: berth::publish::Shared = Default::default();
    let options = berth::kubernetes::Options {
        identity: "node-a".into(),
        lease_namespace: "berth-system".into(),
        default_addresses: berth::planner::DefaultAddresses::default(),
        snat_ports: berth::planner::DEFAULT_SNAT_PORTS,
        capacity: Default::default(),
    };
    let (shut_down, shutdown) = tokio::sync::oneshot::channel::<()>();
    let stop = async {
        let _ = shutdown.await;
    };
    let control = std::sync::Arc::new(berth::announce::Control::default());
    let announcer =
        berth::announce::Announcer::new(Default::default(), std::sync::Arc::clone(&control), None);
    let daemon = tokio::spawn(berth::kubernetes::run(
        client,
        options,
        None,
        shared.clone(),
        announcer,
        stop,
    ));

    // Poll the published state until the route shows its port.
    let deadline = Instant::now() + Duration::from_secs(10);
    let port = loop {
        let state = shared.lock().unwrap().state.clone();
        let port = state.and_then(|s| {
            s.routes
                .iter()
                .find(|r| r.name == "web")
                .and_then(|r| r.status.parents[0].parent_ref.port)
        });
        let created = log
            .lock()
            .unwrap()
            .iter()
            .any(|l| l.is(&Method::POST, CLAIMS));
        if let (Some(p), true) = (port, created) {
            break p;
        }
        assert!(
            Instant::now() < deadline,
            "no port published: {:?}",
            log.lock().unwrap()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(port, 30000);
    let rows = berth::admin::route_rows(&shared.lock().unwrap(), None);
    assert_eq!(
        rows[0].created.as_deref(),
        Some("2026-01-01T00:00:00Z"),
        "route age from the API server"
    );
    let log_after = log.clone();
    let log = log.lock().unwrap().clone();
    let first_write = log.iter().position(|l| l.method != Method::GET).unwrap();
    let lists = log[..first_write]
        .iter()
        .filter(|l| l.query.contains("limit="))
        .count();
    assert_eq!(
        lists,
        berth::kubernetes::sources::Kind::ALL.len(),
        "every kind is listed before anything is written: {log:?}"
    );
    assert!(
        log[first_write].path.ends_with("/leases"),
        "the lease comes first: {:?}",
        log[first_write]
    );

    // A stopping signal with --drain-on-stop (run.rs resolves the shutdown only after
    // the drain timeout): withdrawn at once while the loop goes on, the lease kept.
    control.stop(std::time::SystemTime::now());
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let state = shared.lock().unwrap().announce.as_ref().map(|a| a.state);
        if state == Some(berth::announce::State::Stopping) {
            break;
        }
        assert!(Instant::now() < deadline, "not stopping: {state:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        !log_after
            .lock()
            .unwrap()
            .iter()
            .any(|l| l.method == Method::PUT
                && l.path.ends_with("/leases/berth-allocator")
                && l.body["spec"].get("holderIdentity").is_none()),
        "the lease is kept while the node drains"
    );

    // Stopping gives the lease back, so that another node allocates at once.
    shut_down.send(()).unwrap();
    finish(daemon).await;
    let log = log_after.lock().unwrap().clone();
    let release = log
        .iter()
        .rfind(|l| l.method == Method::PUT && l.path.ends_with("/leases/berth-allocator"))
        .expect("the lease is written on shutdown");
    assert!(
        release.body["spec"].get("holderIdentity").is_none(),
        "{release:?}"
    );
    assert_eq!(release.body["spec"]["leaseDurationSeconds"], 1);
    server.abort();
}
