//! Our CustomResourceDefinitions (`berth.dev/v1alpha1` GatewayConfig and PortClaim),
//! generated from the spec types in `model`. `deploy/crds.yaml` is their committed
//! output; a test keeps it current.

use kube::CustomResourceExt;

use crate::model::{GatewayConfigResource, PortClaimResource};

/// Both CRDs as one multi-document YAML.
pub fn crds_yaml() -> Result<String, serde_yaml::Error> {
    let a = serde_yaml::to_string(&GatewayConfigResource::crd())?;
    let b = serde_yaml::to_string(&PortClaimResource::crd())?;
    Ok(format!(
        "# Generated from gateway-daemon/src/model.rs; do not edit.\n\
         # Regenerate: BLESS=1 cargo test -p gateway-daemon --test crds\n{a}---\n{b}"
    ))
}
