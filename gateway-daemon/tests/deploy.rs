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

mod common;

use std::{
    collections::{BTreeMap, BTreeSet},
    path::Path,
    time::SystemTime,
};

use common::Schemas;
use k8s_openapi::{
    api::{
        apps::v1::{DaemonSet, Deployment},
        core::v1::{Container, Namespace, Probe, Service, ServiceAccount},
        rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, Subject},
    },
    apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
    apimachinery::pkg::{apis::meta::v1::ObjectMeta, util::intstr::IntOrString},
};
use serde::{de::DeserializeOwned, Deserialize, Serialize};
use serde_json::Value;

/// The capabilities the berth container adds, everything else dropped. Why each is
/// needed and others are not is written at the top of `deploy/daemonset.yaml`.
const CAPABILITIES: [&str; 3] = ["BPF", "NET_ADMIN", "PERFMON"];

const GW: &str = "gateway.networking.k8s.io";
const READ: &[&str] = &["get", "list", "watch"];

#[derive(Clone, Copy)]
enum Scope {
    Cluster,
    /// The DaemonSet's own namespace (`POD_NAMESPACE`).
    PodNamespace,
}

/// What the Kubernetes controller calls: (scope, API group, resource, verbs). RBAC must
/// grant exactly this to the DaemonSet's ServiceAccount.
const NEEDED: &[(Scope, &str, &str, &[&str])] = &[
    (Scope::Cluster, GW, "gatewayclasses", READ),
    (Scope::Cluster, GW, "gateways", READ),
    (Scope::Cluster, GW, "tcproutes", READ),
    (Scope::Cluster, GW, "udproutes", READ),
    (Scope::Cluster, GW, "referencegrants", READ),
    // Server-side apply.
    (Scope::Cluster, GW, "gatewayclasses/status", &["patch"]),
    (Scope::Cluster, GW, "gateways/status", &["patch"]),
    // Read-modify-write of the shared status.parents list.
    (Scope::Cluster, GW, "tcproutes/status", &["get", "update"]),
    (Scope::Cluster, GW, "udproutes/status", &["get", "update"]),
    (Scope::Cluster, "", "services", READ),
    (Scope::Cluster, "", "namespaces", READ),
    (Scope::Cluster, "discovery.k8s.io", "endpointslices", READ),
    (Scope::Cluster, "berth.dev", "gatewayconfigs", READ),
    (
        Scope::Cluster,
        "berth.dev",
        "portclaims",
        &[
            "get", "list", "watch", "create", "update", "patch", "delete",
        ],
    ),
    (
        Scope::Cluster,
        "berth.dev",
        "portclaims/status",
        &["update", "patch"],
    ),
    // Events on routes, in the routes' namespaces.
    (
        Scope::Cluster,
        "events.k8s.io",
        "events",
        &["create", "patch"],
    ),
    (Scope::Cluster, "", "events", &["create", "patch"]),
    // Leader election.
    (
        Scope::PodNamespace,
        "coordination.k8s.io",
        "leases",
        &["get", "create", "update"],
    ),
];

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

// ---------------------------------------------------------------------------------------
// Schemas and unknown fields

fn schema_errors(d: &Deploy, upstream: &Schemas) -> Vec<String> {
    let ours = common::crd_schemas(d.files.get("crds.yaml").map_or("", String::as_str));
    let mut out = Vec::new();
    for doc in &d.docs {
        let api_version = doc.str("/apiVersion");
        let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
        let problems = match group {
            GW => custom_resource_errors(doc, upstream, version),
            "berth.dev" => custom_resource_errors(doc, &ours, version),
            _ => core_errors(doc),
        };
        out.extend(problems.into_iter().map(|p| format!("{}: {p}", doc.at())));
    }
    out
}

/// A custom resource: its CRD's schema, no field the schema does not declare, and
/// metadata that is an ObjectMeta.
fn custom_resource_errors(doc: &Doc, schemas: &Schemas, version: &str) -> Vec<String> {
    let Some(schema) = schemas.get(&(doc.kind().to_string(), version.to_string())) else {
        return vec![format!("no CRD schema for {} {version}", doc.kind())];
    };
    let mut out: Vec<String> = schema
        .validator
        .iter_errors(&doc.value)
        .map(|e| format!("{e} at {}", e.instance_path()))
        .collect();
    out.extend(
        common::unknown_fields(&schema.raw, &doc.value)
            .into_iter()
            .map(|f| format!("unknown field {f}")),
    );
    out.extend(round_trip::<ObjectMeta>(
        &doc.value["metadata"],
        ".metadata",
    ));
    out
}

