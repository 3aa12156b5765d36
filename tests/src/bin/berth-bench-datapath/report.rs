//! The bench's tables and JSON line.

use berth::datapath::Datapath;

use crate::{
    cases::Case,
    measure::{selected, Ab},
    COLD_RUNS, HOT_REPEAT, HOT_RUNS,
};

/// The table of every selected case's medians `(hot, cold)` (each over the floor, the
/// first case, too), and each IPv6 case beside its IPv4 twin; the JSON fields of the
/// hot medians.
pub fn table(cases: &[Case], results: &[(u64, u64)], rounds: usize) -> Vec<String> {
    let (hot_floor, cold_floor) = (results[0].0 as i64, results[0].1 as i64);
    println!("XDP datapath, ns per packet under BPF_PROG_TEST_RUN (medians of {rounds} rounds)");
    println!("  hot: repeat={HOT_REPEAT} x {HOT_RUNS} runs; cold: repeat=1 x {COLD_RUNS} runs");
    println!(
        "{:<52} {:>6} {:>7} {:>6} {:>7}",
        "case", "hot", "+floor", "cold", "+floor"
    );
    let mut headline = Vec::new();
    for (case, (hot, cold)) in cases.iter().zip(results) {
        if !selected(case.key) {
            continue;
        }
        let (hot_over, cold_over) = (*hot as i64 - hot_floor, *cold as i64 - cold_floor);
        println!(
            "{:<52} {hot:>6} {hot_over:>+7} {cold:>6} {cold_over:>+7}",
            case.name
        );
        headline.push(format!("\"{}\":{}", case.key, hot));
    }
    // Each IPv6 case beside its IPv4 twin, over the floor, measured in this run.
    let over = |key: &str| {
        let i = cases.iter().position(|c| c.key == key)?;
        let (hot, cold) = results[i];
        selected(key).then_some((hot as i64 - hot_floor, cold as i64 - cold_floor))
    };
    println!("IPv6 beside IPv4, ns over the floor (hot / cold)");
    for case in cases.iter().filter(|c| c.key.starts_with("v6_")) {
        let (Some(v6), Some(v4)) = (over(case.key), over(&case.key[3..])) else {
            continue;
        };
        println!(
            "  {:<22} IPv6 {:>+6} / {:>+6}   IPv4 {:>+6} / {:>+6}",
            &case.key[3..case.key.len() - 3],
            v6.0,
            v6.1,
            v4.0,
            v4.1
        );
    }
    headline
}

/// The counters of `dp` (`label` names it, before the lines, when there are two).
pub fn counters(dp: &Datapath, label: &str) {
    let c = dp.counters().expect("counters");
    println!(
        "{label}counters: new_flow {} redirect {} kernel_forward_no_xdp_egress {}",
        c["new_flow"], c["redirect"], c["kernel_forward_no_xdp_egress"]
    );
    println!(
        "{label}miss counters: ct_miss_midflow {} ct_miss_reply {} reply_untracked {}",
        c["ct_miss_midflow"], c["ct_miss_reply"], c["reply_untracked"]
    );
    println!(
        "{label}snat counters: snat_new_flow {} snat_port_retry {} drop_snat_ports_exhausted {}",
        c["snat_new_flow"], c["snat_port_retry"], c["drop_snat_ports_exhausted"]
    );
    // How near each program is to the verifier's limit (a change to the program moves
    // it, sometimes by far more than its size).
    let verified: Vec<String> = dp
        .verified_instructions()
        .iter()
        .filter(|(_, count)| *count >= 10_000)
        .map(|(name, count)| format!("{name} {count}"))
        .collect();
    println!(
        "{label}verified instructions (limit {}): {}",
        berth::datapath::VERIFIER_INSN_LIMIT,
        verified.join(", ")
    );
}

/// The A/B table of every selected case (`results`: hot and cold); the JSON fields of
/// B's hot medians and of the ratios.
pub fn ab_table(
    cases: &[Case],
    results: &[Option<(Ab, Ab)>],
    rounds: usize,
    loads: usize,
) -> Vec<String> {
    println!(
        "A/B: A = this build's object, B = BERTH_BENCH_AB's, {rounds} rounds each in turn \
         (A B, B A, A B, ...) over {loads} loads of both; ns (medians of round medians), \
         B/A = median of the round pairs' ratios [lowest-highest]"
    );
    println!(
        "{:<52} {:>6} {:>6} {:>19}  {:>6} {:>6} {:>19}",
        "case", "hot A", "B", "B/A", "cold A", "B", "B/A"
    );
    let mut fields = Vec::new();
    for (case, result) in cases.iter().zip(results) {
        let Some((hot, cold)) = result else {
            continue;
        };
        let cell = |ab: &Ab| format!("{:.3} [{:.3}-{:.3}]", ab.ratio, ab.min, ab.max);
        println!(
            "{:<52} {:>6} {:>6} {:>19}  {:>6} {:>6} {:>19}",
            case.name,
            hot.a,
            hot.b,
            cell(hot),
            cold.a,
            cold.b,
            cell(cold)
        );
        let name = case.key.trim_end_matches("_ns");
        fields.push(format!("\"b_{}\":{}", case.key, hot.b));
        for (which, ab) in [("hot", hot), ("cold", cold)] {
            fields.push(format!(
                "\"ab_{name}_{which}\":[{:.4},{:.4},{:.4}]",
                ab.ratio, ab.min, ab.max
            ));
        }
    }
    fields
}
