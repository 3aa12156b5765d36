//! Schemas and unknown fields: Gateway API kinds against the upstream CRD schemas,
//! our kinds against `deploy/crds.yaml`, core kinds through k8s-openapi, no field unknown.

use super::*;

pub(super) fn schema_errors(d: &Deploy, upstream: &Schemas) -> Vec<String> {
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
pub(super) fn custom_resource_errors(doc: &Doc, schemas: &Schemas, version: &str) -> Vec<String> {
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
pub(super) fn core_errors(doc: &Doc) -> Vec<String> {
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
pub(super) fn round_trip<T: DeserializeOwned + Serialize>(
    value: &Value,
    prefix: &str,
) -> Vec<String> {
    let typed: T = match serde_path_to_error::deserialize(value.clone()) {
        Ok(t) => t,
        Err(e) => return vec![format!("{prefix}.{}: {}", e.path(), e.inner())],
    };
    let back = serde_json::to_value(&typed).expect("serializes");
    let mut out = Vec::new();
    compare(value, &back, prefix, &mut out);
    out
}

pub(super) fn compare(original: &Value, back: &Value, path: &str, out: &mut Vec<String>) {
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
