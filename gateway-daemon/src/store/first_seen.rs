//! The first-seen times of routes: the journal `STATE/first-seen.log` (a route seen
//! for the first time is a line `+`, the time and its key, a route gone a line `-` and
//! its key), and the store's API for them, which keeps them in memory in step with it.

use std::collections::BTreeMap;

use crate::model::Time;

use super::{
    claims::Compaction,
    journal::{self, Format, Journal},
    Cache, Result, Store, FIRST_SEEN_LOG,
};

/// First-seen times as read from the journal, and the journal's length in lines.
#[derive(Debug)]
pub(super) struct FirstSeen {
    pub(super) times: FirstSeenTimes,
    pub(super) lines: usize,
}

/// First-seen times of routes (`Kind/namespace/name` → RFC 3339), and which of them a
/// pass over the routes present has seen: a pass costs one lookup per route and tells
/// the routes that are gone without building a set of the present ones.
#[derive(Debug, Default)]
pub struct FirstSeenTimes {
    times: crate::planner::FastMap<String, Seen>,
    /// The current pass.
    pass: u64,
    /// Distinct keys seen in the current pass.
    seen: usize,
}

#[derive(Debug)]
struct Seen {
    time: Time,
    /// The last pass that saw this key.
    pass: u64,
}

impl FirstSeenTimes {
    /// Starts a pass over the routes present.
    pub fn begin_pass(&mut self) {
        self.pass += 1;
        self.seen = 0;
    }

    /// The first-seen time of `key`, marking it present in this pass.
    pub fn see(&mut self, key: &str) -> Option<&Time> {
        let pass = self.pass;
        let e = self.times.get_mut(key)?;
        if e.pass != pass {
            e.pass = pass;
            self.seen += 1;
        }
        Some(&e.time)
    }

    /// Keys not seen in this pass.
    pub fn unseen(&self) -> Vec<String> {
        if self.seen == self.times.len() {
            return Vec::new();
        }
        self.times
            .iter()
            .filter(|(_, e)| e.pass != self.pass)
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// The first-seen time of `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.times.get(key).map(|e| &*e.time)
    }

    /// All times, by key.
    pub fn to_map(&self) -> BTreeMap<String, String> {
        self.times
            .iter()
            .map(|(k, e)| (k.clone(), e.time.to_string()))
            .collect()
    }

    pub(super) fn insert(&mut self, key: String, time: Time) {
        // Recorded during a pass: the route is present.
        let pass = self.pass;
        if self.times.insert(key, Seen { time, pass }).is_none() {
            self.seen += 1;
        }
    }

    fn remove(&mut self, key: &str) {
        if let Some(e) = self.times.remove(key) {
            if e.pass == self.pass {
                self.seen -= 1;
            }
        }
    }

    fn len(&self) -> usize {
        self.times.len()
    }
}

/// One record of the first-seen journal.
pub(super) enum SeenRecord<'l> {
    /// Route key first seen at a time.
    Seen(&'l str, &'l str),
    /// Route key gone.
    Gone(&'l str),
}

/// The format of the first-seen journal.
pub(super) struct FirstSeenLog;

impl Format for FirstSeenLog {
    const FILE: &'static str = FIRST_SEEN_LOG;
    type Record<'l> = SeenRecord<'l>;

    fn parse(line: &str) -> std::result::Result<SeenRecord<'_>, String> {
        let mut fields = line.splitn(3, '\t');
        match (fields.next(), fields.next(), fields.next()) {
            (Some("+"), Some(time), Some(key)) if humantime::parse_rfc3339_weak(time).is_ok() => {
                Ok(SeenRecord::Seen(key, time))
            }
            (Some("-"), Some(key), None) => Ok(SeenRecord::Gone(key)),
            _ => Err(format!("not a first-seen record: {line:?}")),
        }
    }

    fn write(record: &SeenRecord<'_>, out: &mut String) -> std::result::Result<(), String> {
        match record {
            SeenRecord::Seen(key, time) => out.push_str(&format!("+\t{time}\t{key}\n")),
            SeenRecord::Gone(key) => out.push_str(&format!("-\t{key}\n")),
        }
        Ok(())
    }
}

impl Store {
    /// The first-seen journal.
    fn first_seen_log(&self) -> Journal<FirstSeenLog> {
        Journal::new(&self.dir)
    }

