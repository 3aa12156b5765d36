//! The claims: the journal `STATE/claims.log` (a claim created or changed is a line `+`
//! and its JSON, a claim deleted a line `-`, its namespace and name), its replay, and
//! the store's claim API, which keeps the claims in memory in step with the journal.

use std::{collections::BTreeMap, path::Path, sync::Arc};

use super::{
    journal::{self, Format, Journal},
    Cache, Result, Store, StoreError, CLAIMS_LOG,
};
use crate::model::{claim_name, ClaimList, PortClaim};

/// Claims as read from the journal (by namespace, then name; shared with readers
/// until the next write), the journal's length in lines, and how many of its records
/// were ignored when it was read.
#[derive(Debug, Default)]
pub(super) struct Claims {
    list: ClaimList,
    lines: usize,
    ignored: usize,
}

fn claim_key(c: &PortClaim) -> (&str, &str) {
    (c.metadata.ns(), c.metadata.name.as_str())
}

/// The namespace and name of the claim a record changes.
fn record_key<'a>(r: &'a ClaimRecord<'_>) -> (&'a str, &'a str) {
    match r {
        ClaimRecord::Put(c) => claim_key(c),
        ClaimRecord::Delete(ns, name) => (ns, name),
    }
}

impl Claims {
    fn find(&self, namespace: &str, name: &str) -> std::result::Result<usize, usize> {
        self.list
            .binary_search_by(|c| claim_key(c).cmp(&(namespace, name)))
    }

    /// Applies `changes` in order: one at a time where it belongs, or, for many, by
    /// merging them, sorted, into the list once (a `BTreeMap` keyed by copied names,
    /// for the 100,000 claims of a first plan: an estimated 15 MB, not measured alone).
    fn apply(&mut self, changes: &[ClaimRecord]) {
        let list = &mut self.list;
        if changes.len() > 64 {
            // The last change of each name, in name order (the sort is stable).
            let mut last: Vec<&ClaimRecord> = changes.iter().collect();
            last.sort_by(|a, b| record_key(a).cmp(&record_key(b)));
            last.reverse();
            last.dedup_by(|later, kept| record_key(later) == record_key(kept));
            last.reverse();
            let mut old = std::mem::take(list).into_iter().peekable();
            let mut merged: Vec<Arc<PortClaim>> = Vec::with_capacity(old.len() + last.len());
            for change in last {
                let key = record_key(change);
                while let Some(c) = old.next_if(|c| claim_key(c) < key) {
                    merged.push(c);
                }
                old.next_if(|c| claim_key(c) == key);
                if let ClaimRecord::Put(c) = change {
                    merged.push(Arc::clone(c));
                }
            }
            merged.extend(old);
            *list = merged.into_iter().collect();
            return;
        }
        for change in changes {
            let (ns, name) = record_key(change);
            match (
                change,
                list.binary_search_by(|c| claim_key(c).cmp(&(ns, name))),
            ) {
                (ClaimRecord::Put(c), Ok(i)) => list[i] = Arc::clone(c),
                (ClaimRecord::Put(c), Err(i)) => list.insert(i, Arc::clone(c)),
                (ClaimRecord::Delete(..), Ok(i)) => {
                    list.remove(i);
                }
                (ClaimRecord::Delete(..), Err(_)) => {}
            }
        }
    }
}

impl Claims {
    /// The journal holding just these claims.
    fn journal_text(&self, journal: &Journal<ClaimsLog>) -> Result<String> {
        let whole: Vec<ClaimRecord> = self
            .list
            .iter()
            .map(|c| ClaimRecord::Put(Arc::clone(c)))
            .collect();
        journal.text(&whole)
    }
}

/// One record of the claims journal: a change to the claims.
pub(super) enum ClaimRecord<'l> {
    /// A created or changed claim (shared with the writer and the readers of the list).
    Put(Arc<PortClaim>),
    /// A deleted claim: namespace and name.
    Delete(&'l str, &'l str),
}

/// The format of the claims journal.
pub(super) struct ClaimsLog;

impl Format for ClaimsLog {
    const FILE: &'static str = CLAIMS_LOG;
    type Record<'l> = ClaimRecord<'l>;