/// A core kind: deserializes into its k8s-openapi type, and nothing is lost on the way.
fn core_errors(doc: &Doc) -> Vec<String> {
    let v = &doc.value;
    match (doc.str("/apiVersion"), doc.kind()) {
        ("v1", "Namespace") => round_trip::<Namespace>(v, ""),
        ("v1", "ServiceAccount") => round_trip::<ServiceAccount>(v, ""),
        ("v1", "Service") => round_trip::<Service>(v, ""),
        ("apps/v1", "DaemonSet") => round_trip::<DaemonSet>(v, ""),
        ("apps/v1", "Deployment") => round_trip::<Deployment>(v, ""),
        ("rbac.authorization.k8s.io/v1", "ClusterRole") => round_trip::<ClusterRole>(v, ""),
        ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding") => {
            round_trip::<ClusterRoleBinding>(v, "")
        }
        ("rbac.authorization.k8s.io/v1", "Role") => round_trip::<Role>(v, ""),
        ("rbac.authorization.k8s.io/v1", "RoleBinding") => round_trip::<RoleBinding>(v, ""),
        ("apiextensions.k8s.io/v1", "CustomResourceDefinition") => {
            round_trip::<CustomResourceDefinition>(v, "")
        }
        (api_version, kind) => vec![format!(
            "{kind} ({api_version}) is not a kind this test validates: add its type"
        )],
    }
}

/// Deserializes `value` into `T` and serializes it back: a field `T` does not have (a
/// typo) is missing from the result, a value of the wrong type fails on the way in.
fn round_trip<T: DeserializeOwned + Serialize>(value: &Value, prefix: &str) -> Vec<String> {
    let typed: T = match serde_path_to_error::deserialize(value.clone()) {
        Ok(t) => t,
        Err(e) => return vec![format!("{prefix}.{}: {}", e.path(), e.inner())],
    };
    let back = serde_json::to_value(&typed).expect("serializes");
    let mut out = Vec::new();
    compare(value, &back, prefix, &mut out);
    out
}

fn compare(original: &Value, back: &Value, path: &str, out: &mut Vec<String>) {
    match (original, back) {
        (Value::Object(a), Value::Object(b)) => {
            for (key, v) in a {
                let here = format!("{path}.{key}");
                match b.get(key) {
                    Some(w) => compare(v, w, &here, out),
                    None => out.push(format!("unknown field {here}")),
                }
            }
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => {
            for (i, (v, w)) in a.iter().zip(b).enumerate() {
                compare(v, w, &format!("{path}[{i}]"), out);
            }
        }
        (a, b) if a == b => {}
        (a, b) => out.push(format!("{path}: {a} reads back as {b}")),
    }
}

// ---------------------------------------------------------------------------------------
// The DaemonSet

/// The value after `flag` in `args`.
fn flag<'a>(args: &'a [String], flag: &str) -> Option<&'a str> {
    let i = args.iter().position(|a| a == flag)?;
    args.get(i + 1).map(String::as_str)
}

/// The `$(VAR)` references in `arg`.
fn var_refs(arg: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = arg;
    while let Some(start) = rest.find("$(") {
        let Some(len) = rest[start + 2..].find(')') else {
            break;
        };
        out.push(&rest[start + 2..start + 2 + len]);
        rest = &rest[start + 2 + len..];
    }
    out
}