    /// First-seen times of routes (`Kind/namespace/name` → RFC 3339).
    pub fn first_seen(&self) -> Result<BTreeMap<String, String>> {
        self.with_first_seen(|t| t.to_map())
    }

    /// Runs `f` on the first-seen times (read from the directory if it changed).
    pub fn with_first_seen<T>(&self, f: impl FnOnce(&mut FirstSeenTimes) -> T) -> Result<T> {
        let mut cache = self.fresh_cache()?;
        Ok(f(&mut self.loaded_first_seen(&mut cache)?.times))
    }

    fn loaded_first_seen<'c>(&self, cache: &'c mut Cache) -> Result<&'c mut FirstSeen> {
        if cache.first_seen.is_none() {
            cache.first_seen = Some(self.read_first_seen()?);
        }
        Ok(cache.first_seen.as_mut().expect("just filled"))
    }

    fn read_first_seen(&self) -> Result<FirstSeen> {
        let journal = self.first_seen_log();
        if !journal.path().exists() {
            return self.import_first_seen_yaml();
        }
        let mut times = FirstSeenTimes::default();
        // Routes first seen together have one time: one allocation for all of them.
        let mut last: Option<Time> = None;
        let lines = journal.replay(|record, _| match record {
            SeenRecord::Seen(key, time) => {
                let time = match &last {
                    Some(t) if **t == *time => Time::clone(t),
                    _ => last.insert(Time::from(time)).clone(),
                };
                times.insert(key.to_string(), time)
            }
            SeenRecord::Gone(key) => times.remove(key),
        })?;
        self.report_torn(journal.path(), lines.torn);
        Ok(FirstSeen {
            times,
            lines: lines.count,
        })
    }

    /// Records routes seen for the first time and forgets routes that are gone. Call
    /// under the lock, after `begin_write`.
    pub fn record_first_seen(&self, added: &[(String, Time)], removed: &[String]) -> Result<()> {
        if added.is_empty() && removed.is_empty() {
            return Ok(());
        }
        let journal = self.first_seen_log();
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        let seen = self.loaded_first_seen(&mut cache)?;
        // As for claims, memory follows the disk: if the journal does not take the
        // records, the times in memory are dropped and read again from the journal.
        let times = &mut seen.times;
        let records: Vec<SeenRecord> = added
            .iter()
            .map(|(key, time)| SeenRecord::Seen(key, time))
            .chain(removed.iter().map(|key| SeenRecord::Gone(key)))
            .collect();
        let text = journal.text(&records)?;
        for (key, time) in added {
            times.insert(key.clone(), time.clone());
        }
        for key in removed {
            times.remove(key);
        }
        let lines = seen.lines.saturating_add(added.len() + removed.len());
        let (written, lines) = if journal::worth_rewriting(lines, times.len()) {
            (self.rewrite_first_seen(times), times.len())
        } else {
            (journal.append(&text), lines)
        };
        match written {
            Ok(()) => {
                seen.lines = lines;
                Ok(())
            }
            Err(e) => {
                cache.first_seen = None;
                Err(e)
            }
        }
    }

    fn rewrite_first_seen(&self, times: &FirstSeenTimes) -> Result<()> {
        let journal = self.first_seen_log();
        let map = times.to_map();
        let records: Vec<SeenRecord> = map
            .iter()
            .map(|(key, time)| SeenRecord::Seen(key, time))
            .collect();
        journal.rewrite(&journal.text(&records)?)?;
        self.remove_first_seen_yaml()
    }
}

impl Store {
    /// Rewrites the first-seen journal to what it holds if it has grown beyond twice
    /// that (see `Store::compact`; call under the lock, after `begin_write`).
    pub(super) fn compact_first_seen(&self) -> Result<Option<Compaction>> {
        let mut cache = self.fresh_cache()?;
        let seen = self.loaded_first_seen(&mut cache)?;
        // `usize::MAX` lines: the times of earlier versions, not in the journal yet.
        let (lines, records) = (seen.lines, seen.times.len());
        if lines == usize::MAX || !journal::worth_rewriting(lines, records) {
            return Ok(None);
        }
        if let Err(e) = self.rewrite_first_seen(&seen.times) {
            cache.first_seen = None;
            return Err(e);
        }
        seen.lines = records;
        Ok(Some(Compaction::Rewritten {
            file: FIRST_SEEN_LOG,
            lines,
            records,
        }))
    }
}
