//! RBAC: what the rules grant the DaemonSet's ServiceAccount is exactly [`NEEDED`], and
//! every rule has a comment naming each of its verbs.

use super::*;

pub(super) const GW: &str = "gateway.networking.k8s.io";
pub(super) const READ: &[&str] = &["get", "list", "watch"];

#[derive(Clone, Copy)]
pub(super) enum Scope {
    Cluster,
    /// The DaemonSet's own namespace (`POD_NAMESPACE`).
    PodNamespace,
}

/// What the Kubernetes controller calls: (scope, API group, resource, verbs). RBAC must
/// grant exactly this to the DaemonSet's ServiceAccount.
pub(super) const NEEDED: &[(Scope, &str, &str, &[&str])] = &[
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
    (Scope::Cluster, "berth.dev", "backendhealthpolicies", READ),
    (Scope::Cluster, "berth.dev", "routetrafficpolicies", READ),
    // Server-side apply of the policies' status (conditions per target).
    (
        Scope::Cluster,
        "berth.dev",
        "backendhealthpolicies/status",
        &["patch"],
    ),
    (
        Scope::Cluster,
        "berth.dev",
        "routetrafficpolicies/status",
        &["patch"],
    ),
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

/// (namespace, or none for cluster-wide; API group; resource; verb).
pub(super) type Grant = (Option<String>, String, String, String);

pub(super) fn scope_text(scope: &Option<String>) -> String {
    match scope {
        None => "cluster-wide".to_string(),
        Some(ns) => format!("in namespace {ns}"),
    }
}

pub(super) fn expand(rules: &[PolicyRule], scope: &Option<String>, out: &mut BTreeSet<Grant>) {
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

pub(super) fn rbac_errors(d: &Deploy) -> Vec<String> {
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
pub(super) fn document_texts(text: &str) -> Vec<String> {
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
pub(super) fn rule_comment_errors(d: &Deploy) -> Vec<String> {
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
