//! Where each object is defined, so that an object defined twice is an error naming
//! both places.

use std::{
    collections::HashMap,
    hash::{Hash, Hasher},
    path::Path,
    sync::Arc,
};

use super::{FileObjects, ManifestError, Source};
use crate::model::{Meta, Object};

/// An object's identity: kind, namespace (`default` when unset) and name.
pub type ObjectKey = (&'static str, String, String);

/// The identity of `o`.
pub fn object_key(o: &Object) -> ObjectKey {
    let (kind, meta) = kind_and_meta(o);
    (kind, meta.ns().to_string(), meta.name.to_string())
}

fn kind_and_meta(o: &Object) -> (&'static str, &Meta) {
    match o {
        Object::GatewayClass(x) => ("GatewayClass", &x.metadata),
        Object::Gateway(x) => ("Gateway", &x.metadata),
        Object::Route(x) => (x.kind.name(), &x.metadata),
        Object::ReferenceGrant(x) => ("ReferenceGrant", &x.metadata),
        Object::Service(x) => ("Service", &x.metadata),
        Object::EndpointSlice(x) => ("EndpointSlice", &x.metadata),
        Object::Namespace(x) => ("Namespace", &x.metadata),
        Object::GatewayConfig(x) => ("GatewayConfig", &x.metadata),
    }
}

/// An object as a key of its identity (`object_key`) without copying it: the object
/// is shared with the file that defines it. (Keys of copied names and a path per
/// object took 700 bytes a route, 11 % of the daemon's heap at 10,000 routes.)
#[derive(Clone, Debug)]
struct Defined(Object);

impl Defined {
    fn identity(&self) -> (&'static str, &str, &str) {
        let (kind, meta) = kind_and_meta(&self.0);
        (kind, meta.ns(), &meta.name)
    }
}

impl PartialEq for Defined {
    fn eq(&self, other: &Self) -> bool {
        self.identity() == other.identity()
    }
}

impl Eq for Defined {}

impl Hash for Defined {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.identity().hash(state);
    }
}

/// Where an object is defined: its file (one allocation per file) and document.
#[derive(Clone, Debug)]
struct Place {
    file: Arc<Path>,
    document: usize,
}

impl Place {
    fn source(&self) -> Source {
        Source {
            file: self.file.to_path_buf(),
            document: self.document,
        }
    }
}

/// Where each object in force is defined. One object has one definition: the same
/// route in two files is an error naming both, not one route with the ports of both.
#[derive(Debug, Default)]
pub struct Definitions(HashMap<Defined, Place>);

impl Definitions {
    /// The file that defines an object of `o`'s identity, if one does.
    pub fn file_of(&self, o: &Object) -> Option<&Path> {
        self.0.get(&Defined(o.clone())).map(|p| &*p.file)
    }

    /// Makes `new` the definitions of `file` in place of `old` (its objects in force),
    /// unless `new` defines an object that another file (or another document of `new`)
    /// defines: then nothing changes, and the errors name both places.
    #[expect(
        clippy::mutable_key_type,
        reason = "a key hashes and compares its object's kind, namespace and name, which \
                  never change (a route's first-seen time, set once, is not part of it)"
    )]
    pub fn replace(
        &mut self,
        file: &Path,
        old: &FileObjects,
        new: &FileObjects,
    ) -> Result<(), Vec<ManifestError>> {
        let mut errors = Vec::new();
        let mut here: HashMap<Defined, usize> = HashMap::with_capacity(new.objects.len());
        for (o, &document) in new.objects.iter().zip(&new.documents) {
            let key = Defined(o.clone());
            let other = match (here.get(&key), self.0.get(&key)) {
                (Some(&d), _) => Some(Source {
                    file: file.to_path_buf(),
                    document: d,
                }),
                (None, Some(p)) if *p.file != *file => Some(p.source()),
                _ => None,
            };
            if let Some(other) = other {
                let (kind, ns, name) = key.identity();
                errors.push(ManifestError {
                    source_doc: Source {
                        file: file.to_path_buf(),
                        document,
                    },
                    object: format!("{kind} {ns}/{name}: "),
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
            let key = Defined(o.clone());
            if self.0.get(&key).is_some_and(|p| *p.file == *file) {
                self.0.remove(&key);
            }
        }
        let shared: Arc<Path> = Arc::from(file);
        for (key, document) in here {
            let file = Arc::clone(&shared);
            self.0.insert(key, Place { file, document });
        }
        Ok(())
    }
}
