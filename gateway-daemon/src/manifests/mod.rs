//! Reading objects from multi-document YAML, or JSON (`*.json`: one or more JSON
//! values): parse, don't validate. Each document becomes a typed object or an error
//! that names the file, the document, the object and the field; a `kind: List`
//! document becomes its items; kinds Berth does not use (Deployments, and the Gateway
//! API kinds it does not serve, such as HTTPRoute) are noted per object and skipped, so
//! that the file's other objects are served; fields the kind does not define are
//! warned about; an object defined twice is an error naming both places.

use std::{
    fmt,
    path::{Path, PathBuf},
};

use serde::de::DeserializeOwned;

use crate::model::{Object, Route, RouteKind, BERTH_GROUP, GATEWAY_GROUP};

mod definitions;
mod direct;
mod directory;
mod names;
mod snapshot;
mod strict;
mod unknown_fields;

pub use definitions::{object_key, Definitions, ObjectKey};
pub use directory::{is_manifest_name, list_dir, load_dir, read_files};
pub use snapshot::{snapshot, splice, Counts};

use names::{check_listener_names, check_names};
use unknown_fields::unknown_fields;

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
    /// Objects of kinds Berth does not use (`file document N: Kind ns/name (apiVersion)
    /// ignored`).
    pub ignored: Vec<String>,
    /// Fields the object's kind does not define (`file document N: Kind ns/name:
    /// unknown field "spec.parentRef"`), as kubectl's strict field validation warns.
    pub warnings: Vec<String>,
}

/// Whether `file` is read as JSON (`*.json`) rather than YAML.
pub fn is_json(file: &Path) -> bool {
    file.extension().is_some_and(|e| e == "json")
}

/// Parses the documents of one file: YAML documents, or for `*.json` JSON values.
pub fn parse_file(file: &Path, text: &str) -> FileObjects {
    if !is_json(file) {
        if let Some(out) = direct::parse_clean(file, text) {
            return out;
        }
    }
    parse_through_values(file, text)
}

/// [`parse_file`] with every document read as a value first: what it reports is the
/// reference the direct reading keeps to.
fn parse_through_values(file: &Path, text: &str) -> FileObjects {
    let mut out = FileObjects::default();
    // Each document as a YAML value (JSON is YAML), or why it is not one.
    let documents: Box<dyn Iterator<Item = Result<serde_yaml::Value, String>> + '_> =
        if is_json(file) {
            let values = serde_json::Deserializer::from_str(text).into_iter::<serde_json::Value>();
            Box::new(values.map(|v| {
                v.map_err(|e| e.to_string())
                    .and_then(|v| serde_yaml::to_value(v).map_err(|e| e.to_string()))
                    .map_err(|e| format!("not JSON: {e}"))
            }))
        } else {
            let values = serde_yaml::Deserializer::from_str(text);
            Box::new(values.map(|de| {
                serde::Deserialize::deserialize(de).map_err(|e| format!("not YAML: {e}"))
            }))
        };
    for (document, value) in documents.enumerate() {
        let source_doc = Source {
            file: file.to_path_buf(),
            document,
        };
        match value {
            Ok(v) => add_document(&mut out, source_doc, v),
            Err(message) => {
                out.errors.push(ManifestError {
                    source_doc,
                    object: String::new(),
                    message,
                });
                // The stream cannot be resumed after a syntax error (the YAML iterator
                // would repeat it forever): the rest of the file is unread.
                break;
            }
        }
    }
    out
}

/// Adds the object of one document, or the items of a `kind: List` document (as
/// `kubectl get -o yaml` writes several objects), to `out`.
fn add_document(out: &mut FileObjects, source_doc: Source, value: serde_yaml::Value) {
    let is_list = value.get("kind").and_then(|k| k.as_str()) == Some("List")
        && value.get("apiVersion").and_then(|k| k.as_str()) == Some("v1");
    match value {
        serde_yaml::Value::Null => {}
        serde_yaml::Value::Mapping(mut m) if is_list => match m.remove("items") {
            Some(serde_yaml::Value::Sequence(items)) => {
                for (i, item) in items.into_iter().enumerate() {
                    add_object(out, &source_doc, item, Some(i));
                }
            }
            None | Some(serde_yaml::Value::Null) => {}
            Some(_) => out.errors.push(ManifestError {
                source_doc,
                object: "List: ".to_string(),
                message: "field items: not a list".to_string(),
            }),
        },
        value => add_object(out, &source_doc, value, None),
    }
}

/// Adds one object (item `item` of a List, if given) to `out`: parsed, ignored, or an
/// error.
fn add_object(
    out: &mut FileObjects,
    source_doc: &Source,
    value: serde_yaml::Value,
    item: Option<usize>,
) {
    if value.is_null() {
        return;
    }
    let at = item
        .map(|i| format!("List item {}: ", i + 1))
        .unwrap_or_default();
    match parse_object(value) {
        Ok(Parsed::Object(o, warnings)) => {
            out.warnings
                .extend(warnings.iter().map(|w| format!("{source_doc}: {at}{w}")));
            out.objects.push(*o);
            out.documents.push(source_doc.document);
        }
        Ok(Parsed::Ignored(what)) => out.ignored.push(format!("{source_doc}: {at}{what}")),
        Err((object, message)) => out.errors.push(ManifestError {
            source_doc: source_doc.clone(),
            object: format!("{at}{object}"),
            message,
        }),
    }
}

