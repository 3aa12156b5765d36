//! Reading objects from multi-document YAML: parse, don't validate. Each document
//! becomes a typed object or an error that names the file, the document, the object
//! and the field; kinds Berth does not use are noted and skipped.

use std::{
    fmt,
    path::{Path, PathBuf},
};

use serde::de::DeserializeOwned;

use crate::model::{Object, Route, RouteKind, Snapshot, BERTH_GROUP, GATEWAY_GROUP};

/// Where a document came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Source {
    /// File.
    pub file: PathBuf,
    /// 0-based index of the document in the file.
    pub document: usize,
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} document {}", self.file.display(), self.document + 1)
    }
}

/// A document that could not be turned into an object.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{source_doc}: {object}{message}")]
pub struct ManifestError {
    /// Where.
    pub source_doc: Source,
    /// `Kind namespace/name: ` when known, else empty.
    pub object: String,
    /// What is wrong, naming the field.
    pub message: String,
}

/// The objects of one file, and what was wrong or skipped in it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FileObjects {
    /// Parsed objects, in document order.
    pub objects: Vec<Object>,
    /// Documents that failed.
    pub errors: Vec<ManifestError>,
    /// Documents of kinds Berth does not use.
    pub ignored: Vec<String>,
}

/// Parses the documents of one file.
pub fn parse_file(file: &Path, text: &str) -> FileObjects {
    let mut out = FileObjects::default();
    for (document, de) in serde_yaml::Deserializer::from_str(text).enumerate() {
        let source_doc = Source {
            file: file.to_path_buf(),
            document,
        };
        let value: Result<serde_yaml::Value, _> = serde::Deserialize::deserialize(de);
        let value = match value {
            Ok(serde_yaml::Value::Null) => continue,
            Ok(v) => v,
            Err(e) => {
                out.errors.push(ManifestError {
                    source_doc,
                    object: String::new(),
                    message: format!("not YAML: {e}"),
                });
                // The stream cannot be resumed after a syntax error (the iterator
                // would repeat it forever): the rest of the file is unread.
                break;
            }
        };
        match parse_object(value) {
            Ok(Parsed::Object(o)) => out.objects.push(*o),
            Ok(Parsed::Ignored(what)) => out.ignored.push(format!("{source_doc}: {what} ignored")),
            Err((object, message)) => out.errors.push(ManifestError {
                source_doc,
                object,
                message,
            }),
        }
    }
    out
}

enum Parsed {
    Object(Box<Object>),
    Ignored(String),
}

/// Turns one YAML document into an object. Errors carry (`Kind ns/name: `, message).
fn parse_object(value: serde_yaml::Value) -> Result<Parsed, (String, String)> {
    let text = |key: &str| value.get(key).and_then(|v| v.as_str()).map(str::to_string);
    let api_version =
        text("apiVersion").ok_or((String::new(), "field apiVersion is missing".to_string()))?;
    let kind = text("kind").ok_or((String::new(), "field kind is missing".to_string()))?;
    let meta = value.get("metadata");
    let name = meta
        .and_then(|m| m.get("name"))
        .and_then(|v| v.as_str())
        .unwrap_or("?");
    let object = match meta
        .and_then(|m| m.get("namespace"))
        .and_then(|v| v.as_str())
    {
        Some(ns) => format!("{kind} {ns}/{name}: "),
        None => format!("{kind} {name}: "),
    };
    let (group, version) = api_version
        .split_once('/')
        .unwrap_or(("", api_version.as_str()));
    let typed = |v| -> Result<Parsed, (String, String)> { Ok(Parsed::Object(Box::new(v))) };
    let fail = |message: String| (object.clone(), message);
    if parsed_kind(group, &kind) {
        check_names(&kind, meta).map_err(fail)?;
    }
    match (group, version, kind.as_str()) {
        (GATEWAY_GROUP, "v1" | "v1beta1", "GatewayClass") => {
            typed(Object::GatewayClass(de(value).map_err(fail)?))
        }
        (GATEWAY_GROUP, "v1" | "v1beta1", "Gateway") => {
            typed(Object::Gateway(de(value).map_err(fail)?))
        }
        (GATEWAY_GROUP, "v1" | "v1alpha2", "TCPRoute" | "UDPRoute") => {
            let mut route: Route = de(value).map_err(fail)?;
            route.kind = if kind == "TCPRoute" {
                RouteKind::Tcp
            } else {
                RouteKind::Udp
            };
            typed(Object::Route(std::sync::Arc::new(route)))
        }
        (GATEWAY_GROUP, "v1" | "v1beta1", "ReferenceGrant") => {
            typed(Object::ReferenceGrant(de(value).map_err(fail)?))
        }
        ("", "v1", "Service") => typed(Object::Service(de(value).map_err(fail)?)),
        ("", "v1", "Namespace") => typed(Object::Namespace(de(value).map_err(fail)?)),
        ("discovery.k8s.io", "v1", "EndpointSlice") => {
            typed(Object::EndpointSlice(de(value).map_err(fail)?))
        }
        (BERTH_GROUP, "v1alpha1", "GatewayConfig") => {
            typed(Object::GatewayConfig(de(value).map_err(fail)?))
        }
        (GATEWAY_GROUP | BERTH_GROUP, _, _) => Err(fail(format!(
            "apiVersion {api_version} kind {kind} is not supported"
        ))),
        _ => Ok(Parsed::Ignored(format!("{kind} ({api_version})"))),
    }
}

