//! Reading a YAML file's documents straight from the parser's events into their types,
//! where reading them as values first and then into types cost about as much again as
//! the parsing itself (100,000 routes in 1,000 files, one core: the YAML events alone
//! 4.1 s, values 5.3 s, values into types with the checks 7.3 s).
//!
//! Only what the values would give the same way is read so: routes, Services and
//! EndpointSlices whose `apiVersion` and `kind` come first (as every generator and
//! `kubectl` write them), that have no field the reading through a value would warn
//! about or check further, and that are read without an error. Any other document of
//! the file is read through a value as before ([`super::add_document`]); any error, any
//! field to warn about or check, makes the whole file be read through values
//! ([`parse_clean`] returns `None`), so that what is reported stays exactly what it was.

use std::{path::Path, sync::Arc};

use serde::de::{self, DeserializeOwned, DeserializeSeed, Deserializer, MapAccess, Visitor};

use super::{
    add_document, names,
    strict::Strict,
    unknown_fields::{push_path, upstream_field, Items},
    FileObjects, Source,
};
use crate::model::{EndpointSlice, Meta, Object, Route, RouteKind, Service, GATEWAY_GROUP};

/// The objects of a YAML file read straight into their types, or `None` when the file
/// must be read through values (see the module's documentation).
pub(super) fn parse_clean(file: &Path, text: &str) -> Option<FileObjects> {
    let mut out = FileObjects::default();
    for (document, de) in serde_yaml::Deserializer::from_str(text).enumerate() {
        match DocumentSeed.deserialize(de).ok()? {
            Document::Empty => {}
            Document::Object(o) => {
                out.objects.push(o);
                out.documents.push(document);
            }
            Document::Value(value) => add_document(
                &mut out,
                Source {
                    file: file.to_path_buf(),
                    document,
                },
                value,
            ),
        }
    }
    Some(out)
}

/// One document: nothing, an object read straight into its type, or a value to read
/// as before.
enum Document {
    Empty,
    Object(Object),
    Value(serde_yaml::Value),
}

/// The kinds read straight into their types.
#[derive(Clone, Copy)]
enum Direct {
    Route(RouteKind),
    Service,
    EndpointSlice,
}

impl Direct {
    fn of(api_version: &str, kind: &str) -> Option<Self> {
        let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
        match (group, version, kind) {
            (GATEWAY_GROUP, "v1" | "v1alpha2", _) => RouteKind::of_name(kind).map(Self::Route),
            ("", "v1", "Service") => Some(Self::Service),
            ("discovery.k8s.io", "v1", "EndpointSlice") => Some(Self::EndpointSlice),
            _ => None,
        }
    }

    fn kind(self) -> &'static str {
        match self {
            Self::Route(k) => k.name(),
            Self::Service => "Service",
            Self::EndpointSlice => "EndpointSlice",
        }
    }

    /// Whether a field the type does not read, at `path` (as `spec.ports[].appProtocol`),
    /// is one the reading through a value passes without a word and without looking
    /// inside: a field the kind defines upstream that holds no fields of its own to check.
    fn passes(self, path: &str) -> bool {
        if let Some(field) = path.strip_prefix("metadata.") {
            return OBJECT_META_PLAIN.contains(&field);
        }
        match self {
            Self::Route(k) => {
                let kind = k.name();
                upstream_field(kind, path)
                    && (upstream_field(kind, &format!("{path}.**")) || !upstream_parent(kind, path))
            }
            Self::Service => SERVICE_PLAIN.contains(&path),
            Self::EndpointSlice => ENDPOINT_SLICE_PLAIN.contains(&path),
        }
    }
}

/// ObjectMeta's fields that hold plain values, strings, lists or maps of strings.
/// (`managedFields` and `ownerReferences` hold objects whose fields are checked.)
const OBJECT_META_PLAIN: &[&str] = &[
    "annotations",
    "creationTimestamp",
    "deletionGracePeriodSeconds",
    "deletionTimestamp",
    "finalizers",
    "generateName",
    "generation",
    "labels",
    "name",
    "namespace",
    "resourceVersion",
    "selfLink",
    "uid",
];

/// Service fields (of `core/v1`) that hold plain values, lists or maps of them.
const SERVICE_PLAIN: &[&str] = &[
    "spec.allocateLoadBalancerNodePorts",
    "spec.clusterIP",
    "spec.clusterIPs",
    "spec.externalIPs",
    "spec.externalName",
    "spec.externalTrafficPolicy",
    "spec.healthCheckNodePort",
    "spec.internalTrafficPolicy",
    "spec.ipFamilies",
    "spec.ipFamilyPolicy",
    "spec.loadBalancerClass",
    "spec.loadBalancerIP",
    "spec.loadBalancerSourceRanges",
    "spec.ports[].appProtocol",
    "spec.ports[].nodePort",
    "spec.publishNotReadyAddresses",
    "spec.selector",
    "spec.sessionAffinity",
    "spec.trafficDistribution",
    "spec.type",
];

