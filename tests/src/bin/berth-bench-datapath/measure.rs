//! Timing the cases: `BPF_PROG_TEST_RUN` runs, rounds of them, on one datapath or on
//! two in turn (A/B).

use aya::programs::{TestRun, TestRunOptions};
use berth::datapath::Datapath;

use crate::cases::Case;

/// One test run; returns (verdict, kernel-measured ns per repetition).
pub fn run(
    dp: &mut Datapath,
    program: &'static str,
    ifindex: u32,
    frame: &[u8],
    repeat: u32,
    out: &mut [u8],
) -> (u32, u64) {
    let mut ctx = [0u8; 24];
    ctx[4..8].copy_from_slice(&(frame.len() as u32).to_ne_bytes());
    ctx[12..16].copy_from_slice(&ifindex.to_ne_bytes());
    let prog = dp.program_mut(program).expect("program");
    let opts = TestRunOptions {
        data_in: Some(frame),
        data_out: Some(out),
        ctx_in: Some(&ctx),
        repeat,
        ..TestRunOptions::default()
    };
    let r = prog.test_run(opts).expect("test_run");
    (r.return_value, r.duration.as_nanos() as u64)
}

pub fn median(mut v: Vec<u64>) -> u64 {
    v.sort_unstable();
    v[v.len() / 2]
}

/// The median of each round of `runs` runs of `case` with `repeat` repetitions, per
/// datapath: `rounds` rounds each, round `r` timing every datapath in turn, in the
/// order of `dps` when `r` is even and reversed when it is odd (A B B A A B ...). All
/// datapaths take the same frames in round `r`.
pub fn rounds(
    dps: &mut [&mut Datapath],
    case: &Case,
    repeat: u32,
    runs: usize,
    rounds: usize,
) -> Vec<Vec<u64>> {
    let mut out = vec![0u8; 512];
    let mut medians = vec![Vec::with_capacity(rounds); dps.len()];
    let frame = match (&case.hot_frame, repeat > 1) {
        (Some(hot), true) => hot,
        _ => &case.frame,
    };
    for r in 0..rounds {
        // Frames are built first so that only the program is timed.
        let frames: Vec<Vec<u8>> = (0..runs).map(|i| frame(r * runs + i)).collect();
        let mut order: Vec<usize> = (0..dps.len()).collect();
        if r % 2 == 1 {
            order.reverse();
        }
        for d in order {
            let mut times = Vec::with_capacity(runs);
            for f in &frames {
                let (v, ns) = run(
                    &mut *dps[d],
                    case.program,
                    case.ingress,
                    f,
                    repeat,
                    &mut out,
                );
                assert_eq!(v, case.verdict, "{}: unexpected verdict", case.name);
                times.push(ns);
            }
            medians[d].push(median(times));
        }
    }
    medians
}

/// Whether case `key` is measured: all by default; `BERTH_BENCH_CASES` (comma-separated
/// keys, for profiling one path) picks some; the floor is always measured.
pub fn selected(key: &str) -> bool {
    match std::env::var("BERTH_BENCH_CASES") {
        Ok(keys) => key == "floor_ns" || keys.split(',').any(|k| k == key),
        Err(_) => true,
    }
}

/// A's and B's round medians of one case, hot or cold, and their comparison.
pub struct Ab {
    /// The median of A's round medians.
    pub a: u64,
    /// The median of B's round medians.
    pub b: u64,
    /// B/A: the median of the rounds' ratios (B's round median over A's of the same
    /// round pair).
    pub ratio: f64,
    /// The lowest and highest of the rounds' ratios.
    pub min: f64,
    pub max: f64,
}

impl Ab {
    /// The comparison of A's and B's round medians (`rounds` of two datapaths).
    pub fn of(rounds: &[Vec<u64>]) -> Self {
        let (a, b) = (&rounds[0], &rounds[1]);
        let mut ratios: Vec<f64> = a
            .iter()
            .zip(b)
            .map(|(&a, &b)| b as f64 / a.max(1) as f64)
            .collect();
        ratios.sort_unstable_by(f64::total_cmp);
        Ab {
            a: median(a.clone()),
            b: median(b.clone()),
            ratio: ratios[ratios.len() / 2],
            min: ratios[0],
            max: ratios[ratios.len() - 1],
        }
    }
}
