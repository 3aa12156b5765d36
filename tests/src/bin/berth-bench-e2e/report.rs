//! The report: medians over rounds, the table, ratios, the JSON line.

use super::*;

pub(super) struct Row {
    pub(super) mode: Mode,
    /// The topology it ran on.
    pub(super) backends: Backends,
    /// The load's address family.
    pub(super) family: Family,
    /// Why it did not run.
    pub(super) unavailable: Option<String>,
    pub(super) runs: Vec<Run>,
}

pub(super) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

impl Row {
    /// The mode and its topology, e.g. `berth-xdp@veth` (`berth-xdp@veth/v6` in IPv6).
    pub(super) fn label(&self) -> String {
        format!(
            "{}@{}{}",
            self.mode.name(),
            self.backends.name(),
            self.family.suffix()
        )
    }

    /// Median, minimum and maximum of `f` over the runs where it is a number (a run
    /// that delivered nothing has no CPU per packet).
    pub(super) fn stat(&self, f: impl Fn(&Run) -> f64) -> Option<Stat> {
        let v: Vec<f64> = self.runs.iter().map(f).filter(|v| v.is_finite()).collect();
        if v.is_empty() {
            return None;
        }
        let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        Some((median(v), lo, hi))
    }
    pub(super) fn pps(&self) -> Option<f64> {
        self.stat(|r| r.delivered_pps).map(|s| s.0)
    }
    pub(super) fn ns(&self) -> Option<f64> {
        self.stat(|r| r.gateway_ns_per_packet).map(|s| s.0)
    }
    /// (delivered pps ratio, gateway CPU ratio) against `reference`: both > 1 when this
    /// mode is better (more packets, fewer ns per packet); no CPU ratio where either
    /// delivered nothing.
    pub(super) fn ratio(&self, reference: &Row) -> Option<(f64, Option<f64>)> {
        let cpu = reference.ns().zip(self.ns()).map(|(r, s)| r / s);
        Some((self.pps()? / reference.pps()?, cpu))
    }
}

/// The references among `rows`.
fn references(rows: &[Row]) -> Vec<Mode> {
    REFERENCES
        .into_iter()
        .filter(|m| rows.iter().any(|r| r.mode == *m))
        .collect()
}

pub(super) fn table(rows: &[Row]) -> String {
    let references = references(rows);
    let mut t = String::new();
    let _ = write!(
        t,
        "{:<26} {:>9} {:>9} {:>7} {:>9} {:>6}",
        "mode", "dlv kpps", "sent kpps", "loss %", "gw ns/pkt", "gw %"
    );
    for r in &references {
        let _ = write!(t, "  {:>19}", format!("vs {}", r.name()));
    }
    t.push('\n');
    for row in rows {
        let _ = write!(t, "{:<26} ", row.label());
        if let Some(why) = row.unavailable.as_ref().filter(|_| row.runs.is_empty()) {
            let _ = writeln!(t, "{why}");
            continue;
        }
        let m = |f: fn(&Run) -> f64| row.stat(f).map(|s| s.0).unwrap_or(f64::NAN);
        let _ = write!(
            t,
            "{:>9.1} {:>9.1} {:>7.1} {:>9.0} {:>6.0}",
            m(|r| r.delivered_pps) / 1e3,
            m(|r| r.sent_pps) / 1e3,
            m(|r| r.loss) * 100.0,
            m(|r| r.gateway_ns_per_packet),
            m(|r| r.gateway_busy) * 100.0,
        );
        for &reference in &references {
            let cell = rows
                .iter()
                .find(|r| r.mode == reference)
                .and_then(|r| row.ratio(r))
                .map(|(p, c)| match c {
                    Some(c) => format!("pps {p:.2}x cpu {c:.2}x"),
                    None => format!("pps {p:.2}x cpu -"),
                })
                .unwrap_or_else(|| "-".into());
            let _ = write!(t, "  {cell:>19}");
        }
        t.push('\n');
    }
    t
}

/// Per topology and family measured under more than one load: one row per mode,
/// delivered pps and gateway CPU per load side by side.
pub(super) fn summary(sections: &[Section]) -> String {
    let mut t = String::new();
    for (backends, family) in TOPOLOGIES
        .into_iter()
        .flat_map(|b| [(b, Family::V4), (b, Family::V6)])
    {
        let group: Vec<&Section> = sections
            .iter()
            .filter(|s| s.backends == backends && s.family == family)
            .collect();
        if group.len() > 1 {
            if !t.is_empty() {
                t.push('\n');
            }
            t.push_str(&summary_of(&group));
        }
    }
    t
}

/// `summary` of one topology's sections (the same rows in each).
fn summary_of(sections: &[&Section]) -> String {
    let mut t = format!("{:<26}", "mode");
    for s in sections {
        let _ = write!(
            t,
            " {:>14} {:>14}",
            format!("{} dlv kpps", s.flows.name()),
            format!("{} gw ns/pkt", s.flows.name())
        );
    }
    t.push('\n');
    for (i, row) in sections[0].rows.iter().enumerate() {
        let _ = write!(t, "{:<26}", row.label());
        for s in sections {
            let r = &s.rows[i];
            let pps = r.pps().map_or("-".into(), |v| format!("{:.1}", v / 1e3));
            let ns = r.ns().map_or("-".into(), |v| format!("{v:.0}"));
            let _ = write!(t, " {pps:>14} {ns:>14}");
        }
        t.push('\n');
    }
    t
}

