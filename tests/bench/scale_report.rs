//! The scale part of the report: the drivers and objects curves and the start-up, as Markdown
//! tables, and the checks of the scale targets (`docs/design.md#targets`) they decide.

use std::fmt::Write as _;

use crate::report::Check;
use crate::scale::{
    DriverPoint, ObjectPoint, ScaleResults, StartupSample, bytes_per_object, startup_median,
};
use crate::scenario::Contender;
use crate::support::RequestKind;

/// Target: idle RSS at start-up scale, hub / fleet, at most (`docs/design.md#targets`).
const IDLE_RSS_RATIO: f64 = 0.05;
/// Target: idle RSS at start-up scale, at most (MiB).
const IDLE_RSS_MIB: f64 = 250.0;
/// Target: start-up to synced and idle, hub / fleet, at most.
const STARTUP_RATIO: f64 = 0.5;
/// Target: idle CPU of one hub with the most drivers, over as many sidecars, at most.
const IDLE_CPU_RATIO: f64 = 0.05;

fn opt(v: Option<f64>, digits: usize) -> String {
    v.map_or("—".into(), |x| format!("{x:.digits$}"))
}

fn ratio(h: Option<f64>, f: Option<f64>) -> Option<f64> {
    match (h, f) {
        (Some(h), Some(f)) if f > 0.0 => Some(h / f),
        _ => None,
    }
}

fn show_ratio(r: Option<f64>) -> String {
    r.map_or("—".into(), |r| format!("{r:.3}×"))
}

/// The driver counts of the drivers curve, ascending, each once.
fn driver_counts(r: &ScaleResults) -> Vec<usize> {
    let mut counts: Vec<usize> = r
        .drivers
        .values()
        .flat_map(|v| v.iter().map(|p| p.drivers))
        .collect();
    counts.sort_unstable();
    counts.dedup();
    counts
}

fn point(r: &ScaleResults, c: Contender, drivers: usize) -> Option<&DriverPoint> {
    r.drivers.get(&c)?.iter().find(|p| p.drivers == drivers)
}

/// The Done-when checks the scale configurations decide.
pub(crate) fn checks(r: &ScaleResults) -> Vec<Check> {
    let mut out = Vec::new();
    let (vas, attached, drivers) = r.startup_size;
    let hub = r.startup.get(&Contender::Hub).map(|s| startup_median(s));
    let fleet = r.startup.get(&Contender::Fleet).map(|s| startup_median(s));
    if let (Some(h), Some(f)) = (&hub, &fleet) {
        let rss = ratio(Some(h.idle_rss), Some(f.idle_rss));
        out.push(Check {
            what: format!(
                "startup: idle RSS with {vas} VAs + {vas} PVs, {drivers} drivers, hub / fleet"
            ),
            measured: format!(
                "{:.1} / {:.1} MiB = {}",
                h.idle_rss,
                f.idle_rss,
                show_ratio(rss)
            ),
            threshold: format!("≤ {IDLE_RSS_RATIO}× and ≤ {IDLE_RSS_MIB} MiB"),
            pass: rss.map(|x| x <= IDLE_RSS_RATIO && h.idle_rss <= IDLE_RSS_MIB),
        });
        let t = ratio(h.synced_idle, f.synced_idle);
        out.push(Check {
            what: format!(
                "startup: start to every driver synced and idle ({attached} attached VAs), hub / fleet"
            ),
            measured: format!(
                "{} / {} s = {}",
                opt(h.synced_idle, 1),
                opt(f.synced_idle, 1),
                show_ratio(t)
            ),
            threshold: format!("≤ {STARTUP_RATIO}×"),
            pass: t.map(|x| x <= STARTUP_RATIO),
        });
        out.push(Check {
            what: "startup: ControllerPublish for volumes already attached, hub (fleet)".into(),
            measured: format!("{} ({})", h.publishes, f.publishes),
            threshold: "hub ≤ fleet".into(),
            pass: Some(h.publishes <= f.publishes),
        });
    }
    let most = r
        .drivers
        .get(&Contender::Hub)
        .and_then(|p| p.iter().map(|p| p.drivers).max());
    if let Some(n) = most
        && let (Some(h), Some(f)) = (point(r, Contender::Hub, n), point(r, Contender::Fleet, n))
    {
        let fleet_label = if f.scaled {
            format!("10 sidecars × {}", n / 10)
        } else {
            format!("{n} sidecars")
        };
        let cpu = ratio(Some(h.idle_cpu_millicores), Some(f.idle_cpu_millicores));
        out.push(Check {
            what: format!("{n} drivers: idle CPU, hub / {fleet_label}"),
            measured: format!(
                "{:.1} / {:.1} millicores = {}",
                h.idle_cpu_millicores,
                f.idle_cpu_millicores,
                show_ratio(cpu)
            ),
            threshold: format!("≤ {IDLE_CPU_RATIO}×"),
            pass: cpu.map(|x| x <= IDLE_CPU_RATIO),
        });
        out.push(Check {
            what: format!("{n} drivers: Lease writes per minute, hub / {fleet_label}"),
            measured: format!(
                "{:.0} / {:.0}",
                h.lease_writes_per_min, f.lease_writes_per_min
            ),
            threshold: "hub ≤ fleet".into(),
            pass: Some(h.lease_writes_per_min <= f.lease_writes_per_min),
        });
    }
    out
}