fn daemonset_errors(d: &Deploy) -> Vec<String> {
    let count = d.of_kind("DaemonSet").count();
    if count != 1 {
        return vec![format!("deploy/ should hold one DaemonSet, not {count}")];
    }
    let Some((doc, ds)) = d.daemonset() else {
        return Vec::new(); // the schema check says why it does not deserialize
    };
    let mut e = Vec::new();
    let ns = doc.namespace().unwrap_or("default");
    let spec = ds.spec;

    let strategy = spec.update_strategy.unwrap_or_default();
    if strategy.type_.as_deref() != Some("RollingUpdate") {
        e.push("updateStrategy.type must be RollingUpdate".to_string());
    }
    let rolling = strategy.rolling_update.unwrap_or_default();
    if rolling.max_unavailable != Some(IntOrString::Int(1)) {
        e.push("updateStrategy.rollingUpdate.maxUnavailable must be 1".to_string());
    }
    if !matches!(rolling.max_surge, None | Some(IntOrString::Int(0))) {
        e.push("maxSurge must be 0: two pods on a node would both bind the admin port".into());
    }

    let pod = spec.template.spec.unwrap_or_default();
    if pod.host_network != Some(true) {
        e.push("hostNetwork must be true: XDP attaches to the node's own interface".into());
    }
    if pod.dns_policy.as_deref() != Some("ClusterFirstWithHostNet") {
        e.push(
            "dnsPolicy must be ClusterFirstWithHostNet (cluster DNS on the host network)".into(),
        );
    }
    if pod.host_pid == Some(true) || pod.host_ipc == Some(true) {
        e.push("hostPID and hostIPC are not needed".to_string());
    }
    if pod.priority_class_name.as_deref() != Some("system-node-critical") {
        e.push("priorityClassName must be system-node-critical (a node's datapath)".into());
    }
    let tolerates_all =
        pod.tolerations.iter().flatten().any(|t| {
            t.operator.as_deref() == Some("Exists") && t.key.is_none() && t.effect.is_none()
        });
    if !tolerates_all {
        e.push("tolerations must include `operator: Exists` (every taint)".to_string());
    }
    match pod.service_account_name.as_deref() {
        None => e.push("serviceAccountName is not set".to_string()),
        Some(sa) => {
            if !d
                .of_kind("ServiceAccount")
                .any(|s| s.name() == sa && s.namespace() == Some(ns))
            {
                e.push(format!(
                    "serviceAccountName {sa}: no ServiceAccount {ns}/{sa} in deploy/"
                ));
            }
        }
    }

    let pod_seccomp = pod
        .security_context
        .as_ref()
        .and_then(|s| s.seccomp_profile.as_ref())
        .map(|p| p.type_.clone());
    let containers: Vec<&Container> = pod
        .init_containers
        .iter()
        .flatten()
        .chain(&pod.containers)
        .collect();
    for c in &containers {
        e.extend(container_errors(c, pod_seccomp.as_deref()));
    }
    let images: BTreeSet<&str> = containers
        .iter()
        .filter_map(|c| c.image.as_deref())
        .collect();
    if images.len() != 1 {
        e.push(format!(
            "containers should all run the berth image, not {images:?}"
        ));
    }

    let Some(main) = pod.containers.iter().find(|c| c.name == "berth") else {
        e.push("no container named berth".to_string());
        return e
            .into_iter()
            .map(|m| format!("{}: {m}", doc.at()))
            .collect();
    };
    let args: Vec<String> = main
        .command
        .iter()
        .flatten()
        .chain(main.args.iter().flatten())
        .cloned()
        .collect();
    for required in ["run", "--kubernetes"] {
        if !args.iter().any(|a| a == required) {
            e.push(format!("berth's args lack {required}"));
        }
    }
    let env: BTreeMap<&str, _> = main
        .env
        .iter()
        .flatten()
        .map(|v| (v.name.as_str(), v))
        .collect();
    for arg in &args {
        for var in var_refs(arg) {
            if !env.contains_key(var) {
                e.push(format!("args use $({var}), which env does not define"));
            }
        }
    }
    for (var, field) in [
        ("NODE_NAME", "spec.nodeName"),
        ("POD_NAMESPACE", "metadata.namespace"),
    ] {
        let from = env
            .get(var)
            .and_then(|v| v.value_from.as_ref())
            .and_then(|f| f.field_ref.as_ref())
            .map(|f| f.field_path.as_str());
        if from != Some(field) {
            e.push(format!(
                "env {var} must come from the downward API ({field})"
            ));
        }
    }
    if flag(&args, "--node-name") != Some("$(NODE_NAME)") {
        e.push("--node-name must be $(NODE_NAME)".to_string());
    }
    if flag(&args, "--interface") != Some("$(BERTH_INTERFACE)")
        || env
            .get("BERTH_INTERFACE")
            .and_then(|v| v.value.as_deref())
            .is_none_or(str::is_empty)
    {
        e.push("--interface must be $(BERTH_INTERFACE), an env var with a default".into());
    }

    // With the host network, what berth listens on is on the node's addresses: the state
    // API (every route, claim and backend) stays on loopback; probes (the kubelet's go
    // to the pod IP, the node's) and Prometheus use the metrics endpoint, which must be
    // on the node's addresses.
    let host_port = |f: &str| {
        flag(&args, f)
            .and_then(|a| a.rsplit_once(':'))
            .and_then(|(h, p)| Some((h.trim_matches(['[', ']']), p.parse::<i32>().ok()?)))
    };
    let loopback = |host: &str| {
        host == "localhost"
            || host
                .parse()
                .is_ok_and(|ip: std::net::IpAddr| ip.is_loopback())
    };
    match host_port("--admin-addr") {
        None => e.push("no --admin-addr HOST:PORT in berth's args".to_string()),
        Some((host, _)) if !loopback(host) => e.push(format!(
            "--admin-addr {host}: the state API must stay on loopback (127.0.0.1)"
        )),
        Some(_) => {}
    }
    match host_port("--metrics-addr") {
        None => e.push("no --metrics-addr HOST:PORT in berth's args (for the probes)".to_string()),
        Some((host, _)) if loopback(host) => e.push(format!(
            "--metrics-addr {host}: the kubelet probes the pod IP, not loopback"
        )),
        Some((_, metrics)) => {
            for (what, probe, path, required) in [
                ("livenessProbe", &main.liveness_probe, "/healthz", true),
                ("readinessProbe", &main.readiness_probe, "/readyz", true),
                ("startupProbe", &main.startup_probe, "/healthz", false),
            ] {
                e.extend(probe_errors(
                    main,
                    what,
                    probe.as_ref(),
                    path,
                    required,
                    metrics,
                ));
            }
        }
    }

    // The host's bpffs, where --pin-dir points.
    let pin_dir = flag(&args, "--pin-dir").unwrap_or("/sys/fs/bpf/berth");
    let bpffs = pod.volumes.iter().flatten().find(|v| {
        v.host_path
            .as_ref()
            .is_some_and(|h| h.path.trim_end_matches('/') == "/sys/fs/bpf")
    });
    let mount = bpffs.and_then(|v| {
        main.volume_mounts
            .iter()
            .flatten()
            .find(|m| m.name == v.name)
    });
    match mount {
        None => e.push("berth has no mount of a hostPath volume of /sys/fs/bpf".to_string()),
        Some(m) => {
            if m.mount_propagation.as_deref() != Some("HostToContainer") {
                e.push(format!(
                    "the bpffs mount must use mountPropagation HostToContainer, not {:?}",
                    m.mount_propagation
                ));
            }
            if m.read_only == Some(true) {
                e.push("the bpffs mount must be writable (pins)".to_string());
            }
            if !pin_dir.starts_with(&format!("{}/", m.mount_path.trim_end_matches('/'))) {
                e.push(format!(
                    "--pin-dir {pin_dir} is not on the host's bpffs (mounted at {})",
                    m.mount_path
                ));
            }
        }
    }
    if pin_dir.starts_with("/sys/fs/") {
        e.push(format!(
            "--pin-dir {pin_dir}: the default AppArmor profile denies writes under /sys/fs/"
        ));
    }
    // With a read-only root filesystem, the state directory must be a volume.
    let state_dir = flag(&args, "--state-dir").unwrap_or("/var/lib/berth");
    if !main.volume_mounts.iter().flatten().any(|m| {
        let mount = m.mount_path.trim_end_matches('/');
        state_dir == mount || state_dir.starts_with(&format!("{mount}/"))
    }) {
        e.push(format!(
            "the state directory {state_dir} is not a writable volume"
        ));
    }
    e.into_iter()
        .map(|m| format!("{}: {m}", doc.at()))
        .collect()
}