/// Whether objects of this group and kind are read (not skipped as unknown).
fn parsed_kind(group: &str, kind: &str) -> bool {
    matches!(
        (group, kind),
        (
            GATEWAY_GROUP,
            "GatewayClass" | "Gateway" | "TCPRoute" | "UDPRoute" | "ReferenceGrant"
        ) | ("", "Service" | "Namespace")
            | ("discovery.k8s.io", "EndpointSlice")
            | (BERTH_GROUP, "GatewayConfig")
    )
}

/// Checks `metadata.name` and `metadata.namespace` as the API server does: names are
/// DNS-1123 subdomains (labels for Namespaces and Services), namespaces labels. (A
/// route named with a newline in it once split its claim's journal record, and the
/// daemon never planned again after a restart.)
fn check_names(kind: &str, meta: Option<&serde_yaml::Value>) -> Result<(), String> {
    let field = |key: &str| meta.and_then(|m| m.get(key));
    let name = match field("name") {
        None => return Err("field metadata.name is missing".to_string()),
        Some(v) => v
            .as_str()
            .ok_or_else(|| "field metadata.name: not a string".to_string())?,
    };
    let label_only = matches!(kind, "Namespace" | "Service");
    let problem = if label_only {
        dns_label_problem(name)
    } else {
        dns_subdomain_problem(name)
    };
    if let Some(p) = problem {
        return Err(format!("field metadata.name: {name:?} {p}"));
    }
    if let Some(ns) = field("namespace") {
        let ns = ns
            .as_str()
            .ok_or_else(|| "field metadata.namespace: not a string".to_string())?;
        if let Some(p) = dns_label_problem(ns) {
            return Err(format!("field metadata.namespace: {ns:?} {p}"));
        }
    }
    Ok(())
}

/// Why `s` is not a DNS-1123 label (at most 63 lowercase letters, digits and '-',
/// starting and ending with a letter or digit), if it is not.
fn dns_label_problem(s: &str) -> Option<&'static str> {
    let alnum = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    if s.is_empty() {
        return Some("is empty");
    }
    if s.len() > 63 {
        return Some("is longer than 63 characters (a DNS-1123 label)");
    }
    let b = s.as_bytes();
    if !b.iter().all(|&c| alnum(c) || c == b'-') || !alnum(b[0]) || !alnum(b[b.len() - 1]) {
        return Some(
            "is not a DNS-1123 label (lowercase letters, digits and '-', \
             starting and ending with a letter or digit)",
        );
    }
    None
}

/// Why `s` is not a DNS-1123 subdomain (at most 253 characters, dot-separated labels),
/// if it is not.
fn dns_subdomain_problem(s: &str) -> Option<&'static str> {
    if s.len() > 253 {
        return Some("is longer than 253 characters (a DNS-1123 subdomain)");
    }
    if s.split('.').any(|l| dns_label_problem(l).is_some()) {
        return Some(
            "is not a DNS-1123 subdomain (lowercase letters, digits, '-' and '.', \
             starting and ending with a letter or digit)",
        );
    }
    None
}

/// Deserialises with the failing field's path in the message.
fn de<T: DeserializeOwned>(value: serde_yaml::Value) -> Result<T, String> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if path == "." {
            inner.to_string()
        } else {
            format!("field {path}: {inner}")
        }
    })
}

