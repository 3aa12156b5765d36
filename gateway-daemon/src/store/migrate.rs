//! Migrations from the layouts of earlier versions: claims in a YAML file each under
//! `STATE/claims/NS/`, moved into the claims journal when the store is opened, and
//! first-seen times in `STATE/first-seen.yaml`, read until the first-seen journal is
//! first written.

use std::{collections::BTreeMap, fs, io, path::PathBuf};

use super::{
    bounded,
    claims::claim_record,
    first_seen::{FirstSeen, FirstSeenTimes},
    io_err,
    journal::{read_dir, sync_dir},
    Result, Store, StoreError, CLAIMS_LOG, FIRST_SEEN_YAML,
};
use crate::model::{PortClaim, RouteKey, Time};

impl Store {
    /// Moves claims of earlier versions (a YAML file each) into the journal, once.
    pub(super) fn import_claim_files(&self) -> Result<()> {
        let root = self.dir.join("claims");
        if !root.exists() {
            return Ok(());
        }
        let _lock = self.lock()?;
        let log = self.dir.join(CLAIMS_LOG);
        if !log.exists() {
            let mut text = String::new();
            for c in self.read_claim_files()? {
                claim_record(&mut text, &c, &log)?;
            }
            self.claims_log().rewrite(&text)?;
        }
        // In the journal now (also if an earlier import stopped before this).
        fs::remove_dir_all(&root).map_err(io_err("removing", &root))?;
        sync_dir(&self.dir)
    }

    /// The first-seen times of earlier versions, none if there are none.
    pub(super) fn import_first_seen_yaml(&self) -> Result<FirstSeen> {
        let path = self.dir.join(FIRST_SEEN_YAML);
        let times: BTreeMap<String, String> = match bounded::read_small(&path, bounded::MAX_YAML)? {
            Some(text) => serde_yaml::from_str(&text).map_err(|e| StoreError::Corrupt {
                path: path.clone(),
                message: e.to_string(),
            })?,
            None => BTreeMap::new(),
        };
        let mut imported = FirstSeenTimes::default();
        for (key, text) in times {
            match (RouteKey::parse(&key), Time::parse(&text)) {
                (Some(route), Some(time)) => imported.insert(route, time),
                _ => tracing::warn!(
                    path = %path.display(),
                    route = key,
                    time = text,
                    "a first-seen time of an earlier version is no route and RFC 3339 time; \
                     left out"
                ),
            }
        }
        Ok(FirstSeen {
            times: imported,
            // Not in the journal yet: the next record rewrites it whole.
            lines: usize::MAX,
        })
    }

    /// Removes the first-seen times of earlier versions, once the journal holds them.
    pub(super) fn remove_first_seen_yaml(&self) -> Result<()> {
        let old = self.dir.join(FIRST_SEEN_YAML);
        match fs::remove_file(&old) {
            Ok(()) => sync_dir(&self.dir),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io_err("removing", &old)(e)),
        }
    }

    /// Claims of earlier versions: a YAML file each under `claims/NS/`.
    fn read_claim_files(&self) -> Result<Vec<PortClaim>> {
        let root = self.dir.join("claims");
        let mut out = Vec::new();
        let mut namespaces: Vec<PathBuf> = read_dir(&root)?
            .into_iter()
            .filter(|p| p.is_dir())
            .collect();
        namespaces.sort();
        for ns in namespaces {
            let mut files: Vec<PathBuf> = read_dir(&ns)?
                .into_iter()
                .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
                .collect();
            files.sort();
            for f in files {
                let Some(text) = bounded::read_small(&f, bounded::MAX_YAML)? else {
                    continue;
                };
                let claim: PortClaim =
                    serde_yaml::from_str(&text).map_err(|e| StoreError::Corrupt {
                        path: f.clone(),
                        message: e.to_string(),
                    })?;
                out.push(claim);
            }
        }
        Ok(out)
    }
}