/// `nf_conntrack_max` as the netfilter modes' gateways had it.
pub(super) fn conntrack_max(sections: &[Section]) -> Option<u64> {
    sections
        .iter()
        .flat_map(|s| &s.rows)
        .filter(|r| r.mode.netfilter())
        .flat_map(|r| &r.runs)
        .filter_map(|r| r.conntrack_max)
        .max()
}

fn modes_json(rows: &[Row]) -> Vec<Value> {
    rows.iter()
        .map(|row| {
            let Some((pps, pps_lo, pps_hi)) = row.stat(|r| r.delivered_pps) else {
                return json!({
                    "mode": row.mode.name(),
                    "backends": row.backends.name(),
                    "family": row.family.name(),
                    "available": false,
                    "reason": row.unavailable,
                });
            };
            let med = |f: fn(&Run) -> f64| row.stat(f).map(|s| s.0).unwrap_or(f64::NAN);
            let mut ratios = serde_json::Map::new();
            for reference in REFERENCES {
                if let Some((p, c)) = rows
                    .iter()
                    .find(|r| r.mode == reference)
                    .and_then(|r| row.ratio(r))
                {
                    ratios.insert(format!("pps_vs_{}", reference.name()), json!(round(p, 3)));
                    if let Some(c) = c {
                        ratios.insert(format!("cpu_vs_{}", reference.name()), json!(round(c, 3)));
                    }
                }
            }
            let conntrack: Vec<f64> = row
                .runs
                .iter()
                .filter_map(|r| r.conntrack_entries)
                .map(|n| n as f64)
                .collect();
            let conntrack =
                (row.mode.netfilter() && !conntrack.is_empty()).then(|| median(conntrack).round());
            json!({
                "mode": row.mode.name(),
                "backends": row.backends.name(),
                "family": row.family.name(),
                "available": true,
                "delivered_pps": pps.round(),
                "delivered_pps_min": pps_lo.round(),
                "delivered_pps_max": pps_hi.round(),
                "sent_pps": med(|r| r.sent_pps).round(),
                "loss": round(med(|r| r.loss), 4),
                "gateway_ns_per_packet": round(med(|r| r.gateway_ns_per_packet), 1),
                "gateway_busy": round(med(|r| r.gateway_busy), 3),
                "gateway_pps_per_core": (1e9 / med(|r| r.gateway_ns_per_packet)).round(),
                "backend_ns_per_packet": round(med(|r| r.backend_ns_per_packet), 1),
                "dropped_at_gateway_ring": round(med(|r| r.ingress_drop), 4),
                "dropped_at_backend_rings": round(med(|r| r.backend_drop), 4),
                "nf_conntrack_entries_at_end": conntrack,
                "runs": row.runs.len(),
                "ratios": ratios,
            })
        })
        .collect()
}

/// The JSON line: per load, the rows of every topology and family (`backends`: its
/// name, the xdp topology's first; `family`: ipv4 or ipv6).
pub(super) fn json_line(sections: &[Section], load: Load, chart: &Path) -> Value {
    let mut loads = serde_json::Map::new();
    for s in sections {
        let f = s.flows.flows();
        let entry = loads.entry(s.flows.name()).or_insert_with(|| {
            json!({
                "what": s.flows.what(),
                "first_source_port": s.flows.first_port(),
                "source_ports": f.ports,
                "source_addresses": f.addresses,
                "tuples": f.tuples(),
                "modes": [],
            })
        });
        if let Some(modes) = entry["modes"].as_array_mut() {
            modes.extend(modes_json(&s.rows));
        }
    }
    let mut families = serde_json::Map::new();
    for s in sections {
        families.insert(
            s.family.name().into(),
            json!({"what": s.family.what(), "frame_bytes": s.family.frame_bytes() + 4}),
        );
    }
    let mut topologies = serde_json::Map::new();
    for s in sections {
        topologies.insert(
            s.backends.name().into(),
            json!({"what": s.backends.what(), "gateway_cpu_accounting": s.backends.accounting()}),
        );
    }
    json!({
        "bench": "e2e",
        "load": load.name(),
        "frame_bytes": 64,
        "backends": BACKENDS,
        "warmup_s": WARMUP.as_secs_f64(),
        "measure_s": MEASURE.as_secs_f64(),
        "repetitions": REPS,
        "statistic": "median",
        "gateway_cpu_accounting": ACCOUNTING,
        "ratios_mean": "pps_vs_X = delivered pps / X's; cpu_vs_X = X's gateway ns per packet / this mode's",
        "nf_conntrack_max": conntrack_max(sections),
        "loads": loads,
        "topologies": topologies,
        "families": families,
        "family_ratios": family_json(sections),
        "family_ratios_mean": "ipv6_over_ipv4_ns = the IPv6 rows' gateway ns per packet / the IPv4 rows' (> 1: IPv6 costs more)",
        "chart": chart.display().to_string(),
    })
}

pub(super) fn round(v: f64, digits: i32) -> f64 {
    let f = 10f64.powi(digits);
    (v * f).round() / f
}