/// Every `*.yaml`/`*.yml` file of a directory, in file-name order, parsed.
pub fn load_dir(dir: &Path) -> std::io::Result<Vec<(PathBuf, FileObjects)>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.is_file() && matches!(p.extension().and_then(|e| e.to_str()), Some("yaml" | "yml"))
        })
        .collect();
    files.sort();
    Ok(files
        .into_iter()
        .map(|f| {
            let objects = read_file(&f);
            (f, objects)
        })
        .collect())
}

/// Reads and parses one manifest file. A file that cannot be read (permission denied,
/// not UTF-8 text) is an error naming it, never skipped in silence.
pub fn read_file(path: &Path) -> FileObjects {
    match std::fs::read_to_string(path) {
        Ok(text) => parse_file(path, &text),
        Err(e) => FileObjects {
            errors: vec![ManifestError {
                source_doc: Source {
                    file: path.to_path_buf(),
                    document: 0,
                },
                object: String::new(),
                message: if e.kind() == std::io::ErrorKind::InvalidData {
                    "cannot be read: not UTF-8 text".to_string()
                } else {
                    format!("cannot be read: {e}")
                },
            }],
            ..FileObjects::default()
        },
    }
}

/// The snapshot of parsed files, in order.
pub fn snapshot<'a>(files: impl IntoIterator<Item = &'a FileObjects>) -> Snapshot {
    let mut s = Snapshot::default();
    for f in files {
        for o in &f.objects {
            s.push(o.clone());
        }
    }
    s
}

/// Where each object of a taken snapshot came from: per file, the kinds in order.
#[derive(Debug, Default)]
pub struct Layout(Vec<Vec<u8>>);

fn kind_of(o: &Object) -> u8 {
    match o {
        Object::GatewayClass(_) => 0,
        Object::Gateway(_) => 1,
        Object::Route(_) => 2,
        Object::ReferenceGrant(_) => 3,
        Object::Service(_) => 4,
        Object::EndpointSlice(_) => 5,
        Object::Namespace(_) => 6,
        Object::GatewayConfig(_) => 7,
    }
}

/// Moves the objects of `files` into one snapshot, copying none of them; `give_back`
/// returns them to the same files (in the same order), changed or not.
pub fn take_snapshot<'a>(
    files: impl IntoIterator<Item = &'a mut FileObjects>,
) -> (Snapshot, Layout) {
    let mut s = Snapshot::default();
    let mut layout = Layout::default();
    for f in files {
        layout.0.push(f.objects.iter().map(kind_of).collect());
        for o in f.objects.drain(..) {
            s.push(o);
        }
    }
    (s, layout)
}