fn requests_line(map: &std::collections::BTreeMap<RequestKind, f64>) -> String {
    let parts: Vec<String> = map
        .iter()
        .filter(|(_, v)| **v > 0.0)
        .map(|(k, v)| format!("{k} {v:.0}"))
        .collect();
    if parts.is_empty() {
        "—".into()
    } else {
        parts.join("<br>")
    }
}

fn startup_row(md: &mut String, c: Contender, drivers: usize, s: &StartupSample) {
    let lists = s
        .requests
        .iter()
        .filter(|(k, _)| k.verb == "LIST")
        .fold(0.0, |sum, (_, v)| sum + v);
    let _ = writeln!(
        md,
        "| {} | {} | {} | {:.1} | {:.0} | {:.0} | {} | {} | {:.1} | {:.1} |",
        c.label(drivers),
        s.processes,
        opt(s.synced_idle, 1),
        s.startup_cpu,
        lists,
        s.watches,
        requests_line(&s.requests),
        s.publishes,
        s.idle_rss,
        s.idle_cpu_millicores,
    );
}

/// The scale section of the report.
pub(crate) fn render(r: &ScaleResults, checks: &[Check]) -> String {
    let mut md = String::new();
    if r.drivers.is_empty() && r.objects.is_empty() && r.startup.is_empty() {
        // None of the scale configurations ran (BENCH_CONFIGS): no empty section.
        return md;
    }
    let _ = writeln!(md, "\n## Scale\n");
    if !r.drivers.is_empty() {
        let _ = writeln!(
            md,
            "### Drivers\n\nOne hub serving N drivers against N Go sidecars; the seed flags. Idle: {:.0} s after \
             the warm-up (one attached VA per driver); CPU in millicores (CPU-ms per second); Lease writes per \
             minute from a watch of the run's Lease namespace (the contender's Leases only), all \
             requests per minute from the API server's counters. Load: {} VAs per driver at once.\n",
            r.idle_window.as_secs_f64(),
            r.load
        );
        let _ = writeln!(
            md,
            "| drivers | contender | processes | idle RSS (MiB) | idle CPU (m) | Lease writes/min | requests/min | VAs/s | p50 (s) | p99 (s) | dup. publishes |\n\
             |---|---|---|---|---|---|---|---|---|---|---|"
        );
        for n in driver_counts(r) {
            for c in [Contender::Fleet, Contender::Hub] {
                let Some(p) = point(r, c, n) else { continue };
                let _ = writeln!(
                    md,
                    "| {n} | {}{} | {} | {:.1} | {:.1} | {:.0} | {:.0} | {} | {} | {} | {} |",
                    c.label(n),
                    if p.scaled {
                        " (10 ran idle; × N/10)"
                    } else {
                        ""
                    },
                    p.processes,
                    p.idle_rss,
                    p.idle_cpu_millicores,
                    p.lease_writes_per_min,
                    p.requests_per_min,
                    opt(p.throughput, 1),
                    opt(p.p50, 2),
                    opt(p.p99, 2),
                    p.duplicate_publishes.map_or("—".into(), |d| d.to_string()),
                );
            }
            if let (Some(h), Some(f)) = (point(r, Contender::Hub, n), point(r, Contender::Fleet, n))
            {
                let _ = writeln!(
                    md,
                    "| {n} | hub / fleet | | {} | {} | {} | {} | {} | {} | {} | |",
                    show_ratio(ratio(Some(h.idle_rss), Some(f.idle_rss))),
                    show_ratio(ratio(
                        Some(h.idle_cpu_millicores),
                        Some(f.idle_cpu_millicores)
                    )),
                    show_ratio(ratio(
                        Some(h.lease_writes_per_min),
                        Some(f.lease_writes_per_min)
                    )),
                    show_ratio(ratio(Some(h.requests_per_min), Some(f.requests_per_min))),
                    show_ratio(ratio(h.throughput, f.throughput)),
                    show_ratio(ratio(h.p50, f.p50)),
                    show_ratio(ratio(h.p99, f.p99)),
                );
            }
        }
    }
    for (c, points) in &r.drivers {
        for p in points.iter().filter(|p| p.lease_losses > 0) {
            let _ = writeln!(
                md,
                "\n{} with {} drivers lost a Lease {} times (a process that loses one exits, and \
                 was started again a second later, as the kubelet restarts a container).",
                c.label(p.drivers),
                p.drivers,
                p.lease_losses
            );
        }
    }
    if !r.drivers.is_empty() {
        // The control plane during each idle window of the drivers curve.
        let mut rows = Vec::new();
        for (contender, points) in &r.drivers {
            for p in points {
                let mut label = contender.label(p.drivers);
                if p.scaled {
                    label.push_str(&format!(" (×{} of 10)", p.drivers / 10));
                }
                rows.push((p.drivers, label, p.plane.clone()));
            }
        }
        rows.sort_by_key(|(n, ..)| *n);
        let mut sizes: Vec<usize> = rows.iter().map(|(n, ..)| *n).collect();
        sizes.dedup();
        let _ = writeln!(
            md,
            "\n### The control plane while idle\n\nEach idle window of the drivers curve, on kube-apiserver and etcd \
             (as in the configurations' control-plane tables; a scaled fleet's figures are 10 sidecars' times N / 10)."
        );
        for n in sizes {
            let per: Vec<(String, crate::control_plane::Cost)> = rows
                .iter()
                .filter(|(m, ..)| *m == n)
                .map(|(_, label, cost)| (label.clone(), cost.clone()))
                .collect();
            md.push_str(&crate::control_plane::table(
                &format!("**{n} drivers**"),
                &per,
            ));
        }
        let _ = writeln!(
            md,
            "\n### Periodic requests while idle\n\nWhat each contender asked of the API server in its \
             {:.0} s idle window, from the API server's audit log (the attachers' identity only, so \
             none of the benchmark's own requests), and its drivers' ListVolumes calls, per driver and \
             minute. The watches' caches resync in memory: no request.\n",
            r.idle_window.as_secs_f64()
        );
        for n in driver_counts(r) {
            if let (Some(h), Some(f)) = (point(r, Contender::Hub, n), point(r, Contender::Fleet, n))
            {
                let scaled = if f.scaled {
                    " (the Go figures from 10 sidecars)"
                } else {
                    ""
                };
                md.push_str(&crate::periodic::table(
                    &format!("**{n} drivers**{scaled}"),
                    &f.periodic,
                    &h.periodic,
                ));
            }
        }
    }
    if !r.objects.is_empty() {
        let _ = writeln!(
            md,
            "\n### Objects\n\nOne driver: one hub against one Go sidecar, idle, with extra VAs and as many PVs (of a \
             driver nobody serves) in the cluster. Bytes per object: RSS over the run without extra objects, \
             divided by the extra VAs + PVs.\n"
        );
        let _ = writeln!(
            md,
            "| extra VAs + PVs | hub RSS (MiB) | hub peak RSS (MiB) | hub bytes/object | Go sidecar RSS (MiB) | Go peak RSS (MiB) | Go bytes/object | hub / Go (RSS) | hub / Go (bytes/object) |\n\
             |---|---|---|---|---|---|---|---|---|"
        );
        let hub = r.objects.get(&Contender::Hub).cloned().unwrap_or_default();
        let go = r
            .objects
            .get(&Contender::Fleet)
            .cloned()
            .unwrap_or_default();
        let base = |v: &[ObjectPoint]| v.first().cloned();
        for (i, h) in hub.iter().enumerate() {
            let g = go.get(i);
            let hb = base(&hub).and_then(|b| bytes_per_object(&b, h));
            let gb = g.and_then(|g| base(&go).and_then(|b| bytes_per_object(&b, g)));
            let _ = writeln!(
                md,
                "| {} + {} | {:.1} | {:.1} | {} | {} | {} | {} | {} | {} |",
                h.pairs,
                h.pairs,
                h.idle_rss,
                h.peak_rss,
                opt(hb, 0),
                opt(g.map(|g| g.idle_rss), 1),
                opt(g.map(|g| g.peak_rss), 1),
                opt(gb, 0),
                show_ratio(ratio(Some(h.idle_rss), g.map(|g| g.idle_rss))),
                show_ratio(ratio(hb, gb)),
            );
        }
    }
    if !r.startup.is_empty() {
        let (vas, attached, drivers) = r.startup_size;
        let _ = writeln!(
            md,
            "\n### Start-up at scale\n\n{vas} VAs ({attached} attached, of {drivers} served drivers, as an attacher \
             leaves them; the others of a driver nobody serves) and {vas} PVs in the cluster; the mocks already \
             publish the attached volumes. Each contender starts cold; synced and idle: every VA it queues when \
             its caches fill processed and its queues empty (its own `workqueue_*` metrics). Requests: the API \
             server's counters from the start to synced and idle (a watch counts when it ends; open ones are in \
             the watches column). Idle RSS and CPU after that.\n"
        );
        let _ = writeln!(
            md,
            "| contender | processes | synced and idle (s) | CPU to get there (s) | LIST requests | watches held | requests by kind | ControllerPublish | idle RSS (MiB) | idle CPU (m) |\n\
             |---|---|---|---|---|---|---|---|---|---|"
        );
        let f = r.startup.get(&Contender::Fleet).map(|s| startup_median(s));
        let h = r.startup.get(&Contender::Hub).map(|s| startup_median(s));
        if let Some(f) = &f {
            startup_row(&mut md, Contender::Fleet, drivers, f);
        }
        if let Some(h) = &h {
            startup_row(&mut md, Contender::Hub, drivers, h);
        }
        if let (Some(h), Some(f)) = (&h, &f) {
            let _ = writeln!(
                md,
                "| hub / fleet | | {} | {} | | | | | {} | {} |",
                show_ratio(ratio(h.synced_idle, f.synced_idle)),
                show_ratio(ratio(Some(h.startup_cpu), Some(f.startup_cpu))),
                show_ratio(ratio(Some(h.idle_rss), Some(f.idle_rss))),
                show_ratio(ratio(
                    Some(h.idle_cpu_millicores),
                    Some(f.idle_cpu_millicores)
                )),
            );
        }
        // What the same start-ups cost the control plane, with the hub's two list strategies.
        let mut rows = Vec::new();
        if let Some(f) = &f {
            rows.push((Contender::Fleet.label(drivers), f.plane.clone()));
        }
        if let Some(h) = &h {
            rows.push((
                format!("{}, streaming lists", Contender::Hub.label(drivers)),
                h.plane.clone(),
            ));
        }
        if !r.startup_paginated.is_empty() {
            rows.push((
                format!("{}, paginated lists", Contender::Hub.label(drivers)),
                startup_median(&r.startup_paginated).plane,
            ));
        }
        md.push_str(&crate::control_plane::table(
            "#### The control plane's side of the start-up

kube-apiserver and etcd from each start to              synced and idle: CPU above what they spend at rest over as long, peak RSS above their RSS at the              start, and the API server's counters on VolumeAttachments, PVs, CSINodes and Leases (etcd              requests, watch events, bytes of LIST and WATCH responses; a watch's bytes count when it ends).              The Go sidecars (client-go v0.37) stream their initial lists; the hub is run both ways.",
            &rows,
        ));
    }
    if !checks.is_empty() {
        let _ = writeln!(
            md,
            "\n### Scale target checks\n\n| check | measured | threshold | result |\n|---|---|---|---|"
        );
        for c in checks {
            let verdict = match c.pass {
                Some(true) => "**PASS**",
                Some(false) => "**FAIL**",
                None => "not run",
            };
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} |",
                c.what, c.measured, c.threshold, verdict
            );
        }
    }
    md
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scale::DriverPoint;

    fn startup(secs: f64, rss: f64, publishes: usize) -> StartupSample {
        StartupSample {
            processes: 1,
            synced_idle: Some(secs),
            idle_rss: rss,
            publishes,
            ..StartupSample::default()
        }
    }

    fn idle(drivers: usize, cpu: f64, leases: f64) -> DriverPoint {
        DriverPoint {
            drivers,
            idle_cpu_millicores: cpu,
            lease_writes_per_min: leases,
            idle_rss: 10.0,
            ..DriverPoint::default()
        }
    }

    #[test]
    fn scale_checks_pass_and_fail_on_the_right_side() {
        let mut r = ScaleResults {
            startup_size: (50_000, 20_000, 10),
            ..ScaleResults::default()
        };
        r.startup
            .insert(Contender::Hub, vec![startup(10.0, 120.0, 0)]);
        r.startup
            .insert(Contender::Fleet, vec![startup(20.0, 2400.0, 0)]);
        r.drivers.insert(
            Contender::Hub,
            vec![idle(1, 1.0, 24.0), idle(100, 20.0, 1212.0)],
        );
        r.drivers.insert(
            Contender::Fleet,
            vec![idle(1, 5.0, 12.0), idle(100, 500.0, 1200.0)],
        );
        let checks = checks(&r);
        let verdict = |prefix: &str| {
            checks
                .iter()
                .find(|c| c.what.starts_with(prefix))
                .unwrap_or_else(|| panic!("no check {prefix}"))
                .pass
        };
        // 120 / 2400 = 0.05 exactly, under 250 MiB.
        assert_eq!(verdict("startup: idle RSS"), Some(true));
        // 10 / 20 = 0.5 exactly.
        assert_eq!(verdict("startup: start to"), Some(true));
        assert_eq!(verdict("startup: ControllerPublish"), Some(true));
        // The largest driver count decides: 20 / 500 = 0.04.
        assert_eq!(verdict("100 drivers: idle CPU"), Some(true));
        assert_eq!(verdict("100 drivers: Lease writes"), Some(false));
        let md = render(&r, &checks);
        assert!(md.contains("| 100 | hub / fleet |"), "{md}");
        assert!(crate::plot::svg(&r).is_some_and(|s| s.contains("<polyline")));
    }
}