enum Parsed {
    /// The object and warnings (`Kind ns/name: unknown field "path"`).
    Object(Box<Object>, Vec<String>),
    /// A note: `Kind ns/name (apiVersion) ignored[: why]`.
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
        check_listener_names(&v).map_err(fail)?;
        Ok(Parsed::Object(Box::new(v), warnings.clone()))
    };
    let route = |kind, value| {
        let mut route: Route = de(value).map_err(fail)?;
        route.kind = kind;
        typed(Object::Route(std::sync::Arc::new(route)))
    };
    match (group, version, kind.as_str()) {
        (GATEWAY_GROUP, "v1" | "v1beta1", "GatewayClass") => {
            typed(Object::GatewayClass(de(value).map_err(fail)?))
        }
        (GATEWAY_GROUP, "v1" | "v1beta1", "Gateway") => {
            typed(Object::Gateway(de(value).map_err(fail)?))
        }
        (GATEWAY_GROUP, "v1" | "v1alpha2", "TCPRoute") => route(RouteKind::Tcp, value),
        (GATEWAY_GROUP, "v1" | "v1alpha2", "UDPRoute") => route(RouteKind::Udp, value),
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
        (BERTH_GROUP, "v1alpha1", "BackendHealthPolicy") => {
            typed(Object::BackendHealthPolicy(de(value).map_err(fail)?))
        }
        (BERTH_GROUP, "v1alpha1", "RouteTrafficPolicy") => {
            typed(Object::RouteTrafficPolicy(de(value).map_err(fail)?))
        }
        // A Gateway API kind Berth does not serve (HTTPRoute, GRPCRoute, TLSRoute...): the
        // file's other objects are served. (A file with an HTTPRoute beside a TCPRoute
        // once failed as a whole, and the TCPRoute was never applied.)
        (GATEWAY_GROUP, _, _) if !parsed_kind(group, &kind) => Ok(Parsed::Ignored(format!(
            "{} ({api_version}) ignored: Berth serves TCPRoute and UDPRoute, not this kind",
            object.trim_end_matches(": ")
        ))),
        // A kind Berth serves in a version it does not read, or a kind of Berth's own
        // group it does not have: a mistake, not another controller's object.
        (GATEWAY_GROUP | BERTH_GROUP, _, _) => Err(fail(format!(
            "apiVersion {api_version} kind {kind} is not supported"
        ))),
        _ => Ok(Parsed::Ignored(format!(
            "{} ({api_version}) ignored",
            object.trim_end_matches(": ")
        ))),
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
            | (
                BERTH_GROUP,
                "GatewayConfig" | "BackendHealthPolicy" | "RouteTrafficPolicy"
            )
    )
}

/// Deserialises with the failing field's path in the message. (Read plainly first:
/// following the path of every field cost a tenth of the parse, and only an error
/// needs it.)
fn de<T: DeserializeOwned>(value: serde_yaml::Value) -> Result<T, String> {
    if let Ok(t) = T::deserialize(&value) {
        return Ok(t);
    }
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

/// The largest manifest file read, in bytes (16 MiB): a larger one is an error naming
/// it, and is not read. (A 100 MB manifest once took the daemon to 1.1 GB: parsing
/// holds the text, the YAML values and the typed objects at once.)
pub const MAX_FILE_BYTES: u64 = 16 * 1024 * 1024;

/// Reads and parses one manifest file. A file that cannot be read (permission denied,
/// not UTF-8 text, larger than [`MAX_FILE_BYTES`]) is an error naming it, never
/// skipped in silence.
pub fn read_file(path: &Path) -> FileObjects {
    match read_text(path) {
        Ok(text) => parse_file(path, &text),
        Err(message) => FileObjects {
            errors: vec![ManifestError {
                source_doc: Source {
                    file: path.to_path_buf(),
                    document: 0,
                },
                object: String::new(),
                message,
            }],
            ..FileObjects::default()
        },
    }
}

/// The text of `path`, at most [`MAX_FILE_BYTES`] of it (also if it grows while read).
fn read_text(path: &Path) -> Result<String, String> {
    use std::io::Read;
    let too_large = |size: u64| {
        format!(
            "cannot be read: {size} bytes or more, larger than the {} MiB a manifest file \
             may have (split it into several files)",
            MAX_FILE_BYTES / (1024 * 1024)
        )
    };
    let unreadable = |e: std::io::Error| {
        if e.kind() == std::io::ErrorKind::InvalidData {
            "cannot be read: not UTF-8 text".to_string()
        } else {
            format!("cannot be read: {e}")
        }
    };
    let file = std::fs::File::open(path).map_err(unreadable)?;
    let size = file.metadata().map_err(unreadable)?.len();
    if size > MAX_FILE_BYTES {
        return Err(too_large(size));
    }
    let mut text = String::new();
    file.take(MAX_FILE_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(unreadable)?;
    if text.len() as u64 > MAX_FILE_BYTES {
        return Err(too_large(text.len() as u64));
    }
    Ok(text)
}

#[cfg(test)]
mod tests;