/// Gives the objects of a snapshot made by `take_snapshot` back to their files.
pub fn give_back<'a>(
    files: impl IntoIterator<Item = &'a mut FileObjects>,
    snapshot: Snapshot,
    layout: Layout,
) {
    let Snapshot {
        gateway_classes,
        gateways,
        routes,
        reference_grants,
        services,
        endpoint_slices,
        namespaces,
        gateway_configs,
    } = snapshot;
    let mut gateway_classes = gateway_classes.into_iter();
    let mut gateways = gateways.into_iter();
    let mut routes = routes.into_iter();
    let mut reference_grants = reference_grants.into_iter();
    let mut services = services.into_iter();
    let mut endpoint_slices = endpoint_slices.into_iter();
    let mut namespaces = namespaces.into_iter();
    let mut gateway_configs = gateway_configs.into_iter();
    for (f, kinds) in files.into_iter().zip(layout.0) {
        f.objects = kinds
            .into_iter()
            .filter_map(|k| match k {
                0 => gateway_classes.next().map(Object::GatewayClass),
                1 => gateways.next().map(Object::Gateway),
                2 => routes.next().map(Object::Route),
                3 => reference_grants.next().map(Object::ReferenceGrant),
                4 => services.next().map(Object::Service),
                5 => endpoint_slices.next().map(Object::EndpointSlice),
                6 => namespaces.next().map(Object::Namespace),
                _ => gateway_configs.next().map(Object::GatewayConfig),
            })
            .collect();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_taken_snapshot_equals_a_copied_one_and_goes_back_where_it_came_from() {
        let a = parse_file(
            Path::new("a.yaml"),
            "apiVersion: v1\nkind: Namespace\nmetadata: {name: a}\n---\n\
             apiVersion: gateway.networking.k8s.io/v1\nkind: TCPRoute\n\
             metadata: {name: web, namespace: a}\nspec: {parentRefs: [{name: gw}]}\n---\n\
             apiVersion: v1\nkind: Namespace\nmetadata: {name: b}\n",
        );
        let b = parse_file(
            Path::new("b.yaml"),
            "apiVersion: gateway.networking.k8s.io/v1\nkind: UDPRoute\n\
             metadata: {name: dns, namespace: b}\nspec: {parentRefs: [{name: gw}]}\n",
        );
        let (before_a, before_b) = (a.objects.clone(), b.objects.clone());
        let copied = snapshot([&a, &b]);
        let mut files = [a, b];
        let (taken, layout) = take_snapshot(files.iter_mut());
        assert_eq!(taken, copied);
        assert!(files.iter().all(|f| f.objects.is_empty()));
        give_back(files.iter_mut(), taken, layout);
        assert_eq!(
            (&files[0].objects, &files[1].objects),
            (&before_a, &before_b)
        );
    }

    #[test]
    fn a_bad_field_is_reported_with_file_document_object_and_path() {
        let text = "apiVersion: v1\nkind: Namespace\nmetadata: {name: a}\n---\n\
                    apiVersion: gateway.networking.k8s.io/v1\nkind: TCPRoute\n\
                    metadata: {name: web, namespace: team-a}\n\
                    spec:\n  parentRefs:\n  - name: gw\n    port: seventy\n";
        let parsed = parse_file(Path::new("routes.yaml"), text);
        assert_eq!(parsed.objects.len(), 1);
        let err = parsed.errors[0].to_string();
        assert!(
            err.starts_with(
                "routes.yaml document 2: TCPRoute team-a/web: field spec.parentRefs[0].port"
            ),
            "{err}"
        );
    }

    #[test]
    fn names_that_kubernetes_would_refuse_are_errors_naming_the_object_and_field() {
        let route = |name: &str, ns: &str| {
            format!(
                "apiVersion: gateway.networking.k8s.io/v1\nkind: TCPRoute\nmetadata:\n  \
                 name: {name}\n  namespace: {ns}\nspec: {{}}\n"
            )
        };
        for (name, ns, field) in [
            ("\"web\\nx\"", "team-a", "metadata.name"),
            ("Web", "team-a", "metadata.name"),
            ("web-", "team-a", "metadata.name"),
            ("web", "Team_A", "metadata.namespace"),
        ] {
            let parsed = parse_file(Path::new("r.yaml"), &route(name, ns));
            assert!(parsed.objects.is_empty(), "{name} in {ns} accepted");
            let message = parsed.errors[0].to_string();
            assert!(
                message.contains("TCPRoute") && message.contains(field),
                "{message}"
            );
        }
        let ok = parse_file(Path::new("r.yaml"), &route("web.v2", "team-a"));
        assert!(ok.errors.is_empty(), "{:?}", ok.errors);
        let long = "a".repeat(64);
        let svc =
            format!("apiVersion: v1\nkind: Service\nmetadata:\n  name: {long}\n  namespace: a\n");
        assert!(!parse_file(Path::new("s.yaml"), &svc).errors.is_empty());
    }

    #[test]
    fn a_yaml_syntax_error_is_reported_once() {
        let text = "apiVersion: v1\nkind: Namespace\nmetadata: {name: a}\ngarbage: [\n";
        let parsed = parse_file(Path::new("x.yaml"), text);
        assert_eq!(parsed.errors.len(), 1, "{:?}", parsed.errors);
        assert!(
            parsed.errors[0]
                .to_string()
                .starts_with("x.yaml document 1: not YAML"),
            "{}",
            parsed.errors[0]
        );
    }

    #[test]
    fn unknown_kinds_are_noted_and_v1alpha2_routes_accepted() {
        let text = "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d}\n---\n\
                    apiVersion: gateway.networking.k8s.io/v1alpha2\nkind: UDPRoute\n\
                    metadata: {name: dns}\nspec: {}\n";
        let parsed = parse_file(Path::new("x.yaml"), text);
        assert_eq!(parsed.ignored.len(), 1, "{:?}", parsed.ignored);
        assert!(matches!(&parsed.objects[0], Object::Route(r) if r.kind == RouteKind::Udp));
    }
}
