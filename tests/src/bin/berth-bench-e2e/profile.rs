//! `--profile DIR`: where the gateway's CPU goes, row by row. This VM has no PMU
//! (`perf stat` says "not supported"), but the kernel's `cpu-clock` software event
//! samples: after a row's first measurement, with the load still running, `perf record`
//! samples the gateway's CPU for `PROFILE` with call graphs, and the report (symbols by
//! self time, kernel and JITed BPF programs by name) is kept as `DIR/ROW.txt` beside
//! `DIR/ROW.data`; its top lines are printed. The measurement itself is not sampled.

use std::{path::Path, process::Command, time::Duration};

use super::GATEWAY_CPU;

/// How long a row is sampled.
const PROFILE: Duration = Duration::from_secs(3);
/// Symbols printed per row.
const TOP: usize = 12;

/// Samples the gateway's CPU into `base`.data and reports into `base`.txt.
pub(super) fn record(base: &Path) {
    let data = base.with_extension("data");
    let secs = PROFILE.as_secs().to_string();
    let cpu = GATEWAY_CPU.to_string();
    let recorded = Command::new("perf")
        .args([
            "record",
            "-q",
            "-e",
            "cpu-clock",
            "-F",
            "4000",
            "-g",
            "-C",
            &cpu,
            "-o",
        ])
        .arg(&data)
        .args(["--", "sleep", &secs])
        .output();
    match recorded {
        Ok(out) if out.status.success() => {}
        Ok(out) => {
            eprintln!(
                "warning: perf record for {}: {}",
                base.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            );
            return;
        }
        Err(e) => {
            eprintln!("warning: perf record (is linux-perf installed?): {e}");
            return;
        }
    }
    let report = Command::new("perf")
        .args([
            "report",
            "--stdio",
            "--no-children",
            "--sort",
            "sym",
            "-g",
            "none",
            "-i",
        ])
        .arg(&data)
        .output();
    let Ok(report) = report else {
        eprintln!("warning: perf report for {} failed", base.display());
        return;
    };
    let text = String::from_utf8_lossy(&report.stdout).into_owned();
    if let Err(e) = std::fs::write(base.with_extension("txt"), &text) {
        eprintln!("warning: writing the profile of {}: {e}", base.display());
    }
    let name = base
        .file_name()
        .map(|n| n.to_string_lossy())
        .unwrap_or_default();
    eprintln!("profile {name} (CPU {GATEWAY_CPU}, self time):");
    for line in top(&text) {
        eprintln!("    {line}");
    }
}

/// The report's first `TOP` symbol lines ("  12.34%  [k] name").
fn top(report: &str) -> impl Iterator<Item = &str> {
    report
        .lines()
        .filter(|l| !l.starts_with('#') && l.contains('%'))
        .map(str::trim)
        .take(TOP)
}
