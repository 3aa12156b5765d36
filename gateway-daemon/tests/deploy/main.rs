//! Every manifest under `deploy/` is one a cluster would accept, and the DaemonSet and
//! its RBAC are what `berth run --kubernetes` needs and no more:
//! - Gateway API kinds validate against the upstream v1.6.1 CRD schemas, our own kinds
//!   against `deploy/crds.yaml`, core kinds deserialize into the k8s-openapi types; in
//!   all three, no field is unknown (a typo like `hostNetwok` is what the API server
//!   would drop, and `kubectl apply`'s strict field validation refuses).
//! - The DaemonSet: host network, not privileged, every capability dropped and exactly
//!   [`CAPABILITIES`] added (why: the top of `deploy/daemonset.yaml`), no Bidirectional
//!   mount, the host's bpffs mounted where `--pin-dir` points, the admin endpoint (state
//!   API) on loopback and probes on the port of `--metrics-addr` on the node's
//!   addresses, its ServiceAccount defined, every `$(VAR)` of its args defined.
//! - RBAC: bindings point at roles and service accounts that exist; what they grant the
//!   DaemonSet's ServiceAccount is exactly [`NEEDED`]; every rule has a comment naming
//!   each of its verbs.
//! - Each directory's kustomization lists every YAML file there, in apply order.
//! - The example plans as intended: every route accepted, with a port.
//! - The Containerfile builds bpf-linker as `cargo xtask setup` does, and installs the
//!   binary the DaemonSet runs.
//!
//! `each_check_catches_what_it_is_for` breaks each of these and sees it reported.

#[path = "../common/mod.rs"]
mod common;
mod containerfile;
mod daemonset;
mod example;
mod kustomize;
mod rbac;
mod schemas;

use std::{
    collections::{BTreeMap, BTreeSet},
    path::Path,
    time::SystemTime,
};

use common::Schemas;
use containerfile::*;
use daemonset::*;
use example::*;
use k8s_openapi::{
    api::{
        apps::v1::{DaemonSet, Deployment},
        core::v1::{Container, Namespace, Probe, Service, ServiceAccount},
        rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, Subject},
    },
    apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
    apimachinery::pkg::{apis::meta::v1::ObjectMeta, util::intstr::IntOrString},
};
use kustomize::*;
use rbac::*;
use schemas::*;
use serde::{de::DeserializeOwned, Deserialize, Serialize};
use serde_json::Value;

/// One YAML document of a file under `deploy/`.
#[derive(Clone)]
struct Doc {
    /// Path relative to `deploy/`.
    file: String,
    /// 0-based position in the file.
    index: usize,
    value: Value,
}

impl Doc {
    fn str(&self, pointer: &str) -> &str {
        self.value
            .pointer(pointer)
            .and_then(Value::as_str)
            .unwrap_or("")
    }

    fn kind(&self) -> &str {
        self.str("/kind")
    }

    fn name(&self) -> &str {
        self.str("/metadata/name")
    }

    fn namespace(&self) -> Option<&str> {
        self.value
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
    }

    /// `file document N (Kind name)`, for messages.
    fn at(&self) -> String {
        format!(
            "deploy/{} document {} ({} {})",
            self.file,
            self.index + 1,
            self.kind(),
            self.name()
        )
    }

    /// The typed object; `None` when it does not deserialize (the schema check says
    /// why).
    fn typed<T: DeserializeOwned>(&self) -> Option<T> {
        serde_json::from_value(self.value.clone()).ok()
    }
}

/// `deploy/` as read.
#[derive(Clone)]
struct Deploy {
    /// Every file under `deploy/`, by path relative to it (`example/app.yaml`).
    files: BTreeMap<String, String>,
    /// The documents of every YAML file but the kustomizations.
    docs: Vec<Doc>,
    /// `xtask/src/main.rs`, whose `setup` the Containerfile follows.
    xtask: String,
}