    fn parse(line: &str) -> std::result::Result<ClaimRecord<'_>, String> {
        match line.split_once('\t') {
            Some(("+", json)) => serde_json::from_str(json)
                .map(|c| ClaimRecord::Put(Arc::new(c)))
                .map_err(|e| e.to_string()),
            Some(("-", key)) => key
                .split_once('\t')
                .map(|(ns, name)| ClaimRecord::Delete(ns, name))
                .ok_or_else(|| format!("not a deletion: {line:?}")),
            _ => Err(format!("not a claim record: {line:?}")),
        }
    }

    fn write(record: &ClaimRecord<'_>, out: &mut String) -> std::result::Result<(), String> {
        match record {
            ClaimRecord::Put(c) => put_line(out, c)?,
            ClaimRecord::Delete(ns, name) => {
                out.push_str("-\t");
                out.push_str(ns);
                out.push('\t');
                out.push_str(name);
                out.push('\n');
            }
        }
        Ok(())
    }
}

fn put_line(out: &mut String, claim: &PortClaim) -> std::result::Result<(), String> {
    let json = serde_json::to_string(claim).map_err(|e| e.to_string())?;
    out.push_str("+\t");
    out.push_str(&json);
    out.push('\n');
    Ok(())
}

/// Appends the journal record of a created or changed claim to `out` (`path`, the
/// journal, for the error).
pub(super) fn claim_record(out: &mut String, claim: &PortClaim, path: &Path) -> Result<()> {
    put_line(out, claim).map_err(|message| StoreError::Corrupt {
        path: path.to_path_buf(),
        message,
    })
}

/// The claims of a journal, replayed record by record. A record that would make a
/// port held twice (a second claim, under another name, for a port of a Gateway a
/// claim holds already) is ignored: the earlier holder keeps the port. (A claim is
/// named after its Gateway, protocol and port, so only a damaged or hand-edited
/// journal has one.)
#[derive(Default)]
pub(super) struct Replay {
    /// (namespace, name) → claim and the line that wrote it.
    by_name: BTreeMap<(String, String), (Arc<PortClaim>, usize)>,
    /// (namespace, Gateway, protocol, port) → the name of the claim holding it.
    by_port: BTreeMap<(String, String, String, u16), String>,
}

impl Replay {
    fn port_key(c: &PortClaim) -> (String, String, String, u16) {
        (
            c.metadata.ns().to_string(),
            c.spec.gateway.to_string(),
            c.spec.protocol.to_ascii_uppercase().to_string(),
            c.spec.port,
        )
    }

    /// Applies the record of line `line`; the problem if it is ignored.
    pub(super) fn apply(
        &mut self,
        record: ClaimRecord,
        line: usize,
    ) -> std::result::Result<(), String> {
        match record {
            ClaimRecord::Put(c) => {
                let name = (c.metadata.ns().to_string(), c.metadata.name.to_string());
                let port = Self::port_key(&c);
                if let Some(holder) = self.by_port.get(&port).filter(|h| **h != name.1) {
                    let (held, at) = &self.by_name[&(name.0.clone(), holder.clone())];
                    let r = &c.spec.route;
                    return Err(format!(
                        "claim {}/{} ({} {}/{}) ignored: port {} {} of Gateway {}/{} is held \
                         by claim {}/{} ({} {}/{}, line {at})",
                        name.0,
                        name.1,
                        r.kind,
                        r.namespace,
                        r.name,
                        port.2,
                        port.3,
                        port.0,
                        port.1,
                        held.metadata.ns(),
                        held.metadata.name,
                        held.spec.route.kind,
                        held.spec.route.namespace,
                        held.spec.route.name,
                    ));
                }
                // A claim is named after its Gateway, protocol and port: a record whose
                // name says another port was changed by hand or damaged. (Such a record
                // once moved its route to the port it said, silently.)
                let expected = claim_name(&c.spec.gateway, &c.spec.protocol, c.spec.port);
                if name.1 != expected {
                    return Err(format!(
                        "claim {}/{} ignored: its name does not match what it claims ({} port \
                         {} of Gateway {}/{}, which would be named {expected}): the record was \
                         changed by hand or damaged",
                        name.0, name.1, port.2, port.3, port.0, port.1,
                    ));
                }
                if let Some((old, _)) = self.by_name.insert(name.clone(), (c, line)) {
                    self.by_port.remove(&Self::port_key(&old));
                }
                self.by_port.insert(port, name.1);
            }
            ClaimRecord::Delete(ns, name) => {
                if let Some((old, _)) = self.by_name.remove(&(ns.to_string(), name.to_string())) {
                    self.by_port.remove(&Self::port_key(&old));
                }
            }
        }
        Ok(())
    }

