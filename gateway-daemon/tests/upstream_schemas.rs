//! Every example and test manifest of an upstream Gateway API kind validates against
//! the upstream v1.6.1 CRD OpenAPI schemas in `../shared/gateway-api/v1.6.1/crds`.
//! (CEL rules, `x-kubernetes-validations`, are not evaluated: no API server here.)

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use serde_json::Value;

fn crd_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/gateway-api/v1.6.1/crds")
}

/// (kind, version) → compiled schema.
fn schemas() -> BTreeMap<(String, String), jsonschema::Validator> {
    let mut out = BTreeMap::new();
    let dir = crd_dir();
    let entries = std::fs::read_dir(&dir).unwrap_or_else(|e| {
        panic!(
            "upstream CRDs at {} (shared/ beside the repository): {e}",
            dir.display()
        )
    });
    for entry in entries {
        let path = entry.expect("entry").path();
        if path.extension().is_none_or(|e| e != "yaml") {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("read CRD");
        for de in serde_yaml::Deserializer::from_str(&text) {
            let crd: Value = serde::Deserialize::deserialize(de).expect("CRD YAML");
            let kind = crd["spec"]["names"]["kind"]
                .as_str()
                .expect("kind")
                .to_string();
            for v in crd["spec"]["versions"].as_array().expect("versions") {
                let version = v["name"].as_str().expect("version").to_string();
                let validator = jsonschema::validator_for(&v["schema"]["openAPIV3Schema"])
                    .expect("schema compiles");
                out.insert((kind.clone(), version), validator);
            }
        }
    }
    out
}

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
    let schemas = schemas();
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
            for error in schema.iter_errors(&doc) {
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
