//! The DaemonSet: host network, capabilities, mounts, endpoints, probes, variables.

use super::*;

/// The capabilities the berth container adds, everything else dropped. Why each is
/// needed and others are not is written at the top of `deploy/daemonset.yaml`.
pub(super) const CAPABILITIES: [&str; 3] = ["BPF", "NET_ADMIN", "PERFMON"];

/// The value after `flag` in `args`.
pub(super) fn flag<'a>(args: &'a [String], flag: &str) -> Option<&'a str> {
    let i = args.iter().position(|a| a == flag)?;
    args.get(i + 1).map(String::as_str)
}

/// The `$(VAR)` references in `arg`.
pub(super) fn var_refs(arg: &str) -> Vec<&str> {
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

pub(super) fn daemonset_errors(d: &Deploy) -> Vec<String> {
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
    // With a read-only root filesystem, the state directory must be a volume; and one
    // of the node's, since it keeps `berth drain` across a new pod (an upgrade).
    let state_dir = flag(&args, "--state-dir").unwrap_or("/var/lib/berth");
    let state_mount = main.volume_mounts.iter().flatten().find(|m| {
        let mount = m.mount_path.trim_end_matches('/');
        state_dir == mount || state_dir.starts_with(&format!("{mount}/"))
    });
    match state_mount {
        None => e.push(format!(
            "the state directory {state_dir} is not a writable volume"
        )),
        Some(m) => {
            let volume = pod.volumes.iter().flatten().find(|v| v.name == m.name);
            if volume.is_none_or(|v| v.host_path.is_none()) {
                e.push(format!(
                    "the state directory {state_dir} is not a hostPath volume: the drain \
                     `berth drain` keeps there would not outlive the pod (drain, upgrade, \
                     undrain)"
                ));
            }
        }
    }
    // SIGTERM withdraws the node's addresses and serves on for the drain timeout; the
    // kubelet must not kill the pod before that is over.
    if !args.iter().any(|a| a == "--drain-on-stop") {
        e.push(
            "berth's args lack --drain-on-stop: a pod that stops would leave its addresses \
             announced"
                .into(),
        );
    }
    let drain_timeout = flag(&args, "--drain-timeout")
        .map(|t| humantime::parse_duration(t).map(|d| d.as_secs()))
        .unwrap_or(Ok(30));
    let grace = pod.termination_grace_period_seconds.unwrap_or(30);
    match drain_timeout {
        Err(err) => e.push(format!("--drain-timeout: {err}")),
        // Some seconds beyond it: the lease is given back after the drain.
        Ok(t) if grace < t as i64 + 10 => e.push(format!(
            "terminationGracePeriodSeconds {grace} is not 10 s above --drain-timeout ({t} s): \
             the kubelet would kill berth before its drain on stop is over"
        )),
        Ok(_) => {}
    }
    e.into_iter()
        .map(|m| format!("{}: {m}", doc.at()))
        .collect()
}

pub(super) fn container_errors(c: &Container, pod_seccomp: Option<&str>) -> Vec<String> {
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

pub(super) fn probe_errors(
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
