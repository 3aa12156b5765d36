//! The first-seen times of routes: the journal `STATE/first-seen.log` (a route seen
//! for the first time is a line `+`, the time and its key, a route gone a line `-` and
//! its key), and the store's API for them, which keeps them in memory in step with it.

use std::{borrow::Cow, collections::BTreeMap, sync::Arc};

use crate::model::{Route, RouteKey, Time};

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

/// First-seen times of routes, by route, and how many routes
/// of the last pass over the routes present have each key. A pass reads only the routes
/// that are not the same allocations as in the pass before (one file changed: its
/// routes, not 100,000; 16 ms a change at 100k routes, measured) and tells the routes
/// that are gone without building a set of the present ones.
#[derive(Debug, Default)]
pub struct FirstSeenTimes {
    times: crate::planner::FastMap<RouteKey, Seen>,
    /// The routes of the last pass, when every count follows them and what that pass
    /// found was recorded (else the next pass reads every route).
    last: Option<Vec<Arc<Route>>>,
    /// The routes of a pass whose findings are not recorded yet.
    unrecorded: Option<Vec<Arc<Route>>>,
}

#[derive(Debug)]
struct Seen {
    time: Time,
    /// Routes of the last pass with this key.
    routes: u32,
}

/// What a pass found: keys seen for the first time (with their time) and keys no route
/// has any more.
pub type Found = (Vec<(RouteKey, Time)>, Vec<RouteKey>);

impl FirstSeenTimes {
    /// A pass over the routes present: gives each route without a creation time the
    /// time its key was first seen (`now` for a key not seen before), and returns the
    /// keys seen for the first time and those gone, for `Store::record_first_seen`.
    pub fn pass(&mut self, routes: &[Arc<Route>], now: Time) -> Found {
        self.unrecorded = None;
        let full = self.last.is_none();
        let (head, tail, last) = match self.last.take() {
            Some(last) => {
                let (head, tail) = crate::planner::changes::common_ends(&last, routes, Arc::ptr_eq);
                (head, tail, last)
            }
            None => {
                for seen in self.times.values_mut() {
                    seen.routes = 0;
                }
                (0, 0, Vec::new())
            }
        };
        let mut gone = Vec::new();
        for r in &last[head..last.len() - tail] {
            let key = RouteKey::of(r);
            if let Some(seen) = self.times.get_mut(&key) {
                seen.routes = seen.routes.saturating_sub(1);
                if seen.routes == 0 {
                    gone.push(key);
                }
            }
        }
        let mut added: Vec<(RouteKey, Time)> = Vec::new();
        let end = routes.len() - tail;
        for r in &routes[head..end] {
            let key = RouteKey::of(r);
            let t = match self.times.get_mut(&key) {
                Some(seen) => {
                    seen.routes += 1;
                    seen.time
                }
                None => {
                    added.push((key, now));
                    now
                }
            };
            if r.metadata.creation_timestamp.is_none() {
                // Set once per allocation: a route unchanged keeps the time it has.
                let _ = r.first_seen.set(t);
            }
        }
        // A route that is gone and comes back later is a new object with a new time.
        let removed: Vec<RouteKey> = if full {
            self.times
                .iter()
                .filter(|(_, seen)| seen.routes == 0)
                .map(|(k, _)| k.clone())
                .collect()
        } else {
            gone.into_iter()
                .filter(|k| self.times.get(k).is_some_and(|s| s.routes == 0))
                .collect()
        };
        let mut last = last;
        last.splice(head..last.len() - tail, routes[head..end].iter().cloned());
        // What this pass found is recorded before the next one, or the next reads all.
        if added.is_empty() && removed.is_empty() {
            self.last = Some(last);
        } else {
            self.unrecorded = Some(last);
        }
        (added, removed)
    }

    /// The first-seen time of `key`.
    pub fn get(&self, key: &RouteKey) -> Option<Time> {
        self.times.get(key).map(|e| e.time)
    }

    /// All times, by route.
    pub fn to_map(&self) -> BTreeMap<RouteKey, Time> {
        self.times
            .iter()
            .map(|(k, e)| (k.clone(), e.time))
            .collect()
    }

    /// Records a key first seen: a route of the pass that found it has it.
    pub(super) fn insert(&mut self, key: RouteKey, time: Time) {
        let seen = self.times.entry(key).or_insert(Seen { time, routes: 0 });
        seen.time = time;
        seen.routes += 1;
    }

    fn remove(&mut self, key: &RouteKey) {
        self.times.remove(key);
    }

    /// After the records of a pass are written: the next pass may skip what this one
    /// read.
    fn recorded(&mut self) {
        if let Some(last) = self.unrecorded.take() {
            self.last = Some(last);
        }
    }

    fn len(&self) -> usize {
        self.times.len()
    }
}

