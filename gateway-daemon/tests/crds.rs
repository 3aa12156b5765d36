//! The committed `deploy/crds.yaml` is what the Rust types generate
//! (`BLESS=1 cargo test -p gateway-daemon --test crds` rewrites it), and it accepts the
//! example GatewayConfig.

use std::path::Path;

use serde_json::Value;

#[test]
fn committed_crds_are_current() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/crds.yaml");
    let generated = berth::crd::crds_yaml().expect("generate");
    if std::env::var_os("BLESS").is_some() {
        std::fs::write(&path, &generated).expect("write");
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "deploy/crds.yaml is stale: run BLESS=1 cargo test -p gateway-daemon --test crds"
    );
}

#[test]
fn the_generated_gateway_config_schema_accepts_the_example_and_rejects_a_bad_one() {
    let crds: Vec<Value> =
        serde_yaml::Deserializer::from_str(&berth::crd::crds_yaml().expect("generate"))
            .map(|de| serde::Deserialize::deserialize(de).expect("yaml"))
            .collect();
    let gc = crds
        .iter()
        .find(|c| c["spec"]["names"]["kind"] == "GatewayConfig")
        .expect("GatewayConfig CRD");
    let schema = jsonschema::validator_for(&gc["spec"]["versions"][0]["schema"]["openAPIV3Schema"])
        .expect("schema");
    let example = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/gateway.yaml"),
    )
    .expect("example");
    let doc = serde_yaml::Deserializer::from_str(&example)
        .map(|de| -> Value { serde::Deserialize::deserialize(de).expect("yaml") })
        .find(|d| d["kind"] == "GatewayConfig")
        .expect("example GatewayConfig");
    let errors: Vec<String> = schema.iter_errors(&doc).map(|e| e.to_string()).collect();
    assert!(errors.is_empty(), "{errors:?}");
    let mut bad = doc.clone();
    bad["spec"]["listeners"][0]["endPort"] = Value::from("high");
    assert!(!schema.is_valid(&bad), "endPort must be an integer");
    let mut snat = doc.clone();
    snat["spec"]["sourceNAT"] = Value::from(true);
    assert!(schema.is_valid(&snat), "sourceNAT: true");
    snat["spec"]["sourceNAT"] = Value::from("yes");
    assert!(!schema.is_valid(&snat), "sourceNAT must be a boolean");
}
