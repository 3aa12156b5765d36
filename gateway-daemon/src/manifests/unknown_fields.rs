//! Warnings for fields an object's kind does not define, as kubectl's strict field
//! validation reports them.

use serde::de::DeserializeOwned;

use crate::model::BERTH_GROUP;

/// The fields of `value` (paths like `spec.parentRefs[0].sectionname`) that its kind
/// does not define, as kubectl's strict field validation reports them. Fields the kind
/// defines upstream but Berth does not use are not reported: core kinds are checked
/// against k8s-openapi's complete types and Berth's kinds against the types behind our
/// CRDs (unknown fields are the ones they ignore, found with `serde_ignored`), Gateway API
/// kinds against the field paths of the upstream CRDs (`upstream-fields.txt`, checked
/// against them by the `upstream_schemas` test) and their metadata against ObjectMeta.
pub(super) fn unknown_fields(group: &str, kind: &str, value: &serde_yaml::Value) -> Vec<String> {
    use k8s_openapi::api::{core::v1 as core, discovery::v1 as discovery};
    match (group, kind) {
        ("", "Service") => ignored_fields::<core::Service>(value, ""),
        ("", "Namespace") => ignored_fields::<core::Namespace>(value, ""),
        ("discovery.k8s.io", _) => ignored_fields::<discovery::EndpointSlice>(value, ""),
        (BERTH_GROUP, _) => {
            // kube's generated types take their apiVersion and kind as given.
            let mut unknown = match kind {
                "BackendHealthPolicy" => {
                    ignored_fields::<crate::model::BackendHealthPolicyResource>(value, "")
                }
                "RouteTrafficPolicy" => {
                    ignored_fields::<crate::model::RouteTrafficPolicyResource>(value, "")
                }
                _ => ignored_fields::<crate::model::GatewayConfigResource>(value, ""),
            };
            unknown.retain(|f| f != "apiVersion" && f != "kind");
            unknown
        }
        _ => {
            let mut unknown = Vec::new();
            let (mut at, mut shown) = (String::new(), String::new());
            undefined_in_crd(kind, value, &mut at, &mut shown, &mut unknown);
            unknown
        }
    }
}

/// The paths of the fields a complete type `T` ignores when `value` is read as one,
/// under `prefix`. (A value `T` refuses was reported by the parse already.)
fn ignored_fields<T: DeserializeOwned>(value: &serde_yaml::Value, prefix: &str) -> Vec<String> {
    let mut unknown = Vec::new();
    let _: Result<T, _> = serde_ignored::deserialize(value, |path| {
        let mut shown = prefix.to_string();
        push_path(&path, Items::Indexed, &mut shown);
        unknown.push(shown);
    });
    unknown
}

/// How a path names a list's items: `[0]` as a document does, `[]` as the CRDs do.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Items {
    Indexed,
    Any,
}

/// Appends `path` (`spec.parentRefs[0].name`, or `spec.parentRefs[].name`) to `out`.
pub(super) fn push_path(path: &serde_ignored::Path, items: Items, out: &mut String) {
    use serde_ignored::Path as P;
    match path {
        P::Root => {}
        P::Seq { parent, index } => {
            push_path(parent, items, out);
            match items {
                Items::Indexed => out.push_str(&format!("[{index}]")),
                Items::Any => out.push_str("[]"),
            }
        }
        P::Map { parent, key } => {
            push_path(parent, items, out);
            if !out.is_empty() {
                out.push('.');
            }
            out.push_str(key);
        }
        P::Some { parent } | P::NewtypeStruct { parent } | P::NewtypeVariant { parent } => {
            push_path(parent, items, out)
        }
    }
}

/// `Kind path` lines: every field path of the upstream Gateway API CRDs (all
/// versions; `[]` for a list's items, `*` for a map's keys, `**` for anything below).
pub(super) const UPSTREAM_FIELDS: &str = include_str!("../upstream-fields.txt");

pub(super) fn upstream_field(kind: &str, path: &str) -> bool {
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
/// document (`spec.parentRefs[0]`). Both are buffers the walk extends and truncates
/// again (at 100,000 routes, a string per field was a tenth of a cold start).
fn undefined_in_crd(
    kind: &str,
    value: &serde_yaml::Value,
    at: &mut String,
    shown: &mut String,
    out: &mut Vec<String>,
) {
    use serde_yaml::Value as V;
    fn push_field(path: &mut String, key: &str) {
        if !path.is_empty() {
            path.push('.');
        }
        path.push_str(key);
    }
    match value {
        V::Mapping(fields) => {
            for (key, v) in fields {
                let Some(key) = key.as_str() else { continue };
                let (at_len, shown_len) = (at.len(), shown.len());
                push_field(shown, key);
                if at_len == 0 && key == "metadata" {
                    out.extend(ignored_fields::<
                        k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
                    >(v, "metadata"));
                } else if defined(kind, at, key) {
                    // `at` is the field's CRD path now; `**` takes anything below it.
                    let below = at.len();
                    at.push_str(".**");
                    let open = upstream_field(kind, at);
                    at.truncate(below);
                    if !open {
                        undefined_in_crd(kind, v, at, shown, out);
                    }
                } else {
                    out.push(shown.clone());
                }
                at.truncate(at_len);
                shown.truncate(shown_len);
            }
        }
        V::Sequence(items) => {
            for (i, v) in items.iter().enumerate() {
                let (at_len, shown_len) = (at.len(), shown.len());
                at.push_str("[]");
                shown.push_str(&format!("[{i}]"));
                undefined_in_crd(kind, v, at, shown, out);
                at.truncate(at_len);
                shown.truncate(shown_len);
            }
        }
        V::Tagged(t) => undefined_in_crd(kind, &t.value, at, shown, out),
        _ => {}
    }
}

/// Extends the CRD path `at` by `key`, or by `*` (a map's keys) when the CRD defines
/// that instead; false (and `at` as it was) when it defines neither.
fn defined(kind: &str, at: &mut String, key: &str) -> bool {
    let len = at.len();
    for step in [key, "*"] {
        if len > 0 {
            at.push('.');
        }
        at.push_str(step);
        if upstream_field(kind, at) {
            return true;
        }
        at.truncate(len);
    }
    false
}
