//! The upstream Gateway API v1.6.1 conformance scenarios of TCPRoute and UDPRoute
//! (`conformance/tests/tcproute-*` and `udproute-*`), applied to a real kube-apiserver
//! (`berth_tests::kube`) with `berth run --kubernetes` running, and the **status**
//! assertions of their Go tests checked. One test per upstream scenario file, named
//! after it; every message starts with the scenario's upstream ShortName. Needs root.
//!
//! - **Upstream text.** Read at test time from
//!   `../shared/gateway-api/v1.6.1/conformance/` (never copied here): `base/manifests.yaml`
//!   first, then the scenario's `tests/<scenario>.yaml`, with the placeholder
//!   `{GATEWAY_CLASS_NAME}` filled with `berth`, the GatewayClass of
//!   `deploy/gatewayclass.yaml` (controllerName `berth.dev/gateway-controller`). The
//!   object a scenario's Go code creates (the newer route of the multiple-routes
//!   scenarios) is written here as that code writes it.
//! - **Everything is applied**, Deployments and the ConfigMap included; Berth ignores
//!   them. No Pod ever runs: the control plane has no scheduler, no Deployment
//!   controller and no kubelet, so the backends' EndpointSlices stay empty. The TLS
//!   Secret the base HTTPS Gateway names is not in the manifests (the suite makes it in
//!   Go) and is not created: Berth serves no HTTPS or TLS listener.
//! - **Addresses** (the stand-in for an implementation's address assignment): the
//!   suite's Gateways name no address, and an implementation gives each one an address
//!   of its own (a LoadBalancer's); Berth serves `spec.addresses`, or one `--address`
//!   for every Gateway. As an address pool would, the test gives each Gateway it
//!   applies without addresses its own `spec.addresses: [{type: IPAddress, value:
//!   10.251.0.N}]` (N counting from 1 in the order applied), so the Gateways of the
//!   base and of the scenario share no address, as upstream's never do.
//! - **Asserted**: what the Go test asserts about status, with the helpers of
//!   `conformance/utils/kubernetes/helpers.go` re-done below under their upstream
//!   names (`GatewayAndRoutesMustBeAccepted`, `RouteMustHaveParents`,
//!   `TCPRouteMustHaveCondition`, `GatewayMustHaveZeroRoutes`,
//!   `GatewayStatusMustHaveListeners`, `NamespacesMustBeReady`, and the current
//!   `observedGeneration` they require of every condition). Before each scenario, the
//!   GatewayClass must be Accepted (`GWCMustHaveAcceptedConditionTrue`) and the three
//!   base namespaces ready; where upstream's `GatewayAndRoutesMustBeAccepted` checks
//!   the listeners' conditions, the test also requires one status per listener.
//! - **Skipped: traffic** (requests through the gateway, weighted distribution, only
//!   the oldest route answering): no Pod runs, so no backend ever becomes an endpoint
//!   and nothing could answer. `NamespacesMustBeReady`'s Pod half (every Pod Ready) is
//!   skipped for the same reason; its Gateway half is checked.
//! - **UDPRouteNotAllowedByListeners** returns at once upstream unless the
//!   implementation claims TLSRoute support, which Berth does not; its assertions are
//!   checked here all the same (they hold for an L4-only implementation too).

use std::{cell::Cell, future::Future, time::Duration};

use berth_tests::kube::{
    apply, apply_yaml_with, delete, eventually, get_json, install, list_json, repo, ControlPlane,
    CONTROLLER,
};
use kube::Client;
use serde_json::{json, Value};