fn container_errors(c: &Container, pod_seccomp: Option<&str>) -> Vec<String> {
    let mut e = Vec::new();
    let name = &c.name;
    let sc = c.security_context.clone().unwrap_or_default();
    if sc.privileged == Some(true) {
        e.push(format!("container {name} is privileged"));
    }
    if sc.allow_privilege_escalation != Some(false) {
        e.push(format!(
            "container {name}: allowPrivilegeEscalation must be false"
        ));
    }
    if sc.read_only_root_filesystem != Some(true) {
        e.push(format!(
            "container {name}: readOnlyRootFilesystem must be true"
        ));
    }
    let caps = sc.capabilities.unwrap_or_default();
    if caps.drop.as_deref() != Some(&["ALL".to_string()][..]) {
        e.push(format!("container {name} must drop ALL capabilities"));
    }
    let added: BTreeSet<&str> = caps.add.iter().flatten().map(String::as_str).collect();
    let wanted: BTreeSet<&str> = if name == "berth" {
        CAPABILITIES.into_iter().collect()
    } else {
        BTreeSet::new()
    };
    if added != wanted {
        e.push(format!(
            "container {name} adds capabilities {added:?}, not exactly {wanted:?}"
        ));
    }
    let seccomp = sc
        .seccomp_profile
        .as_ref()
        .map(|p| p.type_.as_str())
        .or(pod_seccomp);
    if seccomp != Some("RuntimeDefault") {
        e.push(format!(
            "container {name}: seccomp profile must be RuntimeDefault"
        ));
    }
    let resources = c.resources.clone().unwrap_or_default();
    for (what, set) in [
        ("requests", &resources.requests),
        ("limits", &resources.limits),
    ] {
        for resource in ["cpu", "memory"] {
            if !set.as_ref().is_some_and(|s| s.contains_key(resource)) {
                e.push(format!(
                    "container {name} has no resources.{what}.{resource}"
                ));
            }
        }
    }
    for m in c.volume_mounts.iter().flatten() {
        if m.mount_propagation.as_deref() == Some("Bidirectional") {
            e.push(format!(
                "container {name}: mount {} is Bidirectional, which Kubernetes allows only \
                 in privileged containers",
                m.name
            ));
        }
    }
    e
}