fn is_yaml(file: &str) -> bool {
    file.ends_with(".yaml") || file.ends_with(".yml")
}

fn is_kustomization(file: &str) -> bool {
    file == "kustomization.yaml" || file.ends_with("/kustomization.yaml")
}

/// `dir/name`, or `name` when `dir` is empty.
fn join(dir: &str, name: &str) -> String {
    if dir.is_empty() {
        name.to_string()
    } else {
        format!("{dir}/{name}")
    }
}

fn read_tree(dir: &Path, prefix: &str, out: &mut BTreeMap<String, String>) {
    for entry in std::fs::read_dir(dir).expect("read deploy/") {
        let path = entry.expect("entry").path();
        let name = path
            .file_name()
            .expect("name")
            .to_string_lossy()
            .to_string();
        let rel = join(prefix, &name);
        // Prometheus rules and a Grafana dashboard, not Kubernetes objects: checked by
        // tests/tests/monitoring.rs against a real Prometheus.
        if rel == "monitoring" {
            continue;
        }
        if path.is_dir() {
            read_tree(&path, &rel, out);
        } else {
            out.insert(rel, std::fs::read_to_string(&path).expect("read file"));
        }
    }
}

impl Deploy {
    fn read() -> Deploy {
        let root = common::repo_root();
        let mut files = BTreeMap::new();
        read_tree(&root.join("deploy"), "", &mut files);
        let xtask = std::fs::read_to_string(root.join("xtask/src/main.rs")).expect("xtask");
        Deploy::new(files, xtask)
    }

    fn new(files: BTreeMap<String, String>, xtask: String) -> Deploy {
        let docs = files
            .iter()
            .filter(|(f, _)| is_yaml(f) && !is_kustomization(f))
            .flat_map(|(file, text)| {
                common::yaml_documents(text)
                    .into_iter()
                    .enumerate()
                    .map(|(index, value)| Doc {
                        file: file.clone(),
                        index,
                        value,
                    })
            })
            .collect();
        Deploy { files, docs, xtask }
    }

    fn of_kind<'a>(&'a self, kind: &'a str) -> impl Iterator<Item = &'a Doc> + 'a {
        self.docs.iter().filter(move |d| d.kind() == kind)
    }

    /// Replaces the first `from` in `file` with `to`, and reads the documents again.
    fn edit(&mut self, file: &str, from: &str, to: &str) {
        let text = self.files.get_mut(file).expect(file);
        assert!(text.contains(from), "deploy/{file} has no {from:?}");
        *text = text.replacen(from, to, 1);
        *self = Deploy::new(
            std::mem::take(&mut self.files),
            std::mem::take(&mut self.xtask),
        );
    }

    /// The document of `kind` named `name`, to change.
    fn value_mut(&mut self, kind: &str, name: &str) -> &mut Value {
        &mut self
            .docs
            .iter_mut()
            .find(|d| d.kind() == kind && d.name() == name)
            .unwrap_or_else(|| panic!("no {kind} {name} in deploy/"))
            .value
    }

    /// The one DaemonSet (the berth agent), typed.
    fn daemonset(&self) -> Option<(&Doc, DaemonSet)> {
        let doc = self.of_kind("DaemonSet").next()?;
        Some((doc, doc.typed()?))
    }
}

/// Sets the value at a JSON pointer of `kind name` (the parent must exist).
fn set(d: &mut Deploy, kind: &str, name: &str, pointer: &str, value: Value) {
    let (parent, key) = pointer.rsplit_once('/').expect("pointer");
    let doc = d.value_mut(kind, name);
    let parent = doc
        .pointer_mut(parent)
        .unwrap_or_else(|| panic!("{kind} {name} has no {parent}"));
    match parent {
        Value::Array(items) => items[key.parse::<usize>().expect("index")] = value,
        Value::Object(fields) => {
            fields.insert(key.to_string(), value);
        }
        _ => panic!("{kind} {name}: {parent} is neither object nor array"),
    }
}

