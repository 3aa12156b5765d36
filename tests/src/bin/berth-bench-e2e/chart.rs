//! The chart: a hand-written SVG of delivered packets/s and gateway CPU per packet.

use super::*;

pub(super) fn color(mode: Mode) -> &'static str {
    match mode {
        Mode::Routing => "#9ca3af",
        Mode::Berth => "#2563eb",
        Mode::BerthKernel => "#60a5fa",
        Mode::IptablesLegacy => "#f59e0b",
        Mode::IptablesNft => "#ef4444",
        Mode::Ipvs => "#a855f7",
        Mode::Nftables => "#10b981",
        Mode::BerthSnat => "#1e3a8a",
        Mode::IptablesMasq => "#b91c1c",
    }
}

/// A round axis step giving about five ticks up to `max`.
pub(super) fn nice_step(max: f64) -> f64 {
    let raw = (max / 5.0).max(f64::MIN_POSITIVE);
    let mag = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * mag)
}

pub(super) fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// Median, minimum and maximum.
pub(super) type Stat = (f64, f64, f64);

pub(super) struct Panel<'a> {
    pub(super) x: f64,
    /// Top of the plot area.
    pub(super) top: f64,
    pub(super) title: &'a str,
    pub(super) unit: &'a str,
    /// (median, min, max) per row, in the panel's unit.
    pub(super) value: &'a dyn Fn(&Row) -> Option<Stat>,
    pub(super) decimals: usize,
    /// Two short lines written at the foot of a bar.
    pub(super) label: &'a dyn Fn(&Row) -> Option<[String; 2]>,
}

/// A gateway busier than this share is taken as saturated (SCHED_FIFO threads get at
/// most 95% of a CPU).
pub(super) const UNSATURATED: f64 = 0.85;

pub(super) const PLOT_H: f64 = 250.0;
pub(super) const PLOT_W: f64 = 420.0;
/// Where the first load's section starts, and the height of one.
pub(super) const SECTIONS_TOP: f64 = 72.0;
pub(super) const SECTION_H: f64 = 420.0;
/// From a section's top to its plots' top (its title and headline lines above).
pub(super) const SECTION_HEAD: f64 = 104.0;