fn probe_errors(
    c: &Container,
    what: &str,
    probe: Option<&Probe>,
    path: &str,
    required: bool,
    metrics: i32,
) -> Vec<String> {
    let Some(probe) = probe else {
        return if required {
            vec![format!("berth has no {what}")]
        } else {
            Vec::new()
        };
    };
    let Some(get) = &probe.http_get else {
        return vec![format!("{what} must be an httpGet of {path}")];
    };
    let mut e = Vec::new();
    if get.path.as_deref() != Some(path) {
        e.push(format!("{what} must get {path}, not {:?}", get.path));
    }
    let port = match &get.port {
        IntOrString::Int(p) => Some(*p),
        IntOrString::String(name) => c
            .ports
            .iter()
            .flatten()
            .find(|p| p.name.as_deref() == Some(name))
            .map(|p| p.container_port),
    };
    if port != Some(metrics) {
        e.push(format!(
            "{what} port {:?} is not the port {metrics} of --metrics-addr",
            get.port
        ));
    }
    e
}

// ---------------------------------------------------------------------------------------
// RBAC

/// (namespace, or none for cluster-wide; API group; resource; verb).
type Grant = (Option<String>, String, String, String);

fn scope_text(scope: &Option<String>) -> String {
    match scope {
        None => "cluster-wide".to_string(),
        Some(ns) => format!("in namespace {ns}"),
    }
}

fn expand(rules: &[PolicyRule], scope: &Option<String>, out: &mut BTreeSet<Grant>) {
    for rule in rules {
        for group in rule.api_groups.iter().flatten() {
            for resource in rule.resources.iter().flatten() {
                for verb in &rule.verbs {
                    out.insert((scope.clone(), group.clone(), resource.clone(), verb.clone()));
                }
            }
        }
    }
}

