//! `cargo xtask fuzz datapath [--packets N] [--seed S]`: random and mutated packets
//! through the gateway's XDP and TC programs under `BPF_PROG_TEST_RUN`, every output
//! checked against the invariants of `berth_tests::fuzz`. Prints packets run, verdicts,
//! translated packets, violations (the first few in full, with the seed) and
//! packets/s; exits non-zero on a violation. Needs root.

use std::process::ExitCode;

const USAGE: &str = "usage: berth-fuzz-datapath [--packets N] [--seed S]
  --packets N  packets to run (default 1000000)
  --seed S     generator seed, decimal or 0x-hex (default: from the clock)";

fn number(flag: &str, value: Option<&String>) -> Result<u64, String> {
    let value = value.ok_or_else(|| format!("{flag} needs a value"))?;
    let parsed = match value.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => value.parse(),
    };
    parsed.map_err(|e| format!("{flag} {value:?}: {e}"))
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut packets = 1_000_000;
    let mut seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let parsed = match flag.as_str() {
            "--packets" => number(flag, it.next()).map(|n| packets = n),
            "--seed" => number(flag, it.next()).map(|s| seed = s),
            _ => Err(format!("unknown argument {flag:?}")),
        };
        if let Err(e) = parsed {
            eprintln!("berth-fuzz-datapath: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    }
    eprintln!("fuzzing the datapath with {packets} packets, seed {seed:#x}");
    let report = berth_tests::fuzz::run(packets, seed);
    println!("{report}");
    if report.violations > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