    /// The claims held, by namespace then name.
    fn into_claims(self) -> ClaimList {
        self.by_name.into_values().map(|(c, _)| c).collect()
    }
}

impl Store {
    /// The claims journal.
    pub(super) fn claims_log(&self) -> Journal<ClaimsLog> {
        Journal::new(&self.dir)
    }

    /// How many records of the claims journal were ignored when it was last read
    /// (none if it was not read yet).
    pub fn ignored_records(&self) -> u64 {
        let cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        cache.claims.as_ref().map_or(0, |c| c.ignored as u64)
    }

    /// Every stored claim, by namespace then name.
    pub fn claims(&self) -> Result<Vec<PortClaim>> {
        Ok(self
            .claims_shared()?
            .iter()
            .map(|c| (**c).clone())
            .collect())
    }

    /// Every stored claim, by namespace then name, shared with the store (no copy; the
    /// store's next write copies only what it changes).
    pub fn claims_shared(&self) -> Result<ClaimList> {
        let mut cache = self.fresh_cache()?;
        Ok(self.loaded_claims(&mut cache)?.list.clone())
    }

    fn loaded_claims<'c>(&self, cache: &'c mut Cache) -> Result<&'c mut Claims> {
        if cache.claims.is_none() {
            cache.claims = Some(self.read_claims()?);
        }
        Ok(cache.claims.as_mut().expect("just filled"))
    }

    fn read_claims(&self) -> Result<Claims> {
        let journal = self.claims_log();
        let mut replay = Replay::default();
        let mut ignored = 0;
        let lines = journal.replay(|record, n| {
            if let Err(problem) = replay.apply(record, n) {
                ignored += 1;
                let path = journal.path().display();
                self.report_once(format!("{path} line {n}: {problem}"));
            }
        })?;
        self.report_torn(journal.path(), lines.torn);
        Ok(Claims {
            list: replay.into_claims(),
            lines: lines.count,
            ignored,
        })
    }

    /// Creates a claim; fails with `AlreadyExists` if a claim of that name exists.
    pub fn create(&self, claim: &PortClaim) -> Result<()> {
        self.create_all(&[claim])
    }

    /// Creates claims with one append and one fsync. Stops with `AlreadyExists` at the
    /// first claim someone holds already; those before it are created (and durable).
    pub fn create_all(&self, claims: &[&PortClaim]) -> Result<()> {
        let claims: Vec<Arc<PortClaim>> = claims.iter().map(|&c| Arc::new(c.clone())).collect();
        self.commit(&[], &[], &claims)
    }

    /// Deletes, replaces and creates claims with one append and one fsync, in that order
    /// (a port handed over is free before its new claim). Creation stops with
    /// `AlreadyExists` at the first claim someone holds already; everything before it is
    /// written (and durable).
    pub fn commit(
        &self,
        deletes: &[(&str, &str)],
        updates: &[Arc<PortClaim>],
        claims: &[Arc<PortClaim>],
    ) -> Result<()> {
        if deletes.is_empty() && updates.is_empty() && claims.is_empty() {
            return Ok(());
        }
        let _lock = self.lock_for_write()?;
        let held = {
            let mut cache = self.fresh_cache()?;
            let stored = self.loaded_claims(&mut cache)?;
            claims
                .iter()
                .position(|c| stored.find(c.metadata.ns(), &c.metadata.name).is_ok())
        };
        let (new, conflict) = claims.split_at(held.unwrap_or(claims.len()));
        let changes = deletes
            .iter()
            .map(|&(ns, name)| ClaimRecord::Delete(ns, name))
            .chain(
                updates
                    .iter()
                    .chain(new)
                    .map(|c| ClaimRecord::Put(Arc::clone(c))),
            );
        self.write_claims(changes)?;
        match conflict.first() {
            None => Ok(()),
            Some(c) => Err(StoreError::AlreadyExists {
                namespace: c.metadata.ns().to_string(),
                name: c.metadata.name.to_string(),
            }),
        }
    }

    /// Replaces a claim's content.
    pub fn update(&self, claim: &PortClaim) -> Result<()> {
        let _lock = self.lock_for_write()?;
        self.write_claims([ClaimRecord::Put(Arc::new(claim.clone()))])
    }

    /// Deletes a claim (no error if it is already gone).
    pub fn delete(&self, namespace: &str, name: &str) -> Result<()> {
        let _lock = self.lock_for_write()?;
        self.write_claims([ClaimRecord::Delete(namespace, name)])
    }

    /// Appends `changes` to the claims journal (under the lock), durably, and keeps
    /// the cache in step; rewrites the journal when it has grown to twice its claims.
    fn write_claims<'c>(&self, changes: impl IntoIterator<Item = ClaimRecord<'c>>) -> Result<()> {
        let journal = self.claims_log();
        let changes: Vec<ClaimRecord> = changes.into_iter().collect();
        if changes.is_empty() {
            return Ok(());
        }
        self.begin_write()?;
        let mut cache = self.fresh_cache()?;
        let claims = self.loaded_claims(&mut cache)?;
        // The cache follows the disk: the changes are applied to a copy, which replaces
        // the cache only once the journal holds them durably. (It used to be applied
        // first: with the disk full mid-append, the next cycle saw nothing left to write,
        // the records were never written, and a restart lost the claims.)
        let mut next = Claims {
            list: claims.list.clone(),
            lines: claims.lines,
            ignored: claims.ignored,
        };
        next.apply(&changes);
        let lines = next.lines.saturating_add(changes.len());
        let written = if journal::worth_rewriting(lines, next.list.len()) {
            let whole = next.journal_text(&journal)?;
            next.lines = next.list.len();
            // The rewrite holds only what is served: the ignored records are gone.
            next.ignored = 0;
            journal.rewrite(&whole)
        } else {
            next.lines = lines;
            journal.append(&changes)
        };
        match written {
            Ok(()) => *claims = next,
            // What is on disk now is read again before anything else is planned on it.
            Err(e) => {
                cache.claims = None;
                return Err(e);
            }
        }
        Ok(())
    }
}