pub(super) fn panel(svg: &mut String, rows: &[Row], p: &Panel) {
    let values: Vec<Option<Stat>> = rows.iter().map(|r| (p.value)(r)).collect();
    let max = values
        .iter()
        .flatten()
        .map(|v| v.2)
        .fold(0.0, f64::max)
        .max(1e-9);
    let step = nice_step(max * 1.1);
    let top = (max * 1.1 / step).ceil() * step;
    let y = |v: f64| p.top + PLOT_H - v / top * PLOT_H;
    let bottom = p.top + PLOT_H;
    let _ = writeln!(
        svg,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle" font-size="15" font-weight="bold">{}</text>"#,
        p.x + PLOT_W / 2.0,
        p.top - 14.0,
        escape(p.title)
    );
    let mut tick = 0.0;
    while tick <= top + step / 2.0 {
        let ty = y(tick);
        let _ = writeln!(
            svg,
            r##"<line x1="{:.1}" y1="{ty:.1}" x2="{:.1}" y2="{ty:.1}" stroke="#e5e7eb"/><text x="{:.1}" y="{:.1}" text-anchor="end" font-size="11" fill="#374151">{}</text>"##,
            p.x,
            p.x + PLOT_W,
            p.x - 6.0,
            ty + 4.0,
            fmt_tick(tick, step)
        );
        tick += step;
    }
    let _ = writeln!(
        svg,
        r##"<line x1="{x:.1}" y1="{:.1}" x2="{x:.1}" y2="{bottom}" stroke="#111827"/><line x1="{x:.1}" y1="{bottom}" x2="{:.1}" y2="{bottom}" stroke="#111827"/>"##,
        p.top,
        p.x + PLOT_W,
        x = p.x
    );
    let (cx, cy) = (p.x - 48.0, p.top + PLOT_H / 2.0);
    let _ = writeln!(
        svg,
        r##"<text x="{cx:.1}" y="{cy:.1}" transform="rotate(-90 {cx:.1} {cy:.1})" text-anchor="middle" font-size="12" fill="#374151">{}</text>"##,
        escape(p.unit)
    );
    let slot = PLOT_W / rows.len() as f64;
    let bar = slot * 0.62;
    for (i, (row, v)) in rows.iter().zip(&values).enumerate() {
        let mid = p.x + slot * (i as f64 + 0.5);
        let name = row.mode.name();
        let (first, second) = name.split_once('-').unwrap_or((name, ""));
        let _ = writeln!(
            svg,
            r##"<text x="{mid:.1}" y="{:.1}" text-anchor="middle" font-size="12" fill="#111827">{first}</text><text x="{mid:.1}" y="{:.1}" text-anchor="middle" font-size="12" fill="#111827">{second}</text>"##,
            bottom + 16.0,
            bottom + 30.0
        );
        let Some((med, lo, hi)) = *v else {
            let _ = writeln!(
                svg,
                r##"<rect x="{:.1}" y="{:.1}" width="{bar:.1}" height="60" fill="none" stroke="#9ca3af" stroke-dasharray="4 3"/><text x="{mid:.1}" y="{:.1}" text-anchor="middle" font-size="11" fill="#6b7280">n/a</text>"##,
                mid - bar / 2.0,
                bottom - 60.0,
                bottom - 34.0
            );
            continue;
        };
        let _ = writeln!(
            svg,
            r#"<rect x="{:.1}" y="{:.1}" width="{bar:.1}" height="{:.1}" fill="{}"><title>{name}: {med:.*} {}</title></rect>"#,
            mid - bar / 2.0,
            y(med),
            bottom - y(med),
            color(row.mode),
            p.decimals,
            escape(p.unit)
        );
        if hi > lo {
            let _ = writeln!(
                svg,
                r##"<path d="M{mid:.1} {:.1}V{:.1}M{:.1} {:.1}h8M{:.1} {:.1}h8" stroke="#111827" stroke-width="1.2"/>"##,
                y(hi),
                y(lo),
                mid - 4.0,
                y(hi),
                mid - 4.0,
                y(lo)
            );
        }
        let _ = writeln!(
            svg,
            r##"<text x="{mid:.1}" y="{:.1}" text-anchor="middle" font-size="12" font-weight="bold" fill="#111827">{med:.*}</text>"##,
            y(hi.max(med)) - 6.0,
            p.decimals
        );
        if let Some([a, b]) = (p.label)(row).filter(|_| bottom - y(med) > 34.0) {
            let _ = writeln!(
                svg,
                r##"<text x="{mid:.1}" y="{:.1}" text-anchor="middle" font-size="10" fill="white">{}</text><text x="{mid:.1}" y="{:.1}" text-anchor="middle" font-size="10" fill="white">{}</text>"##,
                bottom - 18.0,
                escape(&a),
                bottom - 6.0,
                escape(&b)
            );
        }
    }
}

