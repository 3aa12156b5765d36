//! Warnings for fields an object's kind does not define, as kubectl's strict field
//! validation reports them.

use serde::de::DeserializeOwned;

use crate::model::BERTH_GROUP;

/// The fields of `value` (paths like `spec.parentRefs[0].sectionname`) that its kind
/// does not define, as kubectl's strict field validation reports them. Fields the kind
/// defines upstream but Berth does not use are not reported: core kinds are checked
/// against k8s-openapi's complete types and GatewayConfig against the type behind our
/// CRD (unknown fields are the ones they ignore, found with `serde_ignored`), Gateway API
/// kinds against the field paths of the upstream CRDs (`upstream-fields.txt`, checked
/// against them by the `upstream_schemas` test) and their metadata against ObjectMeta.
pub(super) fn unknown_fields(group: &str, kind: &str, value: &serde_yaml::Value) -> Vec<String> {
    use k8s_openapi::api::{core::v1 as core, discovery::v1 as discovery};
    match (group, kind) {
        ("", "Service") => ignored_fields::<core::Service>(value, ""),
        ("", "Namespace") => ignored_fields::<core::Namespace>(value, ""),
        ("discovery.k8s.io", _) => ignored_fields::<discovery::EndpointSlice>(value, ""),
        (BERTH_GROUP, _) => {
            // kube's generated type takes its apiVersion and kind as given.
            let mut unknown = ignored_fields::<crate::model::GatewayConfigResource>(value, "");
            unknown.retain(|f| f != "apiVersion" && f != "kind");
            unknown
        }
        _ => {
            let mut unknown = Vec::new();
            undefined_in_crd(kind, value, "", "", &mut unknown);
            unknown
        }
    }
}

/// The paths of the fields a complete type `T` ignores when `value` is read as one,
/// under `prefix`. (A value `T` refuses was reported by the parse already.)
fn ignored_fields<T: DeserializeOwned>(value: &serde_yaml::Value, prefix: &str) -> Vec<String> {
    fn show(path: &serde_ignored::Path, out: &mut String) {
        use serde_ignored::Path as P;
        match path {
            P::Root => {}
            P::Seq { parent, index } => {
                show(parent, out);
                out.push_str(&format!("[{index}]"));
            }
            P::Map { parent, key } => {
                show(parent, out);
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(key);
            }
            P::Some { parent } | P::NewtypeStruct { parent } | P::NewtypeVariant { parent } => {
                show(parent, out)
            }
        }
    }
    let mut unknown = Vec::new();
    let _: Result<T, _> = serde_ignored::deserialize(value.clone(), |path| {
        let mut shown = prefix.to_string();
        show(&path, &mut shown);
        unknown.push(shown);
    });
    unknown
}

/// `Kind path` lines: every field path of the upstream Gateway API CRDs (all
/// versions; `[]` for a list's items, `*` for a map's keys, `**` for anything below).
const UPSTREAM_FIELDS: &str = include_str!("../upstream-fields.txt");

fn upstream_field(kind: &str, path: &str) -> bool {
    static FIELDS: std::sync::LazyLock<std::collections::HashSet<(&str, &str)>> =
        std::sync::LazyLock::new(|| {
            UPSTREAM_FIELDS
                .lines()
                .filter_map(|l| l.split_once(' '))
                .collect()
        });
    FIELDS.contains(&(kind, path))
}

/// Collects the fields under `value` that the upstream CRD of `kind` does not define;
/// `at` is the CRD path of `value` (`spec.parentRefs[]`), `shown` its path in the
/// document (`spec.parentRefs[0]`).
fn undefined_in_crd(
    kind: &str,
    value: &serde_yaml::Value,
    at: &str,
    shown: &str,
    out: &mut Vec<String>,
) {
    use serde_yaml::Value as V;
    let join = |a: &str, b: &str| {
        if a.is_empty() {
            b.to_string()
        } else {
            format!("{a}.{b}")
        }
    };
    match value {
        V::Mapping(fields) => {
            for (key, v) in fields {
                let Some(key) = key.as_str() else { continue };
                let shown = join(shown, key);
                if at.is_empty() && key == "metadata" {
                    out.extend(ignored_fields::<
                        k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
                    >(v, "metadata"));
                    continue;
                }
                let at = [join(at, key), join(at, "*")]
                    .into_iter()
                    .find(|p| upstream_field(kind, p));
                match at {
                    None => out.push(shown),
                    Some(at) if upstream_field(kind, &join(&at, "**")) => {}
                    Some(at) => undefined_in_crd(kind, v, &at, &shown, out),
                }
            }
        }
        V::Sequence(items) => {
            for (i, v) in items.iter().enumerate() {
                undefined_in_crd(kind, v, &format!("{at}[]"), &format!("{shown}[{i}]"), out);
            }
        }
        V::Tagged(t) => undefined_in_crd(kind, &t.value, at, shown, out),
        _ => {}
    }
}