/// What `Store::compact` did to one journal.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Compaction {
    /// Rewritten to what it holds.
    Rewritten {
        /// The journal.
        file: &'static str,
        /// Its lines before.
        lines: usize,
        /// Its records (= lines) after.
        records: usize,
    },
    /// Left as it is: some of its records are ignored, and `berth state repair` is
    /// what moves them aside (a rewrite would drop them unseen).
    KeptForRepair {
        /// The journal.
        file: &'static str,
        /// Records ignored.
        ignored: usize,
    },
}

impl Store {
    /// Rewrites each journal that has grown beyond twice what it holds to just what it
    /// holds (`berth run` calls it at start, so a journal never grows without bound
    /// across restarts): temporary file fsynced, renamed over, directory fsynced, so a
    /// `kill -9` at any instant leaves either journal whole. Every record that is
    /// served is kept; a journal with ignored records is left for `berth state repair`.
    pub fn compact(&self) -> Result<Vec<Compaction>> {
        let _lock = self.lock_for_write()?;
        self.begin_write()?;
        let mut out = Vec::new();
        {
            let mut cache = self.fresh_cache()?;
            let claims = self.loaded_claims(&mut cache)?;
            let (lines, records) = (claims.lines, claims.list.len());
            if journal::worth_rewriting(lines, records) {
                if claims.ignored > 0 {
                    out.push(Compaction::KeptForRepair {
                        file: CLAIMS_LOG,
                        ignored: claims.ignored,
                    });
                } else {
                    let journal = self.claims_log();
                    let text = claims.journal_text(&journal)?;
                    if let Err(e) = journal.rewrite(&text) {
                        cache.claims = None;
                        return Err(e);
                    }
                    claims.lines = records;
                    out.push(Compaction::Rewritten {
                        file: CLAIMS_LOG,
                        lines,
                        records,
                    });
                }
            }
        }
        if let Some(c) = self.compact_first_seen()? {
            out.push(c);
        }
        Ok(out)
    }
}

impl std::fmt::Display for Compaction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Compaction::Rewritten {
                file,
                lines,
                records,
            } => write!(
                f,
                "{file}: compacted from {lines} lines to {records} records"
            ),
            Compaction::KeptForRepair { file, ignored } => write!(
                f,
                "{file}: not compacted, {ignored} records are ignored (`berth state repair` \
                 moves them aside)"
            ),
        }
    }
}