/// The upstream conformance texts, relative to the repository.
const CONFORMANCE: &str = "../shared/gateway-api/v1.6.1/conformance";
/// The GatewayClass the suite is run with (`deploy/gatewayclass.yaml`).
const CLASS: &str = "berth";
const GATEWAY_API: &str = "gateway.networking.k8s.io/v1";
const GATEWAY_GROUP: &str = "gateway.networking.k8s.io";
/// The suite's namespaces.
const INFRA: &str = "gateway-conformance-infra";
const APP_BACKEND: &str = "gateway-conformance-app-backend";
const WEB_BACKEND: &str = "gateway-conformance-web-backend";
/// How long a status may take to become what a scenario expects (`kube_real`'s too).
const TIMEOUT: Duration = Duration::from_secs(60);

/// A condition expected: type, status, reason (`""`: any status or reason).
type Cond = (&'static str, &'static str, &'static str);
const ACCEPTED: Cond = ("Accepted", "True", "Accepted");
const NOT_ALLOWED: Cond = ("Accepted", "False", "NotAllowedByListeners");
const RESOLVED: Cond = ("ResolvedRefs", "True", "ResolvedRefs");
const BACKEND_NOT_FOUND: Cond = ("ResolvedRefs", "False", "BackendNotFound");
const REF_NOT_PERMITTED: Cond = ("ResolvedRefs", "False", "RefNotPermitted");

/// The route kinds.
const TCP: &str = "TCPRoute";
const UDP: &str = "UDPRoute";

/// Runs scenario `name` (upstream ShortName) of `tests/<file>`: a control plane with
/// Berth installed and running, the base manifests applied and ready, the scenario's
/// manifests applied, then `test`.
fn conformance<F: Future<Output = ()>>(
    name: &'static str,
    file: &'static str,
    test: impl FnOnce(Suite) -> F + Send,
) {
    let mut cp = ControlPlane::start("kc");
    cp.block_on(|client| async move { install(&client).await });
    let berth = cp.start_berth();
    cp.block_on(|client| async move {
        let suite = Suite {
            name,
            client,
            addresses: Cell::new(0),
        };
        suite.apply_upstream("base/manifests.yaml").await;
        suite.gateway_class_must_be_accepted().await;
        suite
            .namespaces_must_be_ready(&[INFRA, APP_BACKEND, WEB_BACKEND])
            .await;
        suite.apply_upstream(&format!("tests/{file}")).await;
        test(suite).await;
    });
    drop(berth);
}

/// One scenario's client and the addresses it gave out.
struct Suite {
    /// The scenario's upstream ShortName, which starts every message.
    name: &'static str,
    client: Client,
    /// Gateways given an address so far.
    addresses: Cell<u8>,
}

/// `ConditionsHaveLatestObservedGeneration`: every condition of `conditions` observed
/// `object`'s current generation.
fn latest(object: &Value, conditions: &Value) -> Result<(), String> {
    let generation = &object["metadata"]["generation"];
    let stale: Vec<String> = conditions
        .as_array()
        .into_iter()
        .flatten()
        .filter(|c| c["observedGeneration"] != *generation)
        .map(|c| format!("{} (generation {})", c["type"], c["observedGeneration"]))
        .collect();
    match stale.is_empty() {
        true => Ok(()),
        false => Err(format!(
            "{} {}: conditions not at generation {generation}: {}",
            object["kind"],
            object["metadata"]["name"],
            stale.join(", ")
        )),
    }
}

/// `findConditionInList`: `conditions` hold `want` (an empty status or reason matches
/// any).
fn find_condition(conditions: &Value, (kind, status, reason): Cond) -> Result<(), String> {
    let found = conditions.as_array().into_iter().flatten().any(|c| {
        c["type"] == kind
            && (status.is_empty() || c["status"] == status)
            && (reason.is_empty() || c["reason"] == reason)
    });
    found.then_some(()).ok_or_else(|| {
        format!("no {kind} condition with status {status:?}, reason {reason:?} in {conditions}")
    })
}

/// Whether a route's parent status entry is for Gateway `gateway` of `INFRA` (a route
/// of `INFRA` may leave the namespace out), as `TCPRouteMustHaveCondition` matches it.
fn for_gateway(parent: &Value, gateway: &str) -> bool {
    let r = &parent["parentRef"];
    r["name"] == gateway && (r["namespace"].is_null() || r["namespace"] == INFRA)
}

/// An expected listener status (`GatewayStatusMustHaveListeners`).
struct Listener {
    name: &'static str,
    /// The one supported kind expected (group gateway.networking.k8s.io).
    kind: &'static str,
    attached: u64,
    conditions: &'static [Cond],
}

impl Suite {
    /// `eventually`, its message starting with the scenario's name.
    async fn eventually<T, F: Future<Output = Result<T, String>>>(
        &self,
        what: &str,
        f: impl FnMut() -> F,
    ) -> T {
        eventually(&format!("{}: {what}", self.name), TIMEOUT, f).await
    }

    /// Applies upstream file `rel` (relative to `conformance/`), the class name
    /// substituted and each Gateway without addresses given its own.
    async fn apply_upstream(&self, rel: &str) {
        let path = repo().join(CONFORMANCE).join(rel);
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
            panic!(
                "upstream conformance text {} (shared/ beside the repository): {e}",
                path.display()
            )
        });
        let text = text.replace("{GATEWAY_CLASS_NAME}", CLASS);
        apply_yaml_with(&self.client, &text, |doc| self.give_address(doc)).await;
    }

    /// Gives a Gateway without `spec.addresses` an address of its own.
    fn give_address(&self, doc: &mut Value) {
        if doc["kind"] == "Gateway" && doc["spec"]["addresses"].is_null() {
            let n = self.addresses.get() + 1;
            self.addresses.set(n);
            doc["spec"]["addresses"] =
                json!([{"type": "IPAddress", "value": format!("10.251.0.{n}")}]);
        }
    }

    async fn gateway(&self, name: &str) -> Result<Value, String> {
        get_json(&self.client, GATEWAY_API, "Gateway", Some(INFRA), name).await
    }

    async fn route(&self, kind: &str, name: &str) -> Result<Value, String> {
        get_json(&self.client, GATEWAY_API, kind, Some(INFRA), name).await
    }

    /// `GWCMustHaveAcceptedConditionTrue`.
    async fn gateway_class_must_be_accepted(&self) {
        self.eventually("GatewayClass berth Accepted", || async {
            let class = get_json(&self.client, GATEWAY_API, "GatewayClass", None, CLASS).await?;
            let conditions = &class["status"]["conditions"];
            latest(&class, conditions)?;
            find_condition(conditions, ("Accepted", "True", ""))
        })
        .await
    }

    /// `NamespacesMustBeReady`, its Gateway half: every Gateway of `namespaces` Accepted
    /// and Programmed at its current generation (the Pod half is skipped: none runs).
    async fn namespaces_must_be_ready(&self, namespaces: &[&str]) {
        let what = format!("the Gateways of {namespaces:?} Accepted and Programmed");
        self.eventually(&what, || async {
            for ns in namespaces {
                for gw in list_json(&self.client, GATEWAY_API, "Gateway", Some(ns)).await? {
                    let skip =
                        &gw["metadata"]["annotations"]["gateway-api/skip-this-for-readiness"];
                    if skip == "true" {
                        continue;
                    }
                    let conditions = &gw["status"]["conditions"];
                    let name = &gw["metadata"]["name"];
                    latest(&gw, conditions)?;
                    for kind in ["Accepted", "Programmed"] {
                        find_condition(conditions, (kind, "True", ""))
                            .map_err(|e| format!("Gateway {ns}/{name}: {e}"))?;
                    }
                }
            }
            Ok(())
        })
        .await
    }

    /// `GatewayAndTCPRoutesMustBeAccepted` / `GatewayAndUDPRoutesMustBeAccepted`: the
    /// Gateway has an address in status, each route an Accepted parent entry of ours
    /// for it (`RouteMustHaveParents`), and every listener is ResolvedRefs, Accepted
    /// and Programmed.
    async fn gateway_and_routes_must_be_accepted(
        &self,
        kind: &str,
        gateway: &str,
        routes: &[&str],
    ) {
        // WaitForGatewayAddress.
        self.eventually(
            &format!("Gateway {gateway} has an address in status"),
            || async {
                let gw = self.gateway(gateway).await?;
                latest(&gw, &gw["status"]["conditions"])?;
                let addresses = &gw["status"]["addresses"];
                let typed = addresses
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|a| a["type"].is_string());
                typed
                    .then_some(())
                    .ok_or(format!("status.addresses {addresses}"))
            },
        )
        .await;
        for route in routes {
            self.route_must_have_accepted_parent(kind, route, gateway)
                .await;
        }
        let what =
            format!("every listener of Gateway {gateway} ResolvedRefs, Accepted, Programmed");
        self.eventually(&what, || async {
            let gw = self.gateway(gateway).await?;
            let listeners = &gw["status"]["listeners"];
            let statuses = listeners.as_array().map_or(0, Vec::len);
            let spec = gw["spec"]["listeners"].as_array().map_or(0, Vec::len);
            if statuses != spec {
                return Err(format!(
                    "{statuses} listener statuses for {spec} listeners: {listeners}"
                ));
            }
            for l in listeners.as_array().into_iter().flatten() {
                for kind in ["ResolvedRefs", "Accepted", "Programmed"] {
                    find_condition(&l["conditions"], (kind, "True", ""))
                        .map_err(|e| format!("listener {}: {e}", l["name"]))?;
                }
            }
            Ok(())
        })
        .await
    }

    /// `RouteMustHaveParents` with the one parent the scenarios expect: Gateway
    /// `gateway` of `INFRA` (group and kind set), our controller, Accepted; every parent
    /// entry's conditions at the route's current generation.
    async fn route_must_have_accepted_parent(&self, kind: &str, route: &str, gateway: &str) {
        let what = format!("{kind} {route} Accepted by Gateway {gateway}");
        self.eventually(&what, || async {
            let r = self.route(kind, route).await?;
            let parents = r["status"]["parents"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            for p in &parents {
                latest(&r, &p["conditions"])?;
            }
            let matched = parents.iter().any(|p| {
                p["controllerName"] == CONTROLLER
                    && p["parentRef"]["group"] == GATEWAY_GROUP
                    && p["parentRef"]["kind"] == "Gateway"
                    && for_gateway(p, gateway)
                    && find_condition(&p["conditions"], ACCEPTED).is_ok()
            });
            matched
                .then_some(())
                .ok_or(format!("status {}", r["status"]))
        })
        .await
    }

    /// `TCPRouteMustHaveCondition` / `UDPRouteMustHaveCondition`: the parent entry for
    /// `gateway` holds `want`; every entry's conditions at the current generation.
    async fn route_must_have_condition(&self, kind: &str, route: &str, gateway: &str, want: Cond) {
        let what = format!("{kind} {route} has {want:?} for Gateway {gateway}");
        self.eventually(&what, || async {
            let r = self.route(kind, route).await?;
            let parents = r["status"]["parents"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            for p in &parents {
                latest(&r, &p["conditions"])?;
            }
            let found = parents
                .iter()
                .any(|p| for_gateway(p, gateway) && find_condition(&p["conditions"], want).is_ok());
            found.then_some(()).ok_or(format!("status {}", r["status"]))
        })
        .await
    }

    /// `GatewayMustHaveZeroRoutes`: no listener in status, or one with no route.
    async fn gateway_must_have_zero_routes(&self, gateway: &str) {
        self.eventually(&format!("Gateway {gateway} has zero routes"), || async {
            let gw = self.gateway(gateway).await?;
            latest(&gw, &gw["status"]["conditions"])?;
            let listeners = gw["status"]["listeners"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            let zero = match listeners.as_slice() {
                [] => true,
                [one] => one["attachedRoutes"] == 0,
                _ => false,
            };
            zero.then_some(()).ok_or(format!("listeners {listeners:?}"))
        })
        .await
    }

    /// `GatewayStatusMustHaveListeners`: exactly the listeners `want`, each with its
    /// supported kind, number of attached routes and conditions.
    async fn gateway_status_must_have_listeners(&self, gateway: &str, want: &[Listener]) {
        self.eventually(
            &format!("Gateway {gateway}'s listener statuses"),
            || async {
                let gw = self.gateway(gateway).await?;
                latest(&gw, &gw["status"]["conditions"])?;
                let actual = gw["status"]["listeners"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default();
                if actual.len() != want.len() {
                    return Err(format!(
                        "{} listener statuses, want {}: {actual:?}",
                        actual.len(),
                        want.len()
                    ));
                }
                for w in want {
                    let l = actual
                        .iter()
                        .find(|l| l["name"] == w.name)
                        .ok_or(format!("no status of listener {}", w.name))?;
                    let kinds = l["supportedKinds"].as_array().cloned().unwrap_or_default();
                    let supported = kinds.iter().any(|k| {
                        k["kind"] == w.kind && (k["group"].is_null() || k["group"] == GATEWAY_GROUP)
                    });
                    if !supported {
                        return Err(format!(
                            "listener {}: {} not in supportedKinds {kinds:?}",
                            w.name, w.kind
                        ));
                    }
                    if l["attachedRoutes"] != w.attached {
                        return Err(format!(
                            "listener {}: attachedRoutes {}, want {}",
                            w.name, l["attachedRoutes"], w.attached
                        ));
                    }
                    for &c in w.conditions {
                        find_condition(&l["conditions"], c)
                            .map_err(|e| format!("listener {}: {e}", w.name))?;
                    }
                }
                Ok(())
            },
        )
        .await
    }

    /// The multiple-routes scenarios: route `older` of `kind` accepted on listener
    /// `listener` of `gateway`, then a newer route to it (created a second later, as
    /// upstream sleeps one second: creation times have whole seconds) with backend
    /// `backend`; both Accepted and the listener counting both.
    async fn multiple_routes_attachment(
        &self,
        kind: &'static str,
        gateway: &str,
        listener: &'static str,
        (older, newer): (&str, &str),
        (backend, port): (&str, u16),
    ) {
        self.namespaces_must_be_ready(&[INFRA]).await;
        self.gateway_and_routes_must_be_accepted(kind, gateway, &[older])
            .await;
        let created = |r: &Value| -> k8s_openapi::jiff::Timestamp {
            let t = r["metadata"]["creationTimestamp"]
                .as_str()
                .unwrap_or_default();
            t.parse()
                .unwrap_or_else(|e| panic!("creationTimestamp {t:?}: {e}"))
        };
        let first = created(&self.route(kind, older).await.expect("the older route"));
        let next_second = first + k8s_openapi::jiff::SignedDuration::from_secs(1);
        self.eventually("a second after the older route's creation", || async {
            let now = k8s_openapi::jiff::Timestamp::now();
            (now >= next_second).then_some(()).ok_or(format!("{now}"))
        })
        .await;
        let newer_route = json!({
            "apiVersion": GATEWAY_API,
            "kind": kind,
            "metadata": {"name": newer, "namespace": INFRA},
            "spec": {
                "parentRefs": [{"name": gateway, "sectionName": listener}],
                "rules": [{"backendRefs": [{"name": backend, "port": port}]}],
            },
        });
        apply(&self.client, newer_route).await;
        let second = created(&self.route(kind, newer).await.expect("the newer route"));
        assert!(
            second > first,
            "{}: {newer} created at {second}, not after {older} ({first})",
            self.name
        );
        self.route_must_have_condition(kind, older, gateway, ACCEPTED)
            .await;
        self.route_must_have_condition(kind, newer, gateway, ACCEPTED)
            .await;
        let listeners = [Listener {
            name: listener,
            kind,
            attached: 2,
            conditions: &[ACCEPTED],
        }];
        self.gateway_status_must_have_listeners(gateway, &listeners)
            .await;
    }
}

/// The scenarios, each shared by the TCPRoute and UDPRoute twins upstream has (their Go
/// tests differ in kind, names and namespaces only).
impl Suite {
    /// `*InvalidBackendRefNonexistent`: ResolvedRefs=False, BackendNotFound.
    async fn invalid_backendref_nonexistent(&self, kind: &str, gateway: &str, route: &str) {
        self.namespaces_must_be_ready(&[INFRA]).await;
        self.route_must_have_condition(kind, route, gateway, BACKEND_NOT_FOUND)
            .await;
    }

    /// `*InvalidCrossNamespaceBackendRef`: Accepted, but ResolvedRefs=False,
    /// RefNotPermitted (no ReferenceGrant).
    async fn invalid_cross_namespace_backend_ref(
        &self,
        kind: &str,
        namespaces: &[&str],
        gateway: &str,
        route: &str,
    ) {
        self.namespaces_must_be_ready(namespaces).await;
        self.gateway_and_routes_must_be_accepted(kind, gateway, &[route])
            .await;
        self.route_must_have_condition(kind, route, gateway, REF_NOT_PERMITTED)
            .await;
    }

    /// `TCPRouteInvalidNonTCPListener`, `UDPRouteNotAllowedByListeners`: a route to a
    /// listener of another protocol is Accepted=False, NotAllowedByListeners, and the
    /// Gateway counts no route.
    async fn not_allowed_by_listeners(&self, kind: &str, gateway: &str, route: &str) {
        self.namespaces_must_be_ready(&[INFRA]).await;
        self.route_must_have_condition(kind, route, gateway, NOT_ALLOWED)
            .await;
        self.gateway_must_have_zero_routes(gateway).await;
    }

    /// `*ParentRefPortAndSectionName`: routes attaching by port, by sectionName and by
    /// both are each Accepted.
    async fn parentref_port_and_section_name(&self, kind: &str, gateway: &str, routes: &[&str]) {
        self.namespaces_must_be_ready(&[INFRA]).await;
        for route in routes {
            self.route_must_have_accepted_parent(kind, route, gateway)
                .await;
        }
    }

    /// `*ReferenceGrant`: Accepted with the reference resolved while ReferenceGrant
    /// `grant` allows it, ResolvedRefs=False, RefNotPermitted once it is deleted.
    /// (TCPRouteReferenceGrant asserts the resolved reference by a request through the
    /// gateway, skipped here; its status says so instead, as the UDP twin asserts.)
    async fn reference_grant(
        &self,
        kind: &str,
        namespaces: &[&str],
        (gateway, route): (&str, &str),
        (grant_namespace, grant): (&str, &str),
    ) {
        self.namespaces_must_be_ready(namespaces).await;
        self.gateway_and_routes_must_be_accepted(kind, gateway, &[route])
            .await;
        self.route_must_have_condition(kind, route, gateway, RESOLVED)
            .await;
        delete(
            &self.client,
            GATEWAY_API,
            "ReferenceGrant",
            Some(grant_namespace),
            grant,
        )
        .await;
        self.route_must_have_condition(kind, route, gateway, REF_NOT_PERMITTED)
            .await;
    }

    /// `*WeightedRouting` (its traffic skipped): the Gateway and the route Accepted.
    async fn weighted_routing(&self, kind: &str, gateway: &str, route: &str) {
        self.namespaces_must_be_ready(&[INFRA]).await;
        self.gateway_and_routes_must_be_accepted(kind, gateway, &[route])
            .await;
    }
}

#[test]
fn tcproute_invalid_backendref_nonexistent() {
    conformance(
        "TCPRouteInvalidBackendRefNonexistent",
        "tcproute-invalid-backendref-nonexistent.yaml",
        |s| async move {
            let route = "tcp-route-invalid-backend-ref-nonexistent";
            s.invalid_backendref_nonexistent(TCP, "tcp-gateway-invalid-backend", route)
                .await
        },
    );
}

#[test]
fn tcproute_invalid_cross_namespace_backend_ref() {
    conformance(
        "TCPRouteInvalidCrossNamespaceBackendRef",
        "tcproute-invalid-cross-namespace-backend-ref.yaml",
        |s| async move {
            let gateway = "tcp-invalid-cross-namespace-backend-ref-gateway";
            let route = "tcp-invalid-cross-namespace-backend-ref";
            s.invalid_cross_namespace_backend_ref(TCP, &[INFRA, WEB_BACKEND], gateway, route)
                .await
        },
    );
}

#[test]
fn tcproute_invalid_non_tcp_listener() {
    conformance(
        "TCPRouteInvalidNonTCPListener",
        "tcproute-invalid-non-tcp-listener.yaml",
        |s| async move {
            s.not_allowed_by_listeners(TCP, "tcp-mixed-protocol-gateway", "tcp-route")
                .await
        },
    );
}

#[test]
fn tcproute_multiple_routes_attachment() {
    conformance(
        "TCPRouteMultipleRoutesAttachment",
        "tcproute-multiple-routes-attachment.yaml",
        |s| async move {
            let routes = ("tcproute-attach-older", "tcproute-attach-newer");
            let newer_backend = ("tcp-attach-backend-2", 3000);
            s.multiple_routes_attachment(
                TCP,
                "tcp-multi-route-attach-gateway",
                "tcp",
                routes,
                newer_backend,
            )
            .await
        },
    );
}

/// TCPRouteParentRefAttachAll: a parentRef with neither sectionName nor port is
/// Accepted (upstream checks the four listeners by traffic only).
#[test]
fn tcproute_parentref_attach_all() {
    conformance(
        "TCPRouteParentRefAttachAll",
        "tcproute-parentref-attach-all.yaml",
        |s| async move {
            s.namespaces_must_be_ready(&[INFRA]).await;
            s.route_must_have_accepted_parent(TCP, "tcp-route-attach-all", "tcp-attach-all-gateway")
                .await
        },
    );
}

#[test]
fn tcproute_parentref_port_and_section_name() {
    conformance(
        "TCPRouteParentRefPortAndSectionName",
        "tcproute-parentref-port-and-section-name.yaml",
        |s| async move {
            let routes = [
                "tcp-route-by-port",
                "tcp-route-by-section",
                "tcp-route-by-section-and-port",
            ];
            s.parentref_port_and_section_name(TCP, "tcp-multi-listener-gateway", &routes)
                .await
        },
    );
}

#[test]
fn tcproute_reference_grant() {
    conformance(
        "TCPRouteReferenceGrant",
        "tcproute-reference-grant.yaml",
        |s| async move {
            let parent = ("tcp-reference-grant-gateway", "tcp-reference-grant");
            let grant = (WEB_BACKEND, "tcp-reference-grant");
            s.reference_grant(TCP, &[INFRA, WEB_BACKEND], parent, grant)
                .await
        },
    );
}

#[test]
fn tcproute_weighted_routing() {
    conformance(
        "TCPRouteWeightedRouting",
        "tcproute-weighted-routing.yaml",
        |s| async move {
            s.weighted_routing(TCP, "tcp-weighted-gateway", "tcp-weighted-route")
                .await
        },
    );
}

#[test]
fn udproute_invalid_backendref_nonexistent() {
    conformance(
        "UDPRouteInvalidBackendRefNonexistent",
        "udproute-invalid-backendref-nonexistent.yaml",
        |s| async move {
            let route = "udp-route-invalid-backend-ref-nonexistent";
            s.invalid_backendref_nonexistent(UDP, "udp-gateway-invalid-backend", route)
                .await
        },
    );
}

#[test]
fn udproute_invalid_cross_namespace_backend_ref() {
    conformance(
        "UDPRouteInvalidCrossNamespaceBackendRef",
        "udproute-invalid-cross-namespace-backend-ref.yaml",
        |s| async move {
            let gateway = "udp-gateway-invalid-cross-namespace-backend-ref";
            let route = "udp-route-invalid-cross-namespace-backend-ref";
            s.invalid_cross_namespace_backend_ref(UDP, &[INFRA], gateway, route)
                .await
        },
    );
}

#[test]
fn udproute_multiple_routes_attachment() {
    conformance(
        "UDPRouteMultipleRoutesAttachment",
        "udproute-multiple-routes-attachment.yaml",
        |s| async move {
            let routes = ("udproute-attach-older", "udproute-attach-newer");
            let newer_backend = ("udp-attach-backend-2", 8080);
            s.multiple_routes_attachment(
                UDP,
                "udp-multi-route-attach-gateway",
                "udp",
                routes,
                newer_backend,
            )
            .await
        },
    );
}

#[test]
fn udproute_not_allowed_by_listeners() {
    conformance(
        "UDPRouteNotAllowedByListeners",
        "udproute-not-allowed-by-listeners.yaml",
        |s| async move {
            let route = "udproute-not-allowed-by-listeners";
            s.not_allowed_by_listeners(UDP, "udproute-tls-only-gateway", route)
                .await
        },
    );
}

/// UDPRouteParentRefAttachAllListeners: a parentRef with neither sectionName nor port
/// is Accepted, and each of the three UDP listeners counts it.
#[test]
fn udproute_parentref_attach_all_listeners() {
    conformance(
        "UDPRouteParentRefAttachAllListeners",
        "udproute-parentref-attach-all-listeners.yaml",
        |s| async move {
            let gateway = "udp-attach-all-listeners-gateway";
            s.namespaces_must_be_ready(&[INFRA]).await;
            s.route_must_have_accepted_parent(UDP, "udp-route-attach-all", gateway)
                .await;
            const READY: &[Cond] = &[("Accepted", "True", ""), ("ResolvedRefs", "True", "")];
            let listeners = ["udp-1", "udp-2", "udp-3"].map(|name| Listener {
                name,
                kind: UDP,
                attached: 1,
                conditions: READY,
            });
            s.gateway_status_must_have_listeners(gateway, &listeners)
                .await;
        },
    );
}

#[test]
fn udproute_parentref_port_and_section_name() {
    conformance(
        "UDPRouteParentRefPortAndSectionName",
        "udproute-parentref-port-and-section-name.yaml",
        |s| async move {
            let routes = [
                "udp-route-by-port",
                "udp-route-by-section",
                "udp-route-by-section-and-port",
            ];
            s.parentref_port_and_section_name(UDP, "udp-multi-listener-gateway", &routes)
                .await
        },
    );
}

#[test]
fn udproute_reference_grant() {
    conformance(
        "UDPRouteReferenceGrant",
        "udproute-reference-grant.yaml",
        |s| async move {
            let parent = ("udp-gateway-reference-grant", "udp-route-reference-grant");
            let grant = (APP_BACKEND, "udp-reference-grant");
            s.reference_grant(UDP, &[INFRA], parent, grant).await
        },
    );
}

/// UDPRoute (udproute-simple): the Gateway and the route Accepted (its DNS query
/// through the gateway skipped).
#[test]
fn udproute_simple() {
    conformance("UDPRoute", "udproute-simple.yaml", |s| async move {
        s.gateway_and_routes_must_be_accepted(UDP, "udp-gateway", &["udp-coredns"])
            .await
    });
}

#[test]
fn udproute_weighted_routing() {
    conformance(
        "UDPRouteWeightedRouting",
        "udproute-weighted-routing.yaml",
        |s| async move {
            s.weighted_routing(UDP, "udp-weighted-gateway", "udp-weighted-route")
                .await
        },
    );
}
