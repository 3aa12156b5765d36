//! Reading objects from multi-document YAML: parse, don't validate. Each document
//! becomes a typed object or an error that names the file, the document, the object
//! and the field; kinds Berth does not use are noted and skipped; fields the kind does
//! not define are warned about; an object defined twice is an error naming both places.

use std::{
    fmt,
    path::{Path, PathBuf},
};

use serde::de::DeserializeOwned;

use crate::model::{Object, Route, RouteKind, BERTH_GROUP, GATEWAY_GROUP};

mod definitions;
mod directory;
mod names;
mod snapshot;
mod unknown_fields;

pub use definitions::{object_key, Definitions, ObjectKey};
pub use directory::{list_dir, load_dir};
pub use snapshot::{give_back, snapshot, take_snapshot, Layout};

use names::check_names;
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
