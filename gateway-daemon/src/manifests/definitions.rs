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
        Object::BackendHealthPolicy(x) => ("BackendHealthPolicy", &x.metadata),
        Object::RouteTrafficPolicy(x) => ("RouteTrafficPolicy", &x.metadata),
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

/// Where an object is defined: its file (an index into [`Definitions`]' files) and
/// document. (With the file's path shared per object and the document as a `usize`,
/// an entry took 40 bytes, and the table of 300,000 objects 21.5 MB.)
#[derive(Clone, Copy, Debug)]
struct Place {
    file: u32,
    document: u32,
}

/// A file that defines objects, and how many.
#[derive(Debug)]
struct DefiningFile {
    path: Arc<Path>,
    objects: usize,
}

/// Where each object in force is defined. One object has one definition: the same
/// route in two files is an error naming both, not one route with the ports of both.
#[derive(Debug, Default)]
pub struct Definitions {
    places: HashMap<Defined, Place>,
    /// The files by index; `None` for an index free again.
    files: Vec<Option<DefiningFile>>,
    /// The index of each file that defines objects.
    index: HashMap<Arc<Path>, u32>,
    /// Indices free again (searching `files` for one walked every file per new file:
    /// quadratic in the files of a start).
    free: Vec<u32>,
}

impl Definitions {
    /// The file that defines an object of `o`'s identity, if one does.
    pub fn file_of(&self, o: &Object) -> Option<&Path> {
        let place = self.places.get(&Defined(o.clone()))?;
        Some(&*self.file(place.file).path)
    }

    fn file(&self, index: u32) -> &DefiningFile {
        self.files[index as usize]
            .as_ref()
            .expect("a place names a file in force")
    }

    fn source(&self, place: Place) -> Source {
        Source {
            file: self.file(place.file).path.to_path_buf(),
            document: place.document as usize,
        }
    }

    /// The index of `file`, given one if it has none.
    fn index_of(&mut self, file: &Path) -> u32 {
        if let Some(&i) = self.index.get(file) {
            return i;
        }
        let path: Arc<Path> = Arc::from(file);
        let entry = Some(DefiningFile {
            path: Arc::clone(&path),
            objects: 0,
        });
        let i = match self.free.pop() {
            Some(free) => {
                self.files[free as usize] = entry;
                free
            }
            None => {
                self.files.push(entry);
                u32::try_from(self.files.len() - 1).expect("fewer than 2^32 manifest files")
            }
        };
        self.index.insert(path, i);
        i
    }

    /// Counts one object more (`+1`) or less (`-1`) for file `i`; a file that defines
    /// nothing more gives its index back.
    fn count(&mut self, i: u32, by: isize) {
        let Some(file) = self.files[i as usize].as_mut() else {
            return;
        };
        file.objects = file.objects.saturating_add_signed(by);
        if file.objects == 0 {
            self.index.remove(&file.path);
            self.files[i as usize] = None;
            self.free.push(i);
        }
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
        let this = self.index.get(file).copied();
        let mut here: HashMap<Defined, usize> = HashMap::with_capacity(new.objects.len());
        for (o, &document) in new.objects.iter().zip(&new.documents) {
            let key = Defined(o.clone());
            let other = match (here.get(&key), self.places.get(&key)) {
                (Some(&d), _) => Some(Source {
                    file: file.to_path_buf(),
                    document: d,
                }),
                (None, Some(p)) if Some(p.file) != this => Some(self.source(*p)),
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
            if let Some(p) = self.places.get(&key).copied() {
                if Some(p.file) == this {
                    self.places.remove(&key);
                    self.count(p.file, -1);
                }
            }
        }
        if here.is_empty() {
            return Ok(());
        }
        let i = self.index_of(file);
        for (key, document) in here {
            let document = u32::try_from(document).expect("fewer than 2^32 documents a file");
            let before = self.places.insert(key, Place { file: i, document });
            // Counted before the one replaced is let go: `i` stays in force.
            self.count(i, 1);
            if let Some(before) = before {
                self.count(before.file, -1);
            }
        }
        Ok(())
    }
}