pub(super) fn fmt_tick(v: f64, step: f64) -> String {
    if step.fract() == 0.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

pub(super) fn chart(sections: &[Section], load: Load, headlines: &[Vec<String>]) -> String {
    let w = 1040.0;
    let notes = notes(sections);
    let h = SECTIONS_TOP + SECTION_H * sections.len() as f64 + 40.0 + 16.0 * notes.len() as f64;
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="DejaVu Sans, Helvetica, Arial, sans-serif">
<rect width="100%" height="100%" fill="white"/>
<text x="{:.1}" y="30" text-anchor="middle" font-size="20" font-weight="bold" fill="#111827">One gateway, the same UDP loads: Berth's XDP datapath vs kernel NAT</text>
<text x="{:.1}" y="54" text-anchor="middle" font-size="13" fill="#374151">{} UDP frames ({} load), client → gateway → {BACKENDS} backends over veth; median of {REPS} runs of {}s (whiskers: min–max)</text>"##,
        w / 2.0,
        w / 2.0,
        frame_sizes(sections),
        load.name(),
        MEASURE.as_secs(),
    );
    for (i, (section, headline)) in sections.iter().zip(headlines).enumerate() {
        let top = SECTIONS_TOP + SECTION_H * i as f64;
        let _ = writeln!(
            svg,
            r##"<line x1="20" y1="{top:.1}" x2="{:.1}" y2="{top:.1}" stroke="#d1d5db"/><text x="{:.1}" y="{:.1}" text-anchor="middle" font-size="17" font-weight="bold" fill="#111827">Load {}: {} (backends: {}{})</text>"##,
            w - 20.0,
            w / 2.0,
            top + 24.0,
            i + 1,
            escape(&section.flows.title()),
            section.backends.name(),
            if section.family == Family::V6 {
                ", IPv6"
            } else {
                ""
            }
        );
        for (j, line) in headline.iter().enumerate() {
            let _ = writeln!(
                svg,
                r##"<text x="{:.1}" y="{:.1}" text-anchor="middle" font-size="13" font-weight="bold" fill="#1d4ed8">{}</text>"##,
                w / 2.0,
                top + 46.0 + 18.0 * j as f64,
                escape(line)
            );
        }
        section_panels(&mut svg, &section.rows, top + SECTION_HEAD);
    }
    let _ = writeln!(
        svg,
        r##"<text x="{:.1}" y="{:.1}" text-anchor="middle" font-size="11" fill="#4b5563">Gateway CPU = run time of its threaded-NAPI kernel thread (receive, forwarding/NAT, transmit; own CPU) ÷ delivered packets; busy = its share of that CPU.</text>"##,
        w / 2.0,
        h - 20.0 - 16.0 * notes.len() as f64,
    );
    for (i, note) in notes.iter().enumerate() {
        let _ = writeln!(
            svg,
            r##"<text x="{:.1}" y="{:.1}" text-anchor="middle" font-size="11" fill="#4b5563">{}</text>"##,
            w / 2.0,
            h - 20.0 - 16.0 * (notes.len() - 1 - i) as f64,
            escape(note)
        );
    }
    svg.push_str("</svg>\n");
    svg
}

/// A mode that delivered less than this share of its load's best mode has collapsed:
/// its CPU per packet (CPU spent on packets it dropped) is left out of the chart.
pub(super) const COLLAPSED: f64 = 0.05;

/// Whether `row` collapsed under its load (see `COLLAPSED`).
fn collapsed(rows: &[Row], row: &Row) -> bool {
    let best = rows.iter().filter_map(Row::pps).fold(0.0, f64::max);
    row.pps().is_some_and(|p| p < best * COLLAPSED)
}

/// The chart's foot notes, one line each.
fn notes(sections: &[Section]) -> Vec<String> {
    let mut notes: Vec<String> = Vec::new();
    for r in sections.iter().flat_map(|s| &s.rows) {
        if let Some(why) = r.unavailable.as_ref().filter(|_| r.runs.is_empty()) {
            let note = format!("{}: {why}", r.label());
            if !notes.contains(&note) {
                notes.push(note);
            }
        }
    }
    let no_napi: Vec<&str> = TOPOLOGIES
        .into_iter()
        .filter(|b| !b.napi() && sections.iter().any(|s| s.backends == *b))
        .map(Backends::name)
        .collect();
    if !no_napi.is_empty() {
        notes.push(format!(
            "backends {}: their veths have no NAPI; their receive and TC sink run in the gateway's thread, counted in its CPU",
            no_napi.join(", ")
        ));
    }
    for section in sections {
        let names = |keep: &dyn Fn(&Row) -> bool| -> Vec<&str> {
            section
                .rows
                .iter()
                .filter(|r| keep(r))
                .map(|r| r.mode.name())
                .collect()
        };
        let down = names(&|r| collapsed(&section.rows, r));
        let unsaturated = names(&|r| {
            !collapsed(&section.rows, r)
                && r.stat(|x| x.gateway_busy)
                    .is_some_and(|b| b.0 < UNSATURATED)
        });
        if !unsaturated.is_empty() {
            let limit = if section.backends.napi() {
                "CPU 0, shared by the generator and the backends"
            } else {
                "CPU 0, the generator's"
            };
            notes.push(format!(
                "{} ({}): gateway not saturated ({limit}, was the limit)",
                unsaturated.join(", "),
                section.name()
            ));
        }
        if !down.is_empty() {
            notes.push(format!(
                "{} ({}): delivered under {:.0}% of the best mode's packets; CPU per packet not drawn",
                down.join(", "),
                section.name(),
                COLLAPSED * 100.0
            ));
        }
    }
    notes
}