fn rbac_errors(d: &Deploy) -> Vec<String> {
    let mut e = Vec::new();
    // (namespace of a Role, or none for a ClusterRole; name) → rules.
    let mut roles: BTreeMap<(Option<String>, String), Vec<PolicyRule>> = BTreeMap::new();
    for doc in d.of_kind("ClusterRole") {
        if let Some(r) = doc.typed::<ClusterRole>() {
            roles.insert((None, doc.name().into()), r.rules.unwrap_or_default());
        }
    }
    for doc in d.of_kind("Role") {
        if let Some(r) = doc.typed::<Role>() {
            let ns = doc.namespace().map(str::to_string);
            roles.insert((ns, doc.name().into()), r.rules.unwrap_or_default());
        }
    }
    for ((ns, name), rules) in &roles {
        for rule in rules {
            let wild = |v: &Option<Vec<String>>| v.iter().flatten().any(|x| x.contains('*'));
            if wild(&rule.api_groups)
                || wild(&rule.resources)
                || rule.verbs.iter().any(|v| v == "*")
            {
                e.push(format!(
                    "role {name} ({}) has a wildcard rule",
                    scope_text(ns)
                ));
            }
            if rule.non_resource_urls.is_some() {
                e.push(format!("role {name} grants non-resource URLs"));
            }
        }
    }
    let accounts: BTreeSet<(String, String)> = d
        .of_kind("ServiceAccount")
        .map(|s| (s.namespace().unwrap_or("default").into(), s.name().into()))
        .collect();

    // ServiceAccount (namespace, name) → what its bindings grant it.
    let mut grants: BTreeMap<(String, String), BTreeSet<Grant>> = BTreeMap::new();
    let mut bind = |doc: &Doc,
                    binding_ns: Option<&str>,
                    role_ref: &k8s_openapi::api::rbac::v1::RoleRef,
                    subjects: &[Subject],
                    e: &mut Vec<String>| {
        let (key, scope) = match (role_ref.kind.as_str(), binding_ns) {
            ("ClusterRole", None) => ((None, role_ref.name.clone()), None),
            ("ClusterRole", Some(ns)) => ((None, role_ref.name.clone()), Some(ns.to_string())),
            ("Role", Some(ns)) => (
                (Some(ns.to_string()), role_ref.name.clone()),
                Some(ns.to_string()),
            ),
            (kind, _) => {
                e.push(format!(
                    "{}: roleRef kind {kind} cannot be bound here",
                    doc.at()
                ));
                return;
            }
        };
        if role_ref.api_group.as_deref() != Some("rbac.authorization.k8s.io") {
            e.push(format!(
                "{}: roleRef.apiGroup must be rbac.authorization.k8s.io",
                doc.at()
            ));
        }
        let Some(rules) = roles.get(&key) else {
            e.push(format!(
                "{}: roleRef {} {} does not exist in deploy/",
                doc.at(),
                role_ref.kind,
                role_ref.name
            ));
            return;
        };
        if subjects.is_empty() {
            e.push(format!("{}: binds no one", doc.at()));
        }
        for s in subjects {
            if s.kind != "ServiceAccount" {
                e.push(format!(
                    "{}: binds {} {}: only berth's ServiceAccount should be bound",
                    doc.at(),
                    s.kind,
                    s.name
                ));
                continue;
            }
            let Some(ns) = s.namespace.as_deref().or(binding_ns) else {
                e.push(format!("{}: subject {} has no namespace", doc.at(), s.name));
                continue;
            };
            let account = (ns.to_string(), s.name.clone());
            if !accounts.contains(&account) {
                e.push(format!(
                    "{}: subject ServiceAccount {ns}/{} does not exist in deploy/",
                    doc.at(),
                    s.name
                ));
                continue;
            }
            expand(rules, &scope, grants.entry(account).or_default());
        }
    };
    for doc in d.of_kind("ClusterRoleBinding") {
        if let Some(b) = doc.typed::<ClusterRoleBinding>() {
            bind(
                doc,
                None,
                &b.role_ref,
                &b.subjects.unwrap_or_default(),
                &mut e,
            );
        }
    }
    for doc in d.of_kind("RoleBinding") {
        if let Some(b) = doc.typed::<RoleBinding>() {
            let ns = doc.namespace().unwrap_or("default");
            bind(
                doc,
                Some(ns),
                &b.role_ref,
                &b.subjects.unwrap_or_default(),
                &mut e,
            );
        }
    }

    // What berth's ServiceAccount may do is exactly what the controller does.
    let Some((doc, ds)) = d.daemonset() else {
        return e;
    };
    let ns = doc.namespace().unwrap_or("default").to_string();
    let sa = ds
        .spec
        .template
        .spec
        .and_then(|p| p.service_account_name)
        .unwrap_or_else(|| "default".into());
    let mut needed = BTreeSet::new();
    for (scope, group, resource, verbs) in NEEDED {
        let scope = match scope {
            Scope::Cluster => None,
            Scope::PodNamespace => Some(ns.clone()),
        };
        for verb in *verbs {
            needed.insert((
                scope.clone(),
                group.to_string(),
                resource.to_string(),
                verb.to_string(),
            ));
        }
    }
    let granted = grants.remove(&(ns.clone(), sa.clone())).unwrap_or_default();
    for (scope, group, resource, verb) in needed.difference(&granted) {
        e.push(format!(
            "ServiceAccount {ns}/{sa} lacks `{verb}` on {resource} (group {group:?}) {}, which the controller needs",
            scope_text(scope)
        ));
    }
    for (scope, group, resource, verb) in granted.difference(&needed) {
        e.push(format!(
            "ServiceAccount {ns}/{sa} may `{verb}` {resource} (group {group:?}) {}, which the controller does not need (least privilege)",
            scope_text(scope)
        ));
    }
    for (ns, name) in grants.keys() {
        e.push(format!(
            "ServiceAccount {ns}/{name} is granted rights but is not berth's"
        ));
    }
    e
}

/// The documents of a YAML text, split at `---` lines.
fn document_texts(text: &str) -> Vec<String> {
    let mut out = vec![String::new()];
    for line in text.lines() {
        if line.trim_end() == "---" {
            out.push(String::new());
        } else {
            let last = out.last_mut().expect("one");
            last.push_str(line);
            last.push('\n');
        }
    }
    out
}

