//! Where each object is defined, so that an object defined twice is an error naming
//! both places.

use std::{collections::HashMap, path::Path};

use super::{FileObjects, ManifestError, Source};
use crate::model::Object;

/// An object's identity: kind, namespace (`default` when unset) and name.
pub type ObjectKey = (&'static str, String, String);

/// The identity of `o`.
pub fn object_key(o: &Object) -> ObjectKey {
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
    /// The file that defines the object `key`, if one does.
    pub fn file_of(&self, key: &ObjectKey) -> Option<&Path> {
        self.0.get(key).map(|s| s.file.as_path())
    }

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