/// Everything wrong with `d`, one message each.
fn errors(d: &Deploy, upstream: &Schemas) -> Vec<String> {
    let mut out = schema_errors(d, upstream);
    out.extend(daemonset_errors(d));
    out.extend(rbac_errors(d));
    out.extend(rule_comment_errors(d));
    out.extend(kustomization_errors(d));
    out.extend(example_errors(d));
    out.extend(containerfile_errors(d));
    out
}

#[test]
fn deploy_manifests_are_valid_complete_and_least_privilege() {
    let d = Deploy::read();
    let kinds: BTreeSet<&str> = d.docs.iter().map(Doc::kind).collect();
    for kind in [
        "Namespace",
        "CustomResourceDefinition",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
        "DaemonSet",
        "GatewayClass",
        "Gateway",
        "GatewayConfig",
        "TCPRoute",
        "UDPRoute",
    ] {
        assert!(kinds.contains(kind), "deploy/ has no {kind}");
    }
    let errors = errors(&d, &common::upstream_schemas());
    assert!(
        errors.is_empty(),
        "{} problems in deploy/:\n{}",
        errors.len(),
        errors.join("\n")
    );
}

type Break = fn(&mut Deploy);

#[test]
fn each_check_catches_what_it_is_for() {
    let upstream = common::upstream_schemas();
    let good = Deploy::read();
    let cases: &[(&str, Break, &str)] = &[
        (
            "a typo in a pod spec field",
            |d| {
                d.edit("daemonset.yaml", "hostNetwork: true", "hostNetwok: true");
            },
            "unknown field .spec.template.spec.hostNetwok",
        ),
        (
            "a value of the wrong type in a core kind",
            |d| set(d, "DaemonSet", "berth", "/spec/template/spec/hostNetwork", "yes".into()),
            ".spec.template.spec.hostNetwork: invalid type",
        ),
        (
            "an unknown kind",
            |d| set(d, "ServiceAccount", "berth", "/apiVersion", "v2".into()),
            "is not a kind this test validates",
        ),
        (
            "a typo in a Gateway API field",
            |d| d.edit("example/gateway.yaml", "allowedRoutes:", "allowedRoute:"),
            "unknown field .spec.listeners[0].allowedRoute",
        ),
        (
            "a Gateway API value the upstream schema refuses",
            |d| set(d, "Gateway", "shared", "/spec/listeners/0/port", 70000.into()),
            "70000 is greater than the maximum",
        ),
        (
            "a typo in metadata of a custom resource",
            |d| d.edit("example/routes.yaml", "namespace: berth-demo", "namspace: berth-demo"),
            "unknown field .metadata.namspace",
        ),
        (
            "a GatewayConfig value our CRD refuses",
            |d| set(d, "GatewayConfig", "shared-l4", "/spec/listeners/0/endPort", "high".into()),
            "\"high\" is not of type \"integer\"",
        ),
        (
            "a typo in a GatewayConfig field",
            |d| d.edit("example/gateway.yaml", "maxPortsPerNamespace:", "maxPortPerNamespace:"),
            "unknown field .spec.listeners[0].maxPortPerNamespace",
        ),
        (
            "a privileged container",
            |d| set(d, "DaemonSet", "berth", "/spec/template/spec/containers/0/securityContext/privileged", true.into()),
            "container berth is privileged",
        ),
        (
            "capabilities not all dropped",
            |d| set(d, "DaemonSet", "berth", "/spec/template/spec/containers/0/securityContext/capabilities/drop", serde_json::json!(["NET_RAW"])),
            "container berth must drop ALL capabilities",
        ),
        (
            "an extra capability",
            |d| d.edit("daemonset.yaml", "add: [BPF, NET_ADMIN, PERFMON]", "add: [BPF, NET_ADMIN, PERFMON, SYS_ADMIN]"),
            "container berth adds capabilities",
        ),
        (
            "a missing capability",
            |d| d.edit("daemonset.yaml", "add: [BPF, NET_ADMIN, PERFMON]", "add: [BPF, NET_ADMIN]"),
            "container berth adds capabilities",
        ),
        (
            "a capability in the init container",
            |d| set(d, "DaemonSet", "berth", "/spec/template/spec/initContainers/0/securityContext/capabilities/add", serde_json::json!(["BPF"])),
            "container check-bpffs adds capabilities",
        ),
        (
            "privilege escalation allowed",
            |d| set(d, "DaemonSet", "berth", "/spec/template/spec/containers/0/securityContext/allowPrivilegeEscalation", true.into()),
            "allowPrivilegeEscalation must be false",
        ),
        (
            "a writable root filesystem",
            |d| set(d, "DaemonSet", "berth", "/spec/template/spec/containers/0/securityContext/readOnlyRootFilesystem", false.into()),
            "readOnlyRootFilesystem must be true",
        ),
        (
            "no seccomp profile",
            |d| set(d, "DaemonSet", "berth", "/spec/template/spec/securityContext", serde_json::json!({})),
            "seccomp profile must be RuntimeDefault",
        ),
        (
            "a Bidirectional mount",
            |d| d.edit("daemonset.yaml", "mountPropagation: HostToContainer", "mountPropagation: Bidirectional"),
            "Bidirectional, which Kubernetes allows only in privileged containers",
        ),
        (
            "pins outside the host's bpffs",
            |d| d.edit("daemonset.yaml", "- /host/sys/fs/bpf/berth", "- /var/lib/berth/bpf"),
            "is not on the host's bpffs",
        ),
        (
            "pins under /sys/fs, which AppArmor refuses",
            |d| {
                d.edit("daemonset.yaml", "- /host/sys/fs/bpf/berth", "- /sys/fs/bpf/berth");
                d.edit("daemonset.yaml", "mountPath: /host/sys/fs/bpf\n          mountPropagation", "mountPath: /sys/fs/bpf\n          mountPropagation");
            },
            "the default AppArmor profile denies writes under /sys/fs/",
        ),
        (
            "no state volume under a read-only root",
            |d| d.edit("daemonset.yaml", "mountPath: /var/lib/berth", "mountPath: /var/cache/berth"),
            "the state directory /var/lib/berth is not a writable volume",
        ),
        (
            "the state directory on an emptyDir",
            |d| d.edit("daemonset.yaml", "      - name: state\n        hostPath:\n          path: /var/lib/berth\n          type: DirectoryOrCreate", "      - name: state\n        emptyDir: {}"),
            "would not outlive the pod",
        ),
        (
            "no drain on stop",
            |d| d.edit("daemonset.yaml", "        - --drain-on-stop\n", ""),
            "berth's args lack --drain-on-stop",
        ),
        (
            "a grace period shorter than the drain",
            |d| d.edit("daemonset.yaml", "terminationGracePeriodSeconds: 45", "terminationGracePeriodSeconds: 30"),
            "terminationGracePeriodSeconds 30 is not 10 s above --drain-timeout (30 s)",
        ),
        (
            "a drain timeout longer than the grace period",
            |d| d.edit("daemonset.yaml", "        - --drain-on-stop\n", "        - --drain-on-stop\n        - --drain-timeout\n        - 2m\n"),
            "not 10 s above --drain-timeout (120 s)",
        ),
        (
            "no host network",
            |d| set(d, "DaemonSet", "berth", "/spec/template/spec/hostNetwork", false.into()),
            "hostNetwork must be true",
        ),
        (
            "the default DNS policy",
            |d| set(d, "DaemonSet", "berth", "/spec/template/spec/dnsPolicy", "ClusterFirst".into()),
            "dnsPolicy must be ClusterFirstWithHostNet",
        ),
        (
            "two nodes at once",
            |d| d.edit("daemonset.yaml", "maxUnavailable: 1", "maxUnavailable: 2"),
            "maxUnavailable must be 1",
        ),
        (
            "no resource limits",
            |d| d.edit("daemonset.yaml", "            cpu: \"1\"\n", ""),
            "container berth has no resources.limits.cpu",
        ),
        (
            "no priority class",
            |d| d.edit("daemonset.yaml", "priorityClassName: system-node-critical", "priorityClassName: \"\""),
            "priorityClassName must be system-node-critical",
        ),
        (
            "a missing ServiceAccount",
            |d| set(d, "DaemonSet", "berth", "/spec/template/spec/serviceAccountName", "nobody".into()),
            "serviceAccountName nobody: no ServiceAccount berth-system/nobody",
        ),
        (
            "a probe on another port",
            |d| d.edit("daemonset.yaml", "path: /readyz\n            port: 9471", "path: /readyz\n            port: 9470"),
            "readinessProbe port Int(9470) is not the port 9471 of --metrics-addr",
        ),
        (
            "the metrics endpoint moved but not the probes",
            |d| d.edit("daemonset.yaml", "- 0.0.0.0:9471", "- 0.0.0.0:9481"),
            "livenessProbe port Int(9471) is not the port 9481 of --metrics-addr",
        ),
        (
            "the state API on every node address",
            |d| d.edit("daemonset.yaml", "- 127.0.0.1:9470", "- 0.0.0.0:9470"),
            "--admin-addr 0.0.0.0: the state API must stay on loopback",
        ),
        (
            "probes on a loopback address",
            |d| d.edit("daemonset.yaml", "- 0.0.0.0:9471", "- 127.0.0.1:9471"),
            "--metrics-addr 127.0.0.1: the kubelet probes the pod IP",
        ),
        (
            "no metrics endpoint",
            |d| d.edit("daemonset.yaml", "        - --metrics-addr\n        - 0.0.0.0:9471\n", ""),
            "no --metrics-addr HOST:PORT",
        ),
        (
            "readiness on the liveness path",
            |d| d.edit("daemonset.yaml", "path: /readyz", "path: /healthz"),
            "readinessProbe must get /readyz",
        ),
        (
            "an undefined env var in args",
            |d| d.edit("daemonset.yaml", "- name: BERTH_INTERFACE", "- name: BERTH_IFACE"),
            "args use $(BERTH_INTERFACE), which env does not define",
        ),
        (
            "the node name not from the downward API",
            |d| d.edit("daemonset.yaml", "fieldPath: spec.nodeName", "fieldPath: metadata.name"),
            "env NODE_NAME must come from the downward API",
        ),
        (
            "a RoleBinding to a missing Role",
            |d| set(d, "RoleBinding", "berth-leader-election", "/roleRef/name", "leases".into()),
            "roleRef Role leases does not exist",
        ),
        (
            "a ClusterRoleBinding to a missing ServiceAccount",
            |d| set(d, "ClusterRoleBinding", "berth", "/subjects/0/name", "default".into()),
            "subject ServiceAccount berth-system/default does not exist",
        ),
        (
            "a verb the controller does not need",
            |d| d.edit("rbac.yaml", "verbs: [get, create, update]", "verbs: [get, create, update, delete]"),
            "may `delete` leases (group \"coordination.k8s.io\") in namespace berth-system, which the controller does not need",
        ),
        (
            "leases cluster-wide",
            |d| d.edit("rbac.yaml", "kind: Role\n  name: berth-leader-election", "kind: ClusterRole\n  name: berth"),
            "lacks `create` on leases (group \"coordination.k8s.io\") in namespace berth-system",
        ),
        (
            "a wildcard",
            |d| d.edit("rbac.yaml", "resources: [services, namespaces]", "resources: [\"*\"]"),
            "has a wildcard rule",
        ),
        (
            "a verb the controller needs, missing",
            |d| d.edit("rbac.yaml", "verbs: [create, update, patch, delete]", "verbs: [create, update, patch]"),
            "lacks `delete` on portclaims",
        ),
        (
            "a rule whose comment does not say what a verb is for",
            |d| d.edit("rbac.yaml", "# patch: the allocator writes", "# the allocator writes"),
            "has no comment saying what `patch` is for",
        ),
        (
            "a file the kustomization does not list",
            |d| d.edit("kustomization.yaml", "- rbac.yaml\n", ""),
            "deploy/kustomization.yaml does not list rbac.yaml",
        ),
        (
            "a kustomization listing a file that is not there",
            |d| d.edit("example/kustomization.yaml", "- routes.yaml", "- route.yaml"),
            "lists route.yaml, which is not a YAML file there",
        ),
        (
            "a typo in a kustomization",
            |d| d.edit("kustomization.yaml", "resources:", "resource:"),
            "unknown field `resource`",
        ),
        (
            "a Namespace applied after its objects",
            |d| d.edit("kustomization.yaml", "- namespace.yaml\n- crds.yaml\n- serviceaccount.yaml\n", "- crds.yaml\n- serviceaccount.yaml\n- namespace.yaml\n"),
            "applied before its Namespace berth-system",
        ),
        (
            "an image kustomize cannot retarget",
            |d| d.edit("kustomization.yaml", "- name: berth\n", "- name: berth-agent\n"),
            "images does not name berth, which the DaemonSet runs",
        ),
        (
            "a Gateway of a class that is not ours",
            |d| set(d, "Gateway", "shared", "/spec/gatewayClassName", "other".into()),
            "gatewayClassName other is not a GatewayClass of ours",
        ),
        (
            "a GatewayClass of another controller",
            |d| set(d, "GatewayClass", "berth", "/spec/controllerName", "example.com/other".into()),
            "no GatewayClass with controllerName berth.dev/gateway-controller",
        ),
        (
            "a route to a listener that does not exist",
            |d| d.edit("example/routes.yaml", "sectionName: udp-pool", "sectionName: udp-range"),
            "Accepted=\"False\"",
        ),
        (
            "a requested port outside the range",
            |d| d.edit("example/routes.yaml", "port: 20053", "port: 21053"),
            "asks for port 21053 but does not get it",
        ),
        (
            "a backend Service that does not exist",
            |d| d.edit("example/routes.yaml", "- name: echo\n      port: 80", "- name: echo-web\n      port: 80"),
            "ResolvedRefs=\"False\"",
        ),
        (
            "a bpf-linker other than xtask's",
            |d| d.edit("Containerfile", "ARG BPF_LINKER_VERSION=0.13.0", "ARG BPF_LINKER_VERSION=0.12.0"),
            "ARG BPF_LINKER_VERSION=Some(\"0.12.0\"), but xtask setup uses",
        ),
        (
            "the binary installed elsewhere than the DaemonSet runs it",
            |d| d.edit("Containerfile", "COPY --from=build /out/berth /usr/local/bin/berth", "COPY --from=build /out/berth /usr/bin/berth"),
            "but the Containerfile installs Some(\"/usr/bin/berth\")",
        ),
    ];
    let baseline = errors(&good, &upstream);
    assert!(
        baseline.is_empty(),
        "deploy/ is broken already:\n{}",
        baseline.join("\n")
    );
    let mut missed = Vec::new();
    for (what, break_it, expected) in cases {
        let mut d = good.clone();
        break_it(&mut d);
        let found = errors(&d, &upstream);
        if !found.iter().any(|e| e.contains(expected)) {
            missed.push(format!(
                "{what}: no error containing {expected:?}; got:\n  {}",
                found.join("\n  ")
            ));
        }
    }
    assert!(
        missed.is_empty(),
        "checks that did not fire:\n{}",
        missed.join("\n")
    );
}