/// Every rule of a Role or ClusterRole is written `- apiGroups: ...` under a comment that
/// names each of its verbs (saying what it is for).
fn rule_comment_errors(d: &Deploy) -> Vec<String> {
    let mut e = Vec::new();
    for (file, text) in d.files.iter().filter(|(f, _)| is_yaml(f)) {
        for chunk in document_texts(text) {
            let Some(doc) = common::yaml_documents(&chunk).into_iter().next() else {
                continue;
            };
            if !matches!(doc["kind"].as_str(), Some("Role" | "ClusterRole")) {
                continue;
            }
            let rules = doc["rules"].as_array().cloned().unwrap_or_default();
            let lines: Vec<&str> = chunk.lines().collect();
            let starts: Vec<usize> = (0..lines.len())
                .filter(|&i| lines[i].trim_start().starts_with("- apiGroups:"))
                .collect();
            let role = doc["metadata"]["name"].as_str().unwrap_or("?");
            if starts.len() != rules.len() {
                e.push(format!(
                    "deploy/{file} ({role}): write each rule as `- apiGroups: ...` under its comment"
                ));
                continue;
            }
            for (rule, &start) in rules.iter().zip(&starts) {
                let comment: Vec<&str> = lines[..start]
                    .iter()
                    .rev()
                    .take_while(|l| l.trim_start().starts_with('#'))
                    .copied()
                    .collect();
                let words: BTreeSet<&str> = comment
                    .iter()
                    .flat_map(|l| l.split(|c: char| !c.is_ascii_alphanumeric()))
                    .collect();
                for verb in rule["verbs"].as_array().into_iter().flatten() {
                    let verb = verb.as_str().unwrap_or("?");
                    if !words.contains(verb) {
                        e.push(format!(
                            "deploy/{file} ({role}): the rule for {} has no comment saying what `{verb}` is for",
                            rule["resources"]
                        ));
                    }
                }
            }
        }
    }
    e
}

// ---------------------------------------------------------------------------------------
// Kustomizations

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Kustomization {
    api_version: String,
    kind: String,
    #[serde(default)]
    resources: Vec<String>,
    #[serde(default)]
    images: Vec<KustomizeImage>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[allow(dead_code)] // read for the field check; only `name` is compared
struct KustomizeImage {
    name: String,
    new_name: Option<String>,
    new_tag: Option<String>,
    digest: Option<String>,
}

/// An image reference without its tag or digest.
fn repository(image: &str) -> &str {
    let image = image.split('@').next().unwrap_or(image);
    match image.rsplit_once(':') {
        Some((repo, tag)) if !tag.contains('/') => repo,
        _ => image,
    }
}

fn kustomization_errors(d: &Deploy) -> Vec<String> {
    let mut e = Vec::new();
    // Directory → its YAML files (kustomization.yaml aside).
    let mut dirs: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for file in d.files.keys().filter(|f| is_yaml(f)) {
        let (dir, name) = file.rsplit_once('/').unwrap_or(("", file));
        let entry = dirs.entry(dir).or_default();
        if name != "kustomization.yaml" {
            entry.insert(name);
        }
    }
    for (dir, yamls) in dirs {
        let path = join(dir, "kustomization.yaml");
        let Some(text) = d.files.get(&path) else {
            e.push(format!(
                "deploy/{dir} has YAML files but no kustomization.yaml"
            ));
            continue;
        };
        let k: Kustomization = match serde_yaml::from_str(text) {
            Ok(k) => k,
            Err(err) => {
                e.push(format!("deploy/{path}: {err}"));
                continue;
            }
        };
        if k.api_version != "kustomize.config.k8s.io/v1beta1" || k.kind != "Kustomization" {
            e.push(format!(
                "deploy/{path}: not a kustomize.config.k8s.io/v1beta1 Kustomization"
            ));
        }
        let listed: BTreeSet<&str> = k.resources.iter().map(String::as_str).collect();
        if listed.len() != k.resources.len() {
            e.push(format!("deploy/{path} lists a file twice"));
        }
        for f in yamls.difference(&listed) {
            e.push(format!("deploy/{path} does not list {f}"));
        }
        for f in listed.difference(&yamls) {
            e.push(format!(
                "deploy/{path} lists {f}, which is not a YAML file there"
            ));
        }
        e.extend(order_errors(d, dir, &k.resources));

        // Images: `kustomize edit set image` must find the ones the containers use.
        let docs: Vec<&Doc> = d
            .docs
            .iter()
            .filter(|doc| k.resources.iter().any(|r| join(dir, r) == doc.file))
            .collect();
        let used: BTreeSet<&str> = docs
            .iter()
            .filter(|doc| doc.kind() == "DaemonSet")
            .flat_map(|doc| {
                ["initContainers", "containers"]
                    .into_iter()
                    .flat_map(move |list| {
                        doc.value["spec"]["template"]["spec"][list]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .filter_map(|c| c["image"].as_str())
                    })
            })
            .map(repository)
            .collect();
        let named: BTreeSet<&str> = k.images.iter().map(|i| i.name.as_str()).collect();
        for image in used.difference(&named) {
            e.push(format!(
                "deploy/{path}: images does not name {image}, which the DaemonSet runs"
            ));
        }
        for image in named.difference(&used) {
            e.push(format!(
                "deploy/{path}: images names {image}, which nothing runs"
            ));
        }
    }
    e
}

/// Within one kustomization, a Namespace comes before the objects in it and a CRD before
/// the objects of its kind.
fn order_errors(d: &Deploy, dir: &str, resources: &[String]) -> Vec<String> {
    let files: Vec<String> = resources.iter().map(|r| join(dir, r)).collect();
    let docs: Vec<&Doc> = files
        .iter()
        .flat_map(|f| d.docs.iter().filter(move |doc| &doc.file == f))
        .collect();
    let namespaces: BTreeSet<&str> = docs
        .iter()
        .filter(|doc| doc.kind() == "Namespace")
        .map(|doc| doc.name())
        .collect();
    let crd_kinds: BTreeSet<&str> = docs
        .iter()
        .filter(|doc| doc.kind() == "CustomResourceDefinition")
        .map(|doc| doc.str("/spec/names/kind"))
        .collect();
    let mut seen_namespaces = BTreeSet::new();
    let mut seen_kinds = BTreeSet::new();
    let mut e = Vec::new();
    for doc in docs {
        if let Some(ns) = doc.namespace() {
            if namespaces.contains(ns) && !seen_namespaces.contains(ns) {
                e.push(format!("{}: applied before its Namespace {ns}", doc.at()));
            }
        }
        if crd_kinds.contains(doc.kind()) && !seen_kinds.contains(doc.kind()) {
            e.push(format!("{}: applied before its CRD", doc.at()));
        }
        match doc.kind() {
            "Namespace" => {
                seen_namespaces.insert(doc.name());
            }
            "CustomResourceDefinition" => {
                seen_kinds.insert(doc.str("/spec/names/kind"));
            }
            _ => {}
        }
    }
    e
}

// ---------------------------------------------------------------------------------------
// The GatewayClass and the example

const CONTROLLER: &str = "berth.dev/gateway-controller";

fn condition_true(conditions: &Value, kind: &str) -> Result<(), String> {
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

fn example_errors(d: &Deploy) -> Vec<String> {
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
        claims: &[],
        now: SystemTime::now(),
        default_address: None,
        ephemeral_ports: None,
        allocate: true,
    });
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

// ---------------------------------------------------------------------------------------
// The Containerfile

/// `const NAME: &str = "value";` in Rust source.
fn rust_const<'a>(source: &'a str, name: &str) -> Option<&'a str> {
    let line = source.lines().find(|l| {
        l.trim_start()
            .starts_with(&format!("const {name}: &str = "))
    })?;
    line.split('"').nth(1)
}

