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
