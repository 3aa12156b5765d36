//! Reading objects from multi-document YAML: parse, don't validate. Each document
//! becomes a typed object or an error that names the file, the document, the object
//! and the field; kinds Berth does not use are noted and skipped; fields the kind does
//! not define are warned about; an object defined twice is an error naming both places.

use std::{
    collections::HashMap,
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
    /// The 0-based document of each object.
    pub documents: Vec<usize>,
    /// Documents that failed.
    pub errors: Vec<ManifestError>,
    /// Documents of kinds Berth does not use.
    pub ignored: Vec<String>,
    /// Fields the object's kind does not define (`file document N: Kind ns/name:
    /// unknown field "spec.parentRef"`), as kubectl's strict field validation warns.
    pub warnings: Vec<String>,
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
            Ok(Parsed::Object(o, warnings)) => {
                out.warnings
                    .extend(warnings.iter().map(|w| format!("{source_doc}: {w}")));
                out.objects.push(*o);
                out.documents.push(document);
            }
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
    /// The object and warnings (`Kind ns/name: unknown field "path"`).
    Object(Box<Object>, Vec<String>),
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
    let fail = |message: String| (object.clone(), message);
    let warnings: Vec<String> = if parsed_kind(group, &kind) {
        check_names(&kind, meta).map_err(fail)?;
        unknown_fields(group, &kind, &value)
            .into_iter()
            .map(|f| format!("{object}unknown field {f:?}"))
            .collect()
    } else {
        Vec::new()
    };
    let typed = |v| -> Result<Parsed, (String, String)> {
        Ok(Parsed::Object(Box::new(v), warnings.clone()))
    };
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

/// Every `*.yaml`/`*.yml` file of a directory, in file-name order, parsed. An object
/// defined again in a later file (or document) is an error of that file, naming both.
pub fn load_dir(dir: &Path) -> std::io::Result<Vec<(PathBuf, FileObjects)>> {
    let mut definitions = Definitions::default();
    Ok(list_dir(dir)?
        .into_iter()
        .map(|f| {
            let mut objects = read_file(&f);
            if let Err(e) = definitions.replace(&f, &FileObjects::default(), &objects) {
                objects.errors.extend(e);
            }
            (f, objects)
        })
        .collect())
}

/// The `*.yaml`/`*.yml` files of a directory, sorted by name.
pub fn list_dir(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(Result::ok)
        .filter(|e| {
            let p = e.path();
            matches!(p.extension().and_then(|e| e.to_str()), Some("yaml" | "yml"))
                // The entry's type comes with the listing: a `stat` only for links.
                && e.file_type().is_ok_and(|t| t.is_file() || (t.is_symlink() && p.is_file()))
        })
        .map(|e| e.path())
        .collect();
    // One directory: the paths' bytes order them as `Path` does, at less cost.
    files.sort_unstable_by(|a, b| a.as_os_str().cmp(b.as_os_str()));
    Ok(files)
}

/// An object's identity: kind, namespace (`default` when unset) and name.
type ObjectKey = (&'static str, String, String);

fn object_key(o: &Object) -> ObjectKey {
    let (kind, meta) = match o {
        Object::GatewayClass(x) => ("GatewayClass", &x.metadata),
        Object::Gateway(x) => ("Gateway", &x.metadata),
        Object::Route(x) => (x.kind.name(), &x.metadata),
        Object::ReferenceGrant(x) => ("ReferenceGrant", &x.metadata),
        Object::Service(x) => ("Service", &x.metadata),
        Object::EndpointSlice(x) => ("EndpointSlice", &x.metadata),
        Object::Namespace(x) => ("Namespace", &x.metadata),
        Object::GatewayConfig(x) => ("GatewayConfig", &x.metadata),
    };
    (kind, meta.ns().to_string(), meta.name.clone())
}

/// Where each object in force is defined. One object has one definition: the same
/// route in two files is an error naming both, not one route with the ports of both.
#[derive(Debug, Default)]
pub struct Definitions(HashMap<ObjectKey, Source>);

impl Definitions {
    /// Makes `new` the definitions of `file` in place of `old` (its objects in force),
    /// unless `new` defines an object that another file (or another document of `new`)
    /// defines: then nothing changes, and the errors name both places.
    pub fn replace(
        &mut self,
        file: &Path,
        old: &FileObjects,
        new: &FileObjects,
    ) -> Result<(), Vec<ManifestError>> {
        let mut errors = Vec::new();
        let mut here: HashMap<ObjectKey, usize> = HashMap::with_capacity(new.objects.len());
        for (o, &document) in new.objects.iter().zip(&new.documents) {
            let key = object_key(o);
            let other = match (here.get(&key), self.0.get(&key)) {
                (Some(&d), _) => Some(Source {
                    file: file.to_path_buf(),
                    document: d,
                }),
                (None, Some(s)) if s.file != file => Some(s.clone()),
                _ => None,
            };
            if let Some(other) = other {
                errors.push(ManifestError {
                    source_doc: Source {
                        file: file.to_path_buf(),
                        document,
                    },
                    object: format!("{} {}/{}: ", key.0, key.1, key.2),
                    message: format!(
                        "also defined in {other}, which stays in force (an object may be \
                         defined once)"
                    ),
                });
            }
            here.entry(key).or_insert(document);
        }
        if !errors.is_empty() {
            return Err(errors);
        }
        for o in &old.objects {
            let key = object_key(o);
            if self.0.get(&key).is_some_and(|s| s.file == file) {
                self.0.remove(&key);
            }
        }
        for (key, document) in here {
            let file = file.to_path_buf();
            self.0.insert(key, Source { file, document });
        }
        Ok(())
    }
}

/// The fields of `value` (paths like `spec.parentRefs[0].sectionname`) that its kind
/// does not define, as kubectl's strict field validation reports them. Fields the kind
/// defines upstream but Berth does not use are not reported: core kinds are checked
/// against k8s-openapi's complete types and GatewayConfig against the type behind our
/// CRD (unknown fields are the ones they ignore, found with `serde_ignored`), Gateway API
/// kinds against the field paths of the upstream CRDs (`upstream-fields.txt`, checked
/// against them by the `upstream_schemas` test) and their metadata against ObjectMeta.
fn unknown_fields(group: &str, kind: &str, value: &serde_yaml::Value) -> Vec<String> {
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
const UPSTREAM_FIELDS: &str = include_str!("upstream-fields.txt");

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

    #[test]
    fn unknown_fields_warn_with_file_object_and_path_and_upstream_fields_do_not() {
        let text = "apiVersion: gateway.networking.k8s.io/v1\nkind: TCPRoute\n\
                    metadata: {name: web, namespace: a, annotations: {x: y}, labelz: {}}\n\
                    spec:\n  parentRef: [{name: gw}]\n  parentRefs:\n  \
                    - {name: gw, sectionname: pool}\n  rules: [{name: r, backendRefs: \
                    [{name: web, port: 80, weight: 1}]}]\n---\n\
                    apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\n\
                    metadata: {name: gw, namespace: a}\nspec:\n  gatewayClassName: berth\n  \
                    infrastructure: {labels: {team: a}}\n  listeners:\n  - name: pool\n    \
                    protocol: TCP\n    port: 30000\n    hostname: x.example\n    \
                    tls: {mode: Passthrough, options: {k: v}}\n    colour: red\n\
                    status: {anything: [1]}\n---\n\
                    apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: a}\n\
                    spec: {type: ClusterIP, selector: {app: web}, portz: [], \
                    ports: [{port: 80, appProtocol: tcp}]}\n---\n\
                    apiVersion: berth.dev/v1alpha1\nkind: GatewayConfig\n\
                    metadata: {name: c, namespace: a}\nspec: {listeners: [{name: pool, \
                    endPort: 30010, maxPorts: 3}]}\n";
        let parsed = parse_file(Path::new("a.yaml"), text);
        assert!(parsed.errors.is_empty(), "{:?}", parsed.errors);
        assert_eq!(parsed.objects.len(), 4);
        assert_eq!(
            parsed.warnings,
            [
                "a.yaml document 1: TCPRoute a/web: unknown field \"metadata.labelz\"",
                "a.yaml document 1: TCPRoute a/web: unknown field \"spec.parentRef\"",
                "a.yaml document 1: TCPRoute a/web: unknown field \"spec.parentRefs[0].sectionname\"",
                "a.yaml document 2: Gateway a/gw: unknown field \"spec.listeners[0].colour\"",
                "a.yaml document 3: Service a/web: unknown field \"spec.portz\"",
                "a.yaml document 4: GatewayConfig a/c: unknown field \"spec.listeners[0].maxPorts\"",
            ]
        );
    }

    #[test]
    fn an_object_defined_twice_is_an_error_of_the_later_definition_naming_both() {
        let route = |port: u16| {
            format!(
                "apiVersion: gateway.networking.k8s.io/v1\nkind: TCPRoute\n\
                 metadata: {{name: web, namespace: a}}\n\
                 spec: {{parentRefs: [{{name: gw, port: {port}}}]}}\n"
            )
        };
        let dir = std::env::temp_dir().join(format!("berth-defs-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("dir");
        std::fs::write(dir.join("a.yaml"), route(1)).expect("write");
        std::fs::write(dir.join("b.yaml"), route(2)).expect("write");
        // The same name as a UDPRoute is another object; twice in one file is not.
        let twice = format!(
            "{}---\n{}",
            route(3).replace("web", "w2"),
            route(4).replace("web", "w2")
        );
        std::fs::write(
            dir.join("c.yaml"),
            twice.clone() + "---\n" + &route(5).replace("TCP", "UDP"),
        )
        .expect("write");
        let files = load_dir(&dir).expect("load");
        let errors: Vec<Vec<String>> = files
            .iter()
            .map(|(_, f)| f.errors.iter().map(ToString::to_string).collect())
            .collect();
        let a = dir.join("a.yaml").display().to_string();
        let (b, c) = (a.replace("a.yaml", "b.yaml"), a.replace("a.yaml", "c.yaml"));
        assert_eq!(
            errors,
            [
                vec![],
                vec![format!(
                    "{b} document 1: TCPRoute a/web: also defined in {a} document 1, which stays \
                     in force (an object may be defined once)"
                )],
                vec![format!(
                    "{c} document 2: TCPRoute a/w2: also defined in {c} document 1, which stays \
                     in force (an object may be defined once)"
                )],
            ]
        );
        // Replacing a file's own definitions is no conflict; once a file lets go of an
        // object, another may define it.
        let mut defs = Definitions::default();
        let (fa, fb) = (&files[0].1, &files[1].1);
        defs.replace(Path::new(&a), &FileObjects::default(), fa)
            .expect("first");
        defs.replace(Path::new(&a), fa, fa)
            .expect("same file again");
        assert!(defs
            .replace(Path::new(&b), &FileObjects::default(), fb)
            .is_err());
        defs.replace(Path::new(&a), fa, &FileObjects::default())
            .expect("let go");
        defs.replace(Path::new(&b), &FileObjects::default(), fb)
            .expect("now b");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