/// EndpointSlice fields (of `discovery.k8s.io/v1`) that hold plain values.
const ENDPOINT_SLICE_PLAIN: &[&str] = &[
    "endpoints[].hostname",
    "endpoints[].nodeName",
    "endpoints[].zone",
    "ports[].appProtocol",
];

/// Whether the upstream CRD of `kind` defines fields below `path`.
fn upstream_parent(kind: &str, path: &str) -> bool {
    static PARENTS: std::sync::LazyLock<std::collections::HashSet<(&str, &str)>> =
        std::sync::LazyLock::new(|| {
            super::unknown_fields::UPSTREAM_FIELDS
                .lines()
                .filter_map(|l| l.split_once(' '))
                .filter_map(|(kind, path)| {
                    let parent = path.rfind(['.', '[']).map(|i| &path[..i])?;
                    Some((kind, parent))
                })
                .collect()
        });
    PARENTS.contains(&(kind, path))
}

struct DocumentSeed;

impl<'de> DeserializeSeed<'de> for DocumentSeed {
    type Value = Document;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Document, D::Error> {
        d.deserialize_any(DocumentVisitor)
    }
}

struct DocumentVisitor;

/// Why a document is not read straight (the file is then read through values).
const NOT_DIRECT: &str = "read through a value";

impl<'de> Visitor<'de> for DocumentVisitor {
    type Value = Document;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("an object")
    }

    fn visit_unit<E: de::Error>(self) -> Result<Document, E> {
        Ok(Document::Empty)
    }

    fn visit_none<E: de::Error>(self) -> Result<Document, E> {
        Ok(Document::Empty)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Document, A::Error> {
        let (mut api_version, mut kind) = (None::<String>, None::<String>);
        // The fields read so far, in the document's order.
        let mut read = Vec::new();
        while api_version.is_none() || kind.is_none() {
            let Some(key) = map.next_key::<serde_yaml::Value>()? else {
                break;
            };
            let value: serde_yaml::Value = map.next_value()?;
            let slot = match key.as_str() {
                Some("apiVersion") if api_version.is_none() => &mut api_version,
                Some("kind") if kind.is_none() => &mut kind,
                _ => {
                    read.push((key, value));
                    break;
                }
            };
            *slot = value.as_str().map(str::to_string);
            read.push((key, value));
            if slot.is_none() {
                // Not a string: reading the document as a value says so.
                break;
            }
        }
        let direct = match (&api_version, &kind) {
            (Some(a), Some(k)) if read.len() == 2 => Direct::of(a, k),
            _ => None,
        };
        let Some(direct) = direct else {
            return rest_as_value(map, read).map(Document::Value);
        };
        let object = match direct {
            Direct::Route(k) => {
                let mut route: Route = typed(direct, map)?;
                route.kind = k;
                names_pass(direct, &route.metadata)?;
                Object::Route(Arc::new(route))
            }
            Direct::Service => {
                let service: Service = typed(direct, map)?;
                names_pass(direct, &service.metadata)?;
                Object::Service(Arc::new(service))
            }
            Direct::EndpointSlice => {
                let slice: EndpointSlice = typed(direct, map)?;
                names_pass(direct, &slice.metadata)?;
                Object::EndpointSlice(Arc::new(slice))
            }
        };
        names::check_listener_names(&object).map_err(|_| de::Error::custom(NOT_DIRECT))?;
        Ok(Document::Object(object))
    }
}

/// An error when the object's name or namespace is one the API server refuses.
fn names_pass<E: de::Error>(direct: Direct, meta: &Meta) -> Result<(), E> {
    names::check_object_names(direct.kind(), &meta.name, meta.namespace.as_deref())
        .map_err(|_| E::custom(NOT_DIRECT))
}

/// The rest of the document's fields read into `T` straight from the events; an error
/// when a field is to be warned about or checked further.
fn typed<'de, T: DeserializeOwned, A: MapAccess<'de>>(
    direct: Direct,
    map: A,
) -> Result<T, A::Error> {
    let mut passes = true;
    let mut path = String::new();
    let value = serde_ignored::deserialize(
        Strict(de::value::MapAccessDeserializer::new(map)),
        |ignored| {
            path.clear();
            push_path(&ignored, Items::Any, &mut path);
            passes &= direct.passes(&path);
        },
    )?;
    if !passes {
        return Err(de::Error::custom(NOT_DIRECT));
    }
    Ok(value)
}

/// The document as a value: the fields read so far and the rest.
fn rest_as_value<'de, A: MapAccess<'de>>(
    mut map: A,
    read: Vec<(serde_yaml::Value, serde_yaml::Value)>,
) -> Result<serde_yaml::Value, A::Error> {
    let mut value = serde_yaml::Mapping::new();
    let rest = std::iter::from_fn(|| {
        map.next_entry::<serde_yaml::Value, serde_yaml::Value>()
            .transpose()
    });
    for field in read.into_iter().map(Ok).chain(rest) {
        let (key, field) = field?;
        // A key given twice: reading the document as a value reports it.
        if value.insert(key, field).is_some() {
            return Err(de::Error::custom(NOT_DIRECT));
        }
    }
    Ok(serde_yaml::Value::Mapping(value))
}
