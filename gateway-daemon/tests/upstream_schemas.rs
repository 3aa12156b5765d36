//! Every example and test manifest of an upstream Gateway API kind validates against
//! the upstream v1.6.1 CRD OpenAPI schemas in `../shared/gateway-api/v1.6.1/crds`.
//! (CEL rules, `x-kubernetes-validations`, are not evaluated: no API server here.)

mod common;

use std::path::{Path, PathBuf};

use serde_json::Value;

fn manifests() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for dir in [root.join("../examples"), root.join("tests/golden")] {
        for e in std::fs::read_dir(&dir).expect("dir") {
            let p = e.expect("entry").path();
            let name = p.to_string_lossy().to_string();
            if name.ends_with(".yaml") && !name.ends_with(".out.yaml") {
                files.push(p);
            }
        }
    }
    files.sort();
    files
}

#[test]
fn example_and_test_manifests_validate_against_the_upstream_crds() {
    let schemas = common::upstream_schemas();
    assert!(
        schemas.contains_key(&("TCPRoute".to_string(), "v1".to_string())),
        "TCPRoute v1 schema present"
    );
    let mut checked = 0;
    let mut failures = Vec::new();
    for file in manifests() {
        let text = std::fs::read_to_string(&file).expect("read");
        for (i, de) in serde_yaml::Deserializer::from_str(&text).enumerate() {
            let doc: Value = serde::Deserialize::deserialize(de).expect("yaml");
            let Some((group, version)) = doc["apiVersion"].as_str().and_then(|a| a.split_once('/'))
            else {
                continue;
            };
            if group != "gateway.networking.k8s.io" {
                continue;
            }
            let kind = doc["kind"].as_str().unwrap_or_default().to_string();
            let Some(schema) = schemas.get(&(kind.clone(), version.to_string())) else {
                failures.push(format!(
                    "{} document {}: no upstream schema for {kind} {version}",
                    file.display(),
                    i + 1
                ));
                continue;
            };
            checked += 1;
            for error in schema.validator.iter_errors(&doc) {
                failures.push(format!(
                    "{} document {} ({kind}): {} at {}",
                    file.display(),
                    i + 1,
                    error,
                    error.instance_path()
                ));
            }
        }
    }
    assert!(checked > 50, "only {checked} upstream documents checked");
    assert!(
        failures.is_empty(),
        "{} schema violations:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn the_statuses_the_planner_writes_validate_against_the_upstream_crds() {
    // Every Gateway and route status of the golden outputs (conditions of Berth's own,
    // such as a route's Programmed=False DatapathFull, included): what the Kubernetes
    // mode writes to the API server, which validates it against these schemas.
    let schemas = common::upstream_schemas();
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden");
    let mut outputs: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("golden dir")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.to_string_lossy().ends_with(".out.yaml"))
        .collect();
    outputs.sort();
    let status_validator = |kind: &str| {
        let schema = &schemas[&(kind.to_string(), "v1".to_string())];
        jsonschema::validator_for(&schema.raw["properties"]["status"]).expect("status schema")
    };
    let validators: std::collections::BTreeMap<&str, jsonschema::Validator> =
        ["Gateway", "TCPRoute", "UDPRoute"]
            .into_iter()
            .map(|k| (k, status_validator(k)))
            .collect();
    let (mut checked, mut failures) = (0, Vec::new());
    for file in &outputs {
        let text = std::fs::read_to_string(file).expect("read");
        let doc: Value = serde_yaml::from_str(&text).expect("yaml");
        let gateways = doc["gateways"].as_array().into_iter().flatten();
        let routes = doc["routes"].as_array().into_iter().flatten();
        let entries = gateways
            .map(|g| ("Gateway", g))
            .chain(routes.map(|r| (r["kind"].as_str().unwrap_or_default(), r)));
        for (kind, entry) in entries {
            let Some(validator) = validators.get(kind) else {
                failures.push(format!("{}: no status schema for {kind}", file.display()));
                continue;
            };
            checked += 1;
            for error in validator.iter_errors(&entry["status"]) {
                failures.push(format!(
                    "{} {kind} {}/{}: {error} at {}",
                    file.display(),
                    entry["namespace"],
                    entry["name"],
                    error.instance_path()
                ));
            }
        }
    }
    assert!(checked > 100, "only {checked} statuses checked");
    assert!(
        failures.is_empty(),
        "{} status schema violations:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// `src/upstream-fields.txt`, the field paths `berth` checks Gateway API manifests
/// against to warn about unknown fields, is what the upstream CRDs define (`BLESS=1`
/// rewrites it): `[]` for a list's items, `*` for a map's keys, `**` for anything below.
#[test]
fn the_field_list_unknown_fields_are_found_with_is_the_upstream_crds() {
    fn join(a: &str, b: &str) -> String {
        if a.is_empty() {
            b.to_string()
        } else {
            format!("{a}.{b}")
        }
    }
    fn walk(kind: &str, s: &Value, at: &str, out: &mut std::collections::BTreeSet<String>) {
        if s["x-kubernetes-preserve-unknown-fields"] == true {
            out.insert(format!("{kind} {}", join(at, "**")));
        }
        if let Some(fields) = s["properties"].as_object() {
            for (k, sub) in fields {
                let p = join(at, k);
                out.insert(format!("{kind} {p}"));
                match (at, k.as_str()) {
                    // Checked against ObjectMeta; a status is not Berth's to check.
                    ("", "metadata") => {}
                    ("", "status") => {
                        out.insert(format!("{kind} status.**"));
                    }
                    _ => walk(kind, sub, &p, out),
                }
            }
        }
        if s["items"].is_object() {
            walk(kind, &s["items"], &format!("{at}[]"), out);
        }
        if s["additionalProperties"].is_object() {
            out.insert(format!("{kind} {}", join(at, "*")));
            walk(kind, &s["additionalProperties"], &join(at, "*"), out);
        }
    }
    let mut fields = std::collections::BTreeSet::new();
    for ((kind, _), schema) in common::upstream_schemas() {
        walk(&kind, &schema.raw, "", &mut fields);
    }
    let want: String = fields.into_iter().map(|l| l + "\n").collect();
    let path = common::repo_root().join("gateway-daemon/src/upstream-fields.txt");
    if std::env::var_os("BLESS").is_some() {
        std::fs::write(&path, &want).expect("write");
    }
    assert!(
        std::fs::read_to_string(&path).expect("read") == want,
        "{} is stale: run BLESS=1 cargo test -p gateway-daemon --test upstream_schemas",
        path.display()
    );
}
