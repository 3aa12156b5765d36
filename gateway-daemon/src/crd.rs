//! Our CustomResourceDefinitions (`berth.dev/v1alpha1` GatewayConfig, PortClaim,
//! BackendHealthPolicy and RouteTrafficPolicy),
//! generated from the spec types in `model`. `deploy/crds.yaml` is their committed
//! output; a test keeps it current.

use kube::CustomResourceExt;

use crate::model::{
    BackendHealthPolicyResource, GatewayConfigResource, PortClaimResource,
    RouteTrafficPolicyResource,
};

/// The CRDs as one multi-document YAML.
pub fn crds_yaml() -> Result<String, serde_yaml::Error> {
    let a = serde_yaml::to_string(&GatewayConfigResource::crd())?;
    let b = serde_yaml::to_string(&PortClaimResource::crd())?;
    let c = serde_yaml::to_string(&BackendHealthPolicyResource::crd())?;
    let d = serde_yaml::to_string(&RouteTrafficPolicyResource::crd())?;
    Ok(format!(
        "# Generated from gateway-daemon/src/model.rs; do not edit.\n\
         # Regenerate: BLESS=1 cargo test -p gateway-daemon --test crds\n{a}---\n{b}---\n{c}---\n{d}"
    ))
}
