//! The records of a state directory that cannot be read, or that loading ignores:
//! listed with their line numbers (`berth state check`) or moved aside (`berth state
//! repair`).

use std::{fs::OpenOptions, io::Write};

use super::{
    bounded,
    claims::{ClaimsLog, Replay},
    first_seen::FirstSeenLog,
    io_err, journal,
    journal::Format,
    Cache, Result, Store, CLAIMS_LOG, FIRST_SEEN_LOG,
};

/// A record of a state directory that cannot be read, or that loading ignores.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BadRecord {
    /// The file (`claims.log`, `first-seen.log`, `generation`).
    pub file: &'static str,
    /// Line number, from 1.
    pub line: usize,
    /// The line as it is.
    pub text: String,
    /// What is wrong with it.
    pub problem: String,
}

impl std::fmt::Display for BadRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} line {}: {}", self.file, self.line, self.problem)
    }
}

impl Store {
    /// The records of the state directory that cannot be read, or that loading ignores
    /// (a port held twice), with line numbers (`berth state check`); changes nothing.
    pub fn check(&self) -> Result<Vec<BadRecord>> {
        Ok(self
            .scan(false)?
            .into_iter()
            .flat_map(|(_, _, bad)| bad)
            .collect())
    }

    /// Moves every record that cannot be read into `FILE.bad-TIME` beside its journal
    /// and rewrites the journal with the rest, in order (`berth state repair`); a
    /// `generation` that cannot be read is reset. Every valid claim is kept. Refused
    /// while a daemon runs on the directory. Returns what was moved.
    pub fn repair(&self) -> Result<Vec<BadRecord>> {
        let _owner = self.own()?;
        let _lock = self.lock()?;
        let stamp = humantime::format_rfc3339_seconds(std::time::SystemTime::now())
            .to_string()
            .replace(':', "");
        let mut moved = Vec::new();
        for (file, good, bad) in self.scan(true)? {
            if bad.is_empty() {
                continue;
            }
            let aside: String = bad.iter().map(|b| format!("{}\n", b.text)).collect();
            let aside_path = self.dir.join(format!("{file}.bad-{stamp}"));
            OpenOptions::new()
                .create(true)
                .append(true)
                .open(&aside_path)
                .and_then(|mut f| f.write_all(aside.as_bytes()).and_then(|()| f.sync_all()))
                .map_err(io_err("writing", &aside_path))?;
            let text: String = good.iter().map(|l| format!("{l}\n")).collect();
            journal::rewrite_file(&self.dir, file, &text)?;
            moved.extend(bad);
        }
        self.begin_write()?;
        *self.cache.lock().unwrap_or_else(|e| e.into_inner()) = Cache::default();
        Ok(moved)
    }

    /// Each file's bad records, and its good lines if `keep_good`.
    fn scan(&self, keep_good: bool) -> Result<Vec<Scanned>> {
        let mut out = Vec::new();
        // A claim record is bad if it does not parse or is ignored when replayed.
        let mut replay = Replay::default();
        let mut claims = |l: &str, n: usize| ClaimsLog::parse(l).and_then(|r| replay.apply(r, n));
        let mut seen = |l: &str, _: usize| FirstSeenLog::parse(l).map(|_| ());
        type Check<'f> = &'f mut dyn FnMut(&str, usize) -> std::result::Result<(), String>;
        for (file, check) in [
            (CLAIMS_LOG, &mut claims as Check),
            (FIRST_SEEN_LOG, &mut seen as Check),
        ] {
            let (mut good, mut bad) = (Vec::new(), Vec::new());
            // Streamed: memory holds the bad records, and the good lines only for repair.
            bounded::for_each_line(&self.dir.join(file), |line, n| {
                let problem = match line {
                    Ok(line) => match check(line, n) {
                        Ok(()) => {
                            if keep_good {
                                good.push(line.to_string());
                            }
                            return Ok(());
                        }
                        Err(problem) => (line.to_string(), problem),
                    },
                    Err(bad) => (bad.text(), bad.problem()),
                };
                bad.push(BadRecord {
                    file,
                    line: n,
                    text: problem.0,
                    problem: problem.1,
                });
                Ok(())
            })?;
            out.push((file, good, bad));
        }
        let generation = self.dir.join("generation");
        if let Ok(Some(text)) = bounded::read_small(&generation, bounded::MAX_SMALL) {
            if text.trim().parse::<u64>().is_err() {
                out.push((
                    "generation",
                    vec!["0".to_string()],
                    vec![BadRecord {
                        file: "generation",
                        line: 1,
                        text: text.trim_end().to_string(),
                        problem: "not a number".to_string(),
                    }],
                ));
            }
        }
        Ok(out)
    }
}

/// A file of a state directory as `Store::scan` read it: its name, the lines that read
/// and the records that do not.
type Scanned = (&'static str, Vec<String>, Vec<BadRecord>);
