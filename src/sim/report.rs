//! The self-contained HTML report of `kpssh sim --report`: inline SVG, no scripts, no
//! external resources. A per-host membership timeline (warm pool vs joined), the pool's
//! state counts over time, and the cost curve against always-attached.

use std::fmt::Write;

use super::run::{STATES, Summary, Timeline};

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn color(state: &str) -> &'static str {
    match state {
        "Available" => "#9ecae1",
        "Claimed" => "#fdae6b",
        "InUse" => "#31a354",
        "Leaving" => "#e6550d",
        "Unhealthy" => "#de2d26",
        "Maintenance" => "#756bb1",
        _ => "#d9d9d9",
    }
}

const W: f64 = 1000.0;
const LEFT: f64 = 110.0;

fn x(t: u64, duration: u64) -> f64 {
    LEFT + (W - LEFT - 10.0) * t as f64 / duration.max(1) as f64
}

fn gantt(tl: &Timeline, out: &mut String) {
    let row = if tl.hosts.len() > 400 { 1.0 } else { 3.0 };
    let h = row * tl.hosts.len() as f64 + 30.0;
    let _ = write!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{h}" viewBox="0 0 {W} {h}">"#
    );
    let mut last_class = "";
    for (i, (name, class, changes)) in tl.hosts.iter().enumerate() {
        let y = 10.0 + row * i as f64;
        if class != last_class {
            last_class = class;
            let _ = write!(
                out,
                r#"<text x="2" y="{}" font-size="10">{}</text>"#,
                y + 8.0,
                esc(class)
            );
        }
        for (j, (t, state)) in changes.iter().enumerate() {
            let end = changes.get(j + 1).map_or(tl.duration, |c| c.0);
            let (x0, x1) = (x(*t, tl.duration), x(end, tl.duration));
            let _ = write!(
                out,
                r#"<rect x="{x0:.1}" y="{y:.1}" width="{:.1}" height="{row}" fill="{}"><title>{} {}</title></rect>"#,
                (x1 - x0).max(0.3),
                color(state),
                esc(name),
                esc(state)
            );
        }
    }
    axis(out, h - 12.0, tl.duration);
    out.push_str("</svg>");
}

fn axis(out: &mut String, y: f64, duration: u64) {
    let hours = (duration / 3600).max(1);
    let every = if hours > 12 { 3 } else { 1 };
    for hr in (0..=hours).step_by(every as usize) {
        let px = x(hr * 3600, duration);
        let _ = write!(
            out,
            r#"<text x="{px:.1}" y="{}" font-size="9" text-anchor="middle">{hr}h</text>"#,
            y + 10.0
        );
    }
}

/// A named, coloured series of `(seconds, value)` points.
type Series<'a> = (&'a str, &'a str, Vec<(u64, f64)>);

fn lines(out: &mut String, series: &[Series<'_>], duration: u64, unit: &str) {
    let h = 220.0;
    let top = 10.0;
    let bottom = h - 30.0;
    let max = series
        .iter()
        .flat_map(|s| s.2.iter().map(|p| p.1))
        .fold(0.0_f64, f64::max)
        .max(1e-9);
    let _ = write!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{h}" viewBox="0 0 {W} {h}">"#
    );
    let _ = write!(
        out,
        r#"<text x="2" y="{}" font-size="10">{max:.1} {}</text><text x="2" y="{bottom}" font-size="10">0</text>"#,
        top + 8.0,
        esc(unit)
    );
    for (k, (label, colour, pts)) in series.iter().enumerate() {
        let mut d = String::new();
        for (i, (t, v)) in pts.iter().enumerate() {
            let px = x(*t, duration);
            let py = bottom - (bottom - top) * v / max;
            let _ = write!(d, "{}{px:.1},{py:.1} ", if i == 0 { "M" } else { "L" });
        }
        let _ = write!(
            out,
            r#"<path d="{d}" fill="none" stroke="{colour}" stroke-width="1.5"/><text x="{}" y="{}" font-size="10" fill="{colour}">{}</text>"#,
            LEFT + 10.0 + 130.0 * k as f64,
            h - 2.0,
            esc(label)
        );
    }
    axis(out, bottom, duration);
    out.push_str("</svg>");
}