/// One record of the first-seen journal: `+`, the time and the route's
/// `Kind/namespace/name`; or `-` and the route.
/// Records to write borrow their route; records read own it.
pub(super) enum SeenRecord<'l> {
    /// Route first seen at a time.
    Seen(Cow<'l, RouteKey>, Time),
    /// Route gone.
    Gone(Cow<'l, RouteKey>),
}

/// The format of the first-seen journal.
pub(super) struct FirstSeenLog;

impl Format for FirstSeenLog {
    const FILE: &'static str = FIRST_SEEN_LOG;
    type Record<'l> = SeenRecord<'l>;

    fn parse(line: &str) -> std::result::Result<SeenRecord<'_>, String> {
        let mut fields = line.splitn(3, '\t');
        let parsed = match (fields.next(), fields.next(), fields.next()) {
            (Some("+"), Some(time), Some(key)) => RouteKey::parse(key)
                .zip(Time::parse(time))
                .map(|(key, time)| SeenRecord::Seen(Cow::Owned(key), time)),
            (Some("-"), Some(key), None) => {
                RouteKey::parse(key).map(|key| SeenRecord::Gone(Cow::Owned(key)))
            }
            _ => None,
        };
        parsed.ok_or_else(|| format!("not a first-seen record: {line:?}"))
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

    /// First-seen times of routes.
    pub fn first_seen(&self) -> Result<BTreeMap<RouteKey, Time>> {
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
        let lines = journal.replay(|record, _| match record {
            SeenRecord::Seen(key, time) => times.insert(key.into_owned(), time),
            SeenRecord::Gone(key) => times.remove(&key),
        })?;
        self.report_torn(journal.path(), lines.torn);
        Ok(FirstSeen {
            times,
            lines: lines.count,
        })
    }

    /// Records routes seen for the first time and forgets routes that are gone. Call
    /// under the lock, after `begin_write`.
    pub fn record_first_seen(
        &self,
        added: &[(RouteKey, Time)],
        removed: &[RouteKey],
    ) -> Result<()> {
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
            .map(|(key, time)| SeenRecord::Seen(Cow::Borrowed(key), *time))
            .chain(
                removed
                    .iter()
                    .map(|key| SeenRecord::Gone(Cow::Borrowed(key))),
            )
            .collect();
        for (key, time) in added {
            times.insert(key.clone(), *time);
        }
        for key in removed {
            times.remove(key);
        }
        let lines = seen.lines.saturating_add(added.len() + removed.len());
        let (written, lines) = if journal::worth_rewriting(lines, times.len()) {
            (self.rewrite_first_seen(times), times.len())
        } else {
            (journal.append(&records), lines)
        };
        match written {
            Ok(()) => {
                seen.lines = lines;
                times.recorded();
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
            .map(|(key, time)| SeenRecord::Seen(Cow::Borrowed(key), *time))
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Meta, RouteKind, RouteSpec};

    fn route(name: &str) -> Arc<Route> {
        Arc::new(Route {
            kind: RouteKind::Udp,
            metadata: Meta {
                name: name.into(),
                namespace: Some("a".into()),
                ..Meta::default()
            },
            spec: RouteSpec::default(),
            first_seen: Default::default(),
        })
    }

    /// The `n`th time of a test.
    fn t(n: u64) -> Time {
        Time::at(std::time::UNIX_EPOCH + std::time::Duration::from_secs(n))
    }

    /// A pass whose findings are recorded, as the cycle records them.
    fn pass(times: &mut FirstSeenTimes, routes: &[Arc<Route>], now: Time) -> Found {
        let (added, removed) = times.pass(routes, now);
        for (k, t) in &added {
            times.insert(k.clone(), *t);
        }
        for k in &removed {
            times.remove(k);
        }
        times.recorded();
        (added, removed)
    }

    fn keys(found: &[(RouteKey, Time)]) -> Vec<String> {
        found.iter().map(|(k, _)| k.to_string()).collect()
    }

    fn key(text: &str) -> RouteKey {
        RouteKey::parse(text).expect("a route key")
    }

    #[test]
    fn a_pass_reads_the_changed_routes_and_finds_what_a_full_pass_finds() {
        let mut times = FirstSeenTimes::default();
        let mut routes: Vec<Arc<Route>> = ["r0", "r1", "r2", "r3"].map(route).to_vec();
        let (added, removed) = pass(&mut times, &routes, t(0));
        assert_eq!(
            keys(&added),
            [
                "UDPRoute/a/r0",
                "UDPRoute/a/r1",
                "UDPRoute/a/r2",
                "UDPRoute/a/r3"
            ]
        );
        assert!(removed.is_empty());
        assert_eq!(
            routes[1].created().copied(),
            Some(t(0)),
            "a route without a creation time gets its first-seen time"
        );
        // Nothing changed: nothing found.
        assert_eq!(pass(&mut times, &routes, t(1)), (vec![], vec![]));
        // r1 replaced by r5, and a second r3 (the same name twice, as two files may
        // have it) in the middle.
        routes[1] = route("r5");
        routes.insert(2, route("r3"));
        let (added, removed) = pass(&mut times, &routes, t(2));
        assert_eq!(keys(&added), ["UDPRoute/a/r5"]);
        assert_eq!(removed, [key("UDPRoute/a/r1")]);
        assert_eq!(routes[1].created().copied(), Some(t(2)));
        assert_eq!(routes[2].created().copied(), Some(t(0)));
        // One of the two r3 goes: r3 is still there.
        routes.remove(2);
        assert_eq!(pass(&mut times, &routes, t(3)), (vec![], vec![]));
        // The other goes too.
        routes.pop();
        assert_eq!(pass(&mut times, &routes, t(4)).1, [key("UDPRoute/a/r3")]);
        assert_eq!(times.get(&key("UDPRoute/a/r3")), None);
        assert_eq!(times.get(&key("UDPRoute/a/r5")), Some(t(2)));
    }

    #[test]
    fn findings_not_recorded_are_found_again_by_the_next_pass() {
        let mut times = FirstSeenTimes::default();
        let mut routes = vec![route("r0")];
        pass(&mut times, &routes, t(0));
        routes.push(route("r1"));
        // The records of this pass are not written (a full disk).
        let (added, _) = times.pass(&routes, t(1));
        assert_eq!(keys(&added), ["UDPRoute/a/r1"]);
        let (added, removed) = pass(&mut times, &routes, t(2));
        assert_eq!(keys(&added), ["UDPRoute/a/r1"]);
        assert!(removed.is_empty());
    }
}
