//! Shared by the manifest tests (`upstream_schemas`, `deploy`): CRD OpenAPI schemas
//! compiled for validation — the upstream Gateway API v1.6.1 CRDs in
//! `../shared/gateway-api/v1.6.1/crds` and our own in `deploy/crds.yaml` — and YAML
//! documents read as JSON values. (CEL rules, `x-kubernetes-validations`, are not
//! evaluated: no API server here.)

#![allow(
    dead_code,
    reason = "each test crate that includes this module uses a part of it"
)]

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use serde_json::Value;

/// One version of one kind: its OpenAPI v3 schema, raw and compiled.
pub struct Schema {
    /// `spec.versions[].schema.openAPIV3Schema`.
    pub raw: Value,
    /// Compiled.
    pub validator: jsonschema::Validator,
}

/// (kind, version) → schema.
pub type Schemas = BTreeMap<(String, String), Schema>;

/// The repository's root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("gateway-daemon has a parent")
        .to_path_buf()
}

/// Where the upstream Gateway API CRDs are (`shared/` beside the repository).
pub fn upstream_crd_dir() -> PathBuf {
    repo_root().join("../shared/gateway-api/v1.6.1/crds")
}

/// The schemas of every upstream Gateway API CRD.
pub fn upstream_schemas() -> Schemas {
    let dir = upstream_crd_dir();
    let entries = std::fs::read_dir(&dir).unwrap_or_else(|e| {
        panic!(
            "upstream CRDs at {} (shared/ beside the repository): {e}",
            dir.display()
        )
    });
    let mut out = Schemas::new();
    for entry in entries {
        let path = entry.expect("entry").path();
        if path.extension().is_none_or(|e| e != "yaml") {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("read CRD");
        out.extend(crd_schemas(&text));
    }
    out
}

/// The schemas of the CustomResourceDefinitions in a multi-document YAML text (other
/// kinds are skipped).
pub fn crd_schemas(text: &str) -> Schemas {
    let mut out = Schemas::new();
    for crd in yaml_documents(text) {
        if crd["kind"] != "CustomResourceDefinition" {
            continue;
        }
        let kind = crd["spec"]["names"]["kind"]
            .as_str()
            .expect("kind")
            .to_string();
        for v in crd["spec"]["versions"].as_array().expect("versions") {
            let version = v["name"].as_str().expect("version").to_string();
            let raw = v["schema"]["openAPIV3Schema"].clone();
            let validator = jsonschema::validator_for(&raw).expect("schema compiles");
            out.insert((kind.clone(), version), Schema { raw, validator });
        }
    }
    out
}

/// The documents of a multi-document YAML text, as JSON values (empty ones skipped).
pub fn yaml_documents(text: &str) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(text)
        .map(|de| -> Value { serde::Deserialize::deserialize(de).expect("YAML") })
        .filter(|v| !v.is_null())
        .collect()
}

/// Fields of `value` that `schema` does not declare, as `.path.to.field`: what the API
/// server would prune, and what `kubectl apply` (strict field validation) refuses.
/// Objects without declared `properties` (e.g. `metadata`, which the API server checks
/// itself) and `x-kubernetes-preserve-unknown-fields` subtrees are not looked into; at
/// the root, `apiVersion`, `kind` and `metadata` are always known.
pub fn unknown_fields(schema: &Value, value: &Value) -> Vec<String> {
    let mut out = Vec::new();
    walk(schema, value, "", true, &mut out);
    out
}

fn walk(schema: &Value, value: &Value, path: &str, root: bool, out: &mut Vec<String>) {
    if schema["x-kubernetes-preserve-unknown-fields"] == true {
        return;
    }
    match value {
        Value::Object(fields) => {
            let properties = schema["properties"].as_object();
            let additional = &schema["additionalProperties"];
            if properties.is_none() && !additional.is_object() {
                return;
            }
            for (key, v) in fields {
                let here = format!("{path}.{key}");
                if root && matches!(key.as_str(), "apiVersion" | "kind" | "metadata") {
                    continue;
                }
                match properties.and_then(|p| p.get(key)) {
                    Some(s) => walk(s, v, &here, false, out),
                    None if additional.is_object() => walk(additional, v, &here, false, out),
                    None if *additional == true => {}
                    None => out.push(here),
                }
            }
        }
        Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                walk(&schema["items"], v, &format!("{path}[{i}]"), false, out);
            }
        }
        _ => {}
    }
}