/// The whole page.
pub fn html(summary: &Summary, tl: &Timeline) -> String {
    let mut out = String::new();
    let _ = write!(
        out,
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>kpssh sim: {}</title>\
         <style>body{{font-family:sans-serif;margin:20px}}td,th{{padding:2px 10px;text-align:left}}\
         .v{{color:#b00}}</style></head><body>",
        esc(&summary.scenario)
    );
    let _ = write!(
        out,
        "<h1>kpssh sim: {}</h1><p>seed {} · {} hosts · {} virtual hours · trace {}</p>",
        esc(&summary.scenario),
        summary.seed,
        summary.hosts,
        summary.virtual_hours,
        &summary.trace_hash
    );
    out.push_str("<table>");
    let rows = [
        ("cost (members only)", format!("{:.2}", summary.cost)),
        (
            "cost if always attached",
            format!("{:.2}", summary.always_attached_cost),
        ),
        (
            "attached vCPU-hours",
            format!(
                "{:.1} of {:.1}",
                summary.attached_vcpu_hours, summary.always_attached_vcpu_hours
            ),
        ),
        (
            "joins warm / cold",
            format!("{} / {}", summary.joins_warm, summary.joins_cold),
        ),
        ("leaves", summary.leaves.to_string()),
        ("zombies cleaned", summary.zombies_cleaned.to_string()),
        (
            "NodeClaim → running p50/p95/p99 (s)",
            format!(
                "{:.0} / {:.0} / {:.0}",
                summary.pending_to_running_seconds.p50,
                summary.pending_to_running_seconds.p95,
                summary.pending_to_running_seconds.p99
            ),
        ),
        (
            "API writes (per host-hour)",
            format!(
                "{} ({:.2})",
                summary.api_writes, summary.api_writes_per_host_hour
            ),
        ),
        ("SSH sessions", summary.ssh_sessions_opened.to_string()),
        (
            "faults injected",
            summary
                .faults_injected
                .iter()
                .map(|(k, v)| format!("{k} {v}"))
                .collect::<Vec<_>>()
                .join(", "),
        ),
        (
            "invariant violations",
            summary.invariant_violations.len().to_string(),
        ),
    ];
    for (k, v) in rows {
        let _ = write!(out, "<tr><th>{}</th><td>{}</td></tr>", esc(k), esc(&v));
    }
    out.push_str("</table>");
    for v in &summary.invariant_violations {
        let _ = write!(
            out,
            "<p class=\"v\">{} at {}s: {}</p>",
            esc(&v.invariant),
            v.at_seconds,
            esc(&v.message)
        );
    }
    out.push_str("<h2>Cost: members only vs always attached</h2>");
    let cost: Vec<(u64, f64)> = tl.samples.iter().map(|s| (s.t, s.cost)).collect();
    let always: Vec<(u64, f64)> = tl
        .samples
        .iter()
        .map(|s| (s.t, s.always_attached_cost))
        .collect();
    lines(
        &mut out,
        &[
            ("kpssh", "#31a354", cost),
            ("always attached", "#636363", always),
        ],
        tl.duration,
        "cumulative cost",
    );
    out.push_str("<h2>Pool state counts</h2>");
    let series: Vec<Series<'_>> = STATES
        .iter()
        .enumerate()
        .map(|(i, s)| {
            (
                s.as_str(),
                color(s.as_str()),
                tl.samples
                    .iter()
                    .map(|x| (x.t, f64::from(x.counts[i])))
                    .collect(),
            )
        })
        .collect();
    lines(&mut out, &series, tl.duration, "hosts");
    out.push_str("<h2>Membership per host</h2><p>");
    for s in STATES {
        let _ = write!(
            out,
            "<span style=\"background:{};padding:0 6px;margin-right:4px\">{}</span>",
            color(s.as_str()),
            s.as_str()
        );
    }
    out.push_str(" (Available = warm pool, InUse = joined)</p>");
    gantt(tl, &mut out);
    out.push_str("</body></html>\n");
    out
}