/// One load's two panels, delivered pps and gateway CPU per packet, plots at `top`.
fn section_panels(svg: &mut String, rows: &[Row], top: f64) {
    panel(
        svg,
        rows,
        &Panel {
            x: 80.0,
            top,
            title: "Delivered packets per second (higher is better)",
            unit: "kpps at the backends",
            value: &|r: &Row| {
                r.stat(|x| x.delivered_pps)
                    .map(|(m, lo, hi)| (m / 1e3, lo / 1e3, hi / 1e3))
            },
            decimals: 0,
            label: &|r: &Row| {
                r.stat(|x| x.gateway_busy)
                    .map(|(b, _, _)| ["busy".into(), format!("{:.0}%", b * 100.0)])
            },
        },
    );
    panel(
        svg,
        rows,
        &Panel {
            x: 590.0,
            top,
            title: "Gateway CPU per packet (lower is better)",
            unit: "ns of gateway CPU per delivered packet",
            value: &|r: &Row| {
                r.stat(|x| x.gateway_ns_per_packet)
                    .filter(|_| !collapsed(rows, r))
            },
            decimals: 0,
            label: &|_| None,
        },
    );
}

/// One line per `HEADLINES` comparison that ran: Berth against the kernel NAT
/// references, e.g. "Berth vs iptables-legacy, iptables-nft, nftables: 3.4x the packets
/// per second, 4.4-4.5x less gateway CPU per packet"; where the backends take no XDP
/// frames, Berth's gateway CPU per packet against plain routing's too.
/// In IPv6, Berth's gateway CPU per packet against its IPv4 figure (of `sections`).
pub(super) fn headline(section: &Section, sections: &[Section]) -> Vec<String> {
    let rows = &section.rows;
    let mut lines: Vec<String> = HEADLINES
        .iter()
        .filter_map(|&(mode, label, references)| comparison(rows, mode, label, references))
        .collect();
    if section.backends != Backends::Xdp {
        lines.extend(against_routing(rows));
    }
    lines.extend(family_headline(section, sections));
    lines
}

/// Berth's gateway CPU per packet against plain routing's.
fn against_routing(rows: &[Row]) -> Option<String> {
    let ns = |m: Mode| rows.iter().find(|r| r.mode == m).and_then(Row::ns);
    let (berth, routing) = (ns(Mode::Berth)?, ns(Mode::Routing)?);
    Some(format!(
        "Berth vs routing: {berth:.0} against {routing:.0} ns of gateway CPU per packet ({:.2}x routing's)",
        berth / routing
    ))
}

fn comparison(rows: &[Row], mode: Mode, label: &str, references: &[Mode]) -> Option<String> {
    let find = |m: Mode| rows.iter().find(|r| r.mode == m);
    let berth = find(mode)?;
    let (mut names, mut pps, mut cpu) = (Vec::new(), Vec::new(), Vec::new());
    for &m in references {
        if let Some((p, c)) = find(m).and_then(|r| berth.ratio(r)) {
            names.push(m.name());
            pps.push(p);
            cpu.extend(c);
        }
    }
    if names.is_empty() {
        return None;
    }
    let range = |v: &[f64]| {
        let lo = format!("{:.1}", v.iter().copied().fold(f64::INFINITY, f64::min));
        let hi = format!("{:.1}", v.iter().copied().fold(f64::NEG_INFINITY, f64::max));
        if lo == hi {
            format!("{lo}x")
        } else {
            format!("{lo}-{hi}x")
        }
    };
    let cpu = if cpu.is_empty() {
        "no CPU per packet (nothing delivered)".to_string()
    } else {
        format!("{} less gateway CPU per packet", range(&cpu))
    };
    Some(format!(
        "{label} vs {}: {} the packets per second, {cpu}",
        names.join(", "),
        range(&pps),
    ))
}

pub(super) fn chart_path() -> PathBuf {
    let exe = std::env::current_exe().expect("own path");
    // target/<profile>/berth-bench-e2e → target/bench/e2e.svg
    let target = exe
        .parent()
        .and_then(Path::parent)
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("target"));
    target.join("bench").join("e2e.svg")
}