/// `ARG NAME=value` in a Containerfile.
fn containerfile_arg<'a>(text: &'a str, name: &str) -> Option<&'a str> {
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("ARG {name}=")))
        .map(str::trim)
}

fn containerfile_errors(d: &Deploy) -> Vec<String> {
    let Some(text) = d.files.get("Containerfile") else {
        return vec!["deploy/Containerfile is missing".to_string()];
    };
    let mut e = Vec::new();
    for name in ["BPF_LINKER_VERSION", "LLVM_PREFIX"] {
        let xtask = rust_const(&d.xtask, name);
        let ours = containerfile_arg(text, name);
        if xtask.is_none() || xtask != ours {
            e.push(format!(
                "deploy/Containerfile: ARG {name}={ours:?}, but xtask setup uses {xtask:?}"
            ));
        }
    }
    if !text.contains("--component rust-src") {
        e.push("deploy/Containerfile: the nightly needs rust-src (-Z build-std=core)".into());
    }
    let stages = text.lines().filter(|l| l.starts_with("FROM ")).count();
    if stages < 2 {
        e.push("deploy/Containerfile: a build stage and a runtime stage are expected".into());
    }
    // The runtime stage's last COPY puts the binary where the DaemonSet runs it.
    let installed = text
        .lines()
        .rfind(|l| l.starts_with("COPY --from="))
        .and_then(|l| l.split_whitespace().last());
    if let Some((doc, ds)) = d.daemonset() {
        let commands: Vec<Option<String>> = ds
            .spec
            .template
            .spec
            .map(|p| p.containers)
            .unwrap_or_default()
            .into_iter()
            .map(|c| c.command.and_then(|c| c.into_iter().next()))
            .collect();
        for command in commands {
            if command.as_deref() != installed {
                e.push(format!(
                    "{}: runs {command:?}, but the Containerfile installs {installed:?}",
                    doc.at()
                ));
            }
        }
    }
    e
}

// ---------------------------------------------------------------------------------------
// Tests

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
