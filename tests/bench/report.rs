//! From the runs' samples to the Markdown report: medians per contender and
//! configuration, hub / fleet ratios, API requests per VA, and the issue's
//! Done-when thresholds evaluated as PASS / FAIL.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use crate::scenario::{Contender, RunSpec, Sample, Workload};
use crate::support::RequestKind;

/// API writes of one attach on a fresh PV (`docs/design.md#attach`): PV finalizer, VA
/// finalizer and annotation, `status.attached`.
pub(crate) const ATTACH_WRITES_PER_VA: f64 = 3.0;

/// Slack of the fair-share check: burst tokens, ControllerPublish time and
/// the drivers that finish early make the real time shorter, scheduling on
/// two busy cores longer.
pub(crate) const FAIR_SHARE_SLACK: f64 = 1.5;

/// One configuration and what its runs measured.
pub(crate) struct ConfigResult {
    /// Short ID (`a`, `b`, ..., `e1`, `e2`, `f`).
    pub(crate) id: String,
    /// What it is, for the report.
    pub(crate) title: String,
    /// The run specification (flags, workload).
    pub(crate) spec: RunSpec,
    /// Extra VAs and PVs in the cluster during the runs.
    pub(crate) extra: usize,
    /// Samples per contender, in run order.
    pub(crate) samples: BTreeMap<Contender, Vec<Sample>>,
    /// Why the configuration was not run, if it was not.
    pub(crate) not_run: Option<String>,
}

/// The configuration that runs the hub alone at the pace of another configuration's Go fleet
/// ([`PACED_LIKE`]): its process-wide cap is set to the write rate the fleet reached there, so
/// that the control plane's figures compare the two at the same pace of writes.
pub(crate) const PACED: &str = "bp";

/// The configuration whose Go fleet sets [`PACED`]'s pace.
pub(crate) const PACED_LIKE: &str = "b";

/// The median write rate (writes per second while attaching) of the Go fleet in configuration
/// `id`, if it ran.
pub(crate) fn fleet_write_rate(results: &[ConfigResult], id: &str) -> Option<f64> {
    let fleet = find(results, id)?.summary(Contender::Fleet)?;
    (fleet.write_rate > 0.0).then_some(fleet.write_rate)
}

/// Medians of one contender's samples in one configuration.
#[derive(Clone, Debug, Default)]
pub(crate) struct Summary {
    pub(crate) runs: usize,
    pub(crate) processes: usize,
    pub(crate) vas: usize,
    pub(crate) throughput: Option<f64>,
    pub(crate) p50: Option<f64>,
    pub(crate) p99: Option<f64>,
    pub(crate) detach: Option<f64>,
    pub(crate) cpu: f64,
    pub(crate) apiserver_cpu: Option<f64>,
    /// The control plane's cost of the workload.
    pub(crate) plane: crate::control_plane::Cost,
    pub(crate) peak_rss: f64,
    pub(crate) idle_rss: f64,
    pub(crate) watches: f64,
    /// Most TCP connections to the API server at once during the workload.
    pub(crate) connections: f64,
    /// TCP connections to the API server after the warm-up.
    pub(crate) idle_connections: f64,
    pub(crate) write_rate: f64,
    /// Median requests per measured VA while attaching, by kind.
    pub(crate) attach_per_va: BTreeMap<RequestKind, f64>,
    /// Median requests per measured VA while detaching, by kind.
    pub(crate) detach_per_va: BTreeMap<RequestKind, f64>,
    /// Median requests per minute in the attach phase, by kind (for idle runs).
    pub(crate) per_minute: BTreeMap<RequestKind, f64>,
    pub(crate) publishes: f64,
    /// Most duplicates in any run.
    pub(crate) duplicates: usize,
    pub(crate) unpublishes: f64,
    /// Most duplicate unpublishes in any run.
    pub(crate) unpublish_duplicates: usize,
    pub(crate) noisy_attached: Option<f64>,
    /// Runs that hit the time limit (their figures are lower bounds).
    pub(crate) incomplete: usize,
}

/// Median of the values (mean of the middle two for an even count); `None` when empty.
pub(crate) fn median(values: impl IntoIterator<Item = f64>) -> Option<f64> {
    let mut v: Vec<f64> = values.into_iter().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

/// Per request kind, the median over `samples` of `pick`'s count divided by `per`.
fn normalised(
    samples: &[Sample],
    pick: impl Fn(&Sample) -> &BTreeMap<RequestKind, f64>,
    per: impl Fn(&Sample) -> f64,
) -> BTreeMap<RequestKind, f64> {
    let mut kinds: Vec<&RequestKind> = samples.iter().flat_map(|s| pick(s).keys()).collect();
    kinds.sort();
    kinds.dedup();
    kinds
        .into_iter()
        .filter_map(|k| {
            let m = median(
                samples
                    .iter()
                    .filter(|s| per(s) > 0.0)
                    .map(|s| pick(s).get(k).copied().unwrap_or(0.0) / per(s)),
            )?;
            Some((k.clone(), m))
        })
        .collect()
}

impl Summary {
    /// The medians of `samples` (not empty).
    pub(crate) fn of(samples: &[Sample]) -> Summary {
        let m = |f: fn(&Sample) -> f64| median(samples.iter().map(f)).unwrap_or(0.0);
        let mo = |f: fn(&Sample) -> Option<f64>| median(samples.iter().filter_map(f));
        Summary {
            runs: samples.len(),
            processes: samples.first().map_or(0, |s| s.processes),
            vas: samples.first().map_or(0, |s| s.vas),
            throughput: mo(|s| s.throughput),
            p50: mo(|s| s.p50),
            p99: mo(|s| s.p99),
            detach: mo(|s| s.detach),
            cpu: m(|s| s.cpu),
            apiserver_cpu: mo(|s| s.apiserver_cpu),
            plane: crate::control_plane::median(
                &samples.iter().map(|s| s.plane.clone()).collect::<Vec<_>>(),
            ),
            peak_rss: m(|s| s.peak_rss),
            idle_rss: m(|s| s.idle_rss),
            watches: m(|s| s.watches),
            connections: m(|s| s.connections),
            idle_connections: m(|s| s.idle_connections),
            write_rate: m(Sample::write_rate),
            attach_per_va: normalised(samples, |s| &s.attach_requests, |s| s.vas as f64),
            detach_per_va: normalised(samples, |s| &s.detach_requests, |s| s.vas as f64),
            per_minute: normalised(samples, |s| &s.attach_requests, |s| s.attach_window / 60.0),
            publishes: m(|s| s.publishes as f64),
            duplicates: samples
                .iter()
                .map(|s| s.duplicate_publishes)
                .max()
                .unwrap_or(0),
            unpublishes: m(|s| s.unpublishes as f64),
            unpublish_duplicates: samples
                .iter()
                .map(|s| s.duplicate_unpublishes)
                .max()
                .unwrap_or(0),
            noisy_attached: mo(|s| s.noisy_attached.map(|n| n as f64)),
            incomplete: samples.iter().filter(|s| s.incomplete.is_some()).count(),
        }
    }

    /// API writes per measured VA while detaching, leader election left out.
    pub(crate) fn detach_writes_per_va(&self) -> f64 {
        self.detach_per_va
            .iter()
            .filter(|(k, _)| k.is_write() && k.resource != "leases")
            .map(|(_, v)| v)
            .sum()
    }
}

impl ConfigResult {
    fn summary(&self, c: Contender) -> Option<Summary> {
        self.samples
            .get(&c)
            .filter(|s| !s.is_empty())
            .map(|s| Summary::of(s))
    }
}

/// A Done-when threshold and how the run did against it.
pub(crate) struct Check {
    pub(crate) what: String,
    pub(crate) measured: String,
    pub(crate) threshold: String,
    /// `None`: not evaluated (configuration not run, or no figure).
    pub(crate) pass: Option<bool>,
}

impl Check {
    fn verdict(&self) -> &'static str {
        match self.pass {
            Some(true) => "**PASS**",
            Some(false) => "**FAIL**",
            None => "not run",
        }
    }
}

/// Facts about the whole benchmark run, for the report's header.
pub(crate) struct Context {
    pub(crate) date: String,
    pub(crate) machine: String,
    pub(crate) hub_version: String,
    /// The reference and the control plane as their binaries report themselves
    /// (`external-attacher vX · kube-apiserver vY + etcd vZ`).
    pub(crate) versions: String,
    pub(crate) hub_has_cap: bool,
    pub(crate) repeats: usize,
    pub(crate) drivers: usize,
    /// The API server's raw PATCH rate (writes/s), the best over the levels of concurrency tried.
    pub(crate) raw_writes: f64,
    /// The requests in flight that gave `raw_writes`.
    pub(crate) raw_concurrency: usize,
    /// Noisy-neighbour cap that binds: (qps, burst).
    pub(crate) tight_cap: (f64, u32),
    pub(crate) duration: Duration,
}

fn find<'a>(results: &'a [ConfigResult], id: &str) -> Option<&'a ConfigResult> {
    results.iter().find(|r| r.id == id && r.not_run.is_none())
}

fn both(results: &[ConfigResult], id: &str) -> Option<(Summary, Summary)> {
    let r = find(results, id)?;
    Some((r.summary(Contender::Fleet)?, r.summary(Contender::Hub)?))
}

fn lower_bound(s: &Summary) -> &'static str {
    if s.incomplete > 0 { "≥ " } else { "" }
}

/// Evaluates the thresholds of the issue (and the bench's own fair-share check).
pub(crate) fn checks(results: &[ConfigResult], ctx: &Context) -> Vec<Check> {
    let mut out = Vec::new();
    let ratio_check = |id: &str,
                       what: &str,
                       pick: fn(&Summary) -> Option<f64>,
                       at_least: Option<f64>,
                       at_most: Option<f64>| {
        let threshold = match (at_least, at_most) {
            (Some(x), _) => format!("≥ {x:.2}×"),
            (_, Some(x)) => format!("≤ {x:.2}×"),
            _ => String::new(),
        };
        let title = format!("{id}: {what}, hub / fleet");
        match both(results, id)
            .and_then(|(f, h)| Some((pick(&f)?, pick(&h)?, h.incomplete + f.incomplete)))
        {
            Some((f, h, incomplete)) if f > 0.0 => {
                let r = h / f;
                let pass = at_least.is_none_or(|x| r >= x) && at_most.is_none_or(|x| r <= x);
                Check {
                    what: title,
                    measured: format!(
                        "{r:.2}× ({h:.2} / {f:.2}){}",
                        if incomplete > 0 {
                            ", incomplete runs"
                        } else {
                            ""
                        }
                    ),
                    threshold,
                    pass: Some(pass),
                }
            }
            _ => Check {
                what: title,
                measured: "—".into(),
                threshold,
                pass: None,
            },
        }
    };
    out.push(ratio_check(
        "a",
        "throughput",
        |s| s.throughput,
        Some(1.0),
        None,
    ));
    out.push(ratio_check(
        "a",
        "p99 attach latency",
        |s| s.p99,
        None,
        Some(1.0),
    ));
    out.push(ratio_check(
        "b",
        "throughput",
        |s| s.throughput,
        Some(1.0),
        None,
    ));
    out.push(ratio_check(
        "c",
        "throughput",
        |s| s.throughput,
        Some(1.3),
        None,
    ));
    out.push(ratio_check(
        "c",
        "CPU seconds",
        |s| Some(s.cpu),
        None,
        Some(0.25),
    ));
    out.push(ratio_check(
        "d",
        "quiet drivers' p99 attach latency",
        |s| s.p99,
        None,
        Some(1.0),
    ));

    // e1: the cap at the fleet's total costs the quiet drivers at most 2×.
    let without = find(results, "d").and_then(|r| r.summary(Contender::Hub));
    let with = find(results, "e1").and_then(|r| r.summary(Contender::Hub));
    out.push(
        match (
            with.as_ref().and_then(|s| s.p99),
            without.as_ref().and_then(|s| s.p99),
        ) {
            (Some(w), Some(wo)) if wo > 0.0 => Check {
                what: "e1: quiet p99 with the cap = fleet total, over hub without cap (d)".into(),
                measured: format!(
                    "{:.2}× ({}{w:.2} s / {wo:.2} s)",
                    w / wo,
                    with.as_ref().map_or("", lower_bound)
                ),
                threshold: "≤ 2.00×".into(),
                pass: Some(w <= 2.0 * wo),
            },
            _ => Check {
                what: "e1: quiet p99 with the cap = fleet total, over hub without cap (d)".into(),
                measured: "—".into(),
                threshold: "≤ 2.00×".into(),
                pass: None,
            },
        },
    );

    // e2: a cap that binds still serves the quiet drivers at their fair share.
    let e2 = find(results, "e2");
    let title = format!(
        "e2: quiet p99 with a binding cap ({}/{}), over the fair-share time",
        ctx.tight_cap.0, ctx.tight_cap.1
    );
    let fair = e2.and_then(|r| match r.spec.workload {
        Workload::Noisy { quiet, .. } => {
            Some(quiet as f64 * ATTACH_WRITES_PER_VA * r.spec.drivers as f64 / ctx.tight_cap.0)
        }
        _ => None,
    });
    let threshold = format!("≤ {FAIR_SHARE_SLACK:.1}×");
    out.push(
        match (e2.and_then(|r| r.summary(Contender::Hub)), fair) {
            (Some(s), Some(fair)) if s.p99.is_some() => {
                let p99 = s.p99.unwrap_or_default();
                Check {
                    what: title,
                    measured: format!(
                        "{:.2}× ({}{p99:.2} s / {fair:.1} s); noisy driver meanwhile: {:.0} VAs attached",
                        p99 / fair,
                        lower_bound(&s),
                        s.noisy_attached.unwrap_or(0.0)
                    ),
                    threshold,
                    pass: Some(p99 <= FAIR_SHARE_SLACK * fair),
                }
            }
            _ => Check {
                what: title,
                measured: "—".into(),
                threshold,
                pass: None,
            },
        },
    );

    // Detach: one API write per detached VA.
    let detach = ["b", "c", "a"]
        .iter()
        .find_map(|id| Some((*id, both(results, id)?)));
    out.push(match detach {
        Some((id, (f, h))) => Check {
            what: format!(
                "{id}: API writes per detached VA, hub (fleet: {:.2})",
                f.detach_writes_per_va()
            ),
            measured: format!("{:.2}", h.detach_writes_per_va()),
            threshold: "≤ 1 (+0.05 for stray writes)".into(),
            pass: Some(h.detach_writes_per_va() <= 1.05),
        },
        None => Check {
            what: "API writes per detached VA, hub".into(),
            measured: "—".into(),
            threshold: "≤ 1".into(),
            pass: None,
        },
    });

    // Not in the list, but the hub's promise: no ControllerPublish twice.
    let hub_runs: Vec<&Sample> = results
        .iter()
        .filter_map(|r| r.samples.get(&Contender::Hub))
        .flatten()
        .collect();
    let dups: usize = hub_runs.iter().map(|s| s.duplicate_publishes).sum();
    out.push(Check {
        what: "all configs: duplicate ControllerPublish calls, hub".into(),
        measured: format!("{dups} in {} runs", hub_runs.len()),
        threshold: "0".into(),
        pass: (!hub_runs.is_empty()).then_some(dups == 0),
    });
    // Nor a ControllerUnpublish twice for one detach.
    let dups: usize = hub_runs.iter().map(|s| s.duplicate_unpublishes).sum();
    out.push(Check {
        what: "all configs: duplicate ControllerUnpublish calls, hub".into(),
        measured: format!("{dups} in {} runs", hub_runs.len()),
        threshold: "0".into(),
        pass: (!hub_runs.is_empty()).then_some(dups == 0),
    });
    out
}

/// Flags as inline code, or a dash when there are none.
fn code(flags: &[String]) -> String {
    if flags.is_empty() {
        "—".into()
    } else {
        format!("`{}`", flags.join(" "))
    }
}

fn opt(v: Option<f64>, digits: usize) -> String {
    v.map_or("—".into(), |x| format!("{x:.digits$}"))
}

fn ratio(h: Option<f64>, f: Option<f64>) -> String {
    match (h, f) {
        (Some(h), Some(f)) if f > 0.0 => format!("**{:.2}**", h / f),
        _ => "—".into(),
    }
}

fn requests_line(map: &BTreeMap<RequestKind, f64>) -> String {
    let parts: Vec<String> = map
        .iter()
        .filter(|(_, v)| **v >= 0.005)
        .map(|(k, v)| format!("{k} {v:.2}"))
        .collect();
    if parts.is_empty() {
        "—".into()
    } else {
        parts.join("<br>")
    }
}

/// The whole Markdown report.
pub(crate) fn render(results: &[ConfigResult], checks: &[Check], ctx: &Context) -> String {
    let mut md = String::new();
    let _ = writeln!(
        md,
        "# attacher-hub: one hub against a fleet of Go sidecars\n"
    );
    let _ = writeln!(
        md,
        "{} · {} · attacher-hub {} · {} on loopback, \
         fresh for this run · the project's Rust mock CSI driver, one process per driver socket · \
         {} drivers · medians of {} runs per contender, contenders interleaved (the order alternates) · \
         whole run {:.1} min\n",
        ctx.date,
        ctx.machine,
        ctx.hub_version,
        ctx.versions,
        ctx.drivers,
        ctx.repeats,
        ctx.duration.as_secs_f64() / 60.0
    );
    let _ = writeln!(
        md,
        "Hub API budgets: {}.\n",
        if ctx.hub_has_cap {
            "per driver (each driver gets what its sidecar would have had), optional process-wide cap `--hub-kube-api-qps/--hub-kube-api-burst`"
        } else {
            "**this build has no `--hub-kube-api-qps`: `--kube-api-qps/--kube-api-burst` are one budget shared by all drivers** (the configurations with a cap were not run)"
        }
    );
    let _ = writeln!(
        md,
        "API server raw write rate on this machine: **{:.0} PATCH/s** (merge PATCHes on VAs from one client with no \
         client-side limit, the best of 8, 32 and 128 in flight: {}), measured once at the start; a contender can \
         exceed it when the machine is less busy than it was then.\n",
        ctx.raw_writes, ctx.raw_concurrency
    );

    let _ = writeln!(md, "## Configurations\n");
    let _ = writeln!(
        md,
        "| | flags (both contenders) | hub only | workload |\n|---|---|---|---|"
    );
    for r in results {
        let workload = match r.spec.workload {
            Workload::Uniform { per_driver } => {
                format!(
                    "{} drivers × {per_driver} VAs at once; attach all, then delete all",
                    r.spec.drivers
                )
            }
            Workload::Partial { per_driver, detach } => format!(
                "{} drivers × {per_driver} VAs at once; attach all, then delete {detach}",
                r.spec.drivers
            ),
            Workload::Noisy {
                noisy,
                quiet,
                delay,
            } => format!(
                "1 driver gets {noisy} VAs at once, {} others {quiet} each {:.1} s later; quiet drivers measured",
                r.spec.drivers - 1,
                delay.as_secs_f64()
            ),
            Workload::Idle { .. } => format!(
                "{} drivers idle (one attached VA each), {} extra VAs + PVs in the cluster",
                r.spec.drivers, r.extra
            ),
        };
        let _ = writeln!(
            md,
            "| **{}** {} | {} | {} | {}{} |",
            r.id,
            r.title,
            code(&r.spec.flags),
            code(&r.spec.hub_flags),
            workload,
            r.not_run
                .as_ref()
                .map_or(String::new(), |w| format!(" — **not run**: {w}"))
        );
    }

    let _ = writeln!(md, "\n## Results (medians)\n");
    let _ = writeln!(
        md,
        "Latency: VA seen created → seen `attached=true` by a watch (quiet drivers only in d, e1, e2). \
         Throughput: VAs / (first created → last attached). Detach: first delete → last VA gone. \
         CPU: the contender's processes during attach + detach (d/e: until the quiet drivers are done), \
         and the API server's in the same window. \
         RSS: sums over the contender's processes; idle after warm-up and a pause, peak = VmHWM. \
         Watches: open watches the contender adds on the API server. API conns: TCP connections \
         the contender's processes hold to the API server, the most at once during the workload \
         (after the warm-up in parentheses), from `/proc/<pid>/net/tcp` and the processes' socket inodes. Writes/s: the contender's API writes \
         during the attach phase, and their share of the raw rate.\n"
    );
    let _ = writeln!(
        md,
        "| | contender | processes | VAs | VAs/s | p50 (s) | p99 (s) | detach (s) | CPU (s) | API server CPU (s) | peak RSS (MiB) | idle RSS (MiB) | watches | API conns | writes/s (% raw) | ControllerPublish (dup.) | ControllerUnpublish (dup.) |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    );
    for r in results.iter().filter(|r| r.not_run.is_none()) {
        let fleet = r.summary(Contender::Fleet);
        let hub = r.summary(Contender::Hub);
        for (c, s) in [(Contender::Fleet, &fleet), (Contender::Hub, &hub)] {
            let Some(s) = s else { continue };
            let mut publish = format!("{:.0} ({})", s.publishes, s.duplicates);
            if let Some(n) = s.noisy_attached {
                let _ = write!(publish, "; noisy: {n:.0} attached meanwhile");
            }
            let _ = writeln!(
                md,
                "| **{}** | {}{} | {} | {} | {} | {} | {} | {} | {:.2} | {} | {:.1} | {:.1} | {:.0} | {:.0} ({:.0}) | {:.0} ({:.0} %) | {} | {:.0} ({}) |",
                r.id,
                c.label(r.spec.drivers),
                if s.incomplete > 0 {
                    format!(
                        " ({} of {} runs incomplete: lower bounds)",
                        s.incomplete, s.runs
                    )
                } else {
                    String::new()
                },
                s.processes,
                s.vas,
                opt(s.throughput, 1),
                opt(s.p50, 2),
                opt(s.p99, 2),
                opt(s.detach, 2),
                s.cpu,
                opt(s.apiserver_cpu, 2),
                s.peak_rss,
                s.idle_rss,
                s.watches,
                s.connections,
                s.idle_connections,
                s.write_rate,
                100.0 * s.write_rate / ctx.raw_writes.max(1e-9),
                publish,
                s.unpublishes,
                s.unpublish_duplicates
            );
        }
        if let (Some(f), Some(h)) = (&fleet, &hub) {
            let _ = writeln!(
                md,
                "| **{}** | hub / fleet | | | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | | |",
                r.id,
                ratio(h.throughput, f.throughput),
                ratio(h.p50, f.p50),
                ratio(h.p99, f.p99),
                ratio(h.detach, f.detach),
                ratio(Some(h.cpu), Some(f.cpu)),
                ratio(h.apiserver_cpu, f.apiserver_cpu),
                ratio(Some(h.peak_rss), Some(f.peak_rss)),
                ratio(Some(h.idle_rss), Some(f.idle_rss)),
                ratio(Some(h.watches), Some(f.watches)),
                ratio(Some(h.connections), Some(f.connections)),
                ratio(Some(h.write_rate), Some(f.write_rate)),
            );
        }
    }

    // What each configuration's workload cost the control plane, hub against fleet.
    let mut rows = Vec::new();
    for r in results.iter().filter(|r| r.not_run.is_none()) {
        // The paced hub against the fleet whose pace it was given.
        if r.id == PACED
            && let Some(like) = find(results, PACED_LIKE)
            && let Some(fleet) = like.summary(Contender::Fleet)
        {
            rows.push((
                r.id.clone(),
                format!(
                    "{} ({PACED_LIKE})",
                    Contender::Fleet.label(like.spec.drivers)
                ),
                fleet.plane,
            ));
        }
        for c in [Contender::Fleet, Contender::Hub] {
            if let Some(s) = r.summary(c) {
                rows.push((r.id.clone(), c.label(r.spec.drivers), s.plane));
            }
        }
    }
    if !rows.is_empty() {
        let _ = writeln!(
            md,
            "\n## The control plane's side of each configuration\n\n\
             kube-apiserver and etcd during the workload (attach and detach, or the idle window): CPU above \
             what they spend at rest over as long, peak RSS above their RSS at its start, and the API \
             server's counters on VolumeAttachments, PVs, CSINodes and Leases."
        );
        let mut ids: Vec<&String> = rows.iter().map(|(id, ..)| id).collect();
        ids.dedup();
        for id in ids {
            let per: Vec<(String, crate::control_plane::Cost)> = rows
                .iter()
                .filter(|(i, ..)| i == id)
                .map(|(_, label, cost)| (label.clone(), cost.clone()))
                .collect();
            md.push_str(&crate::control_plane::table(&format!("**{id}**"), &per));
        }
    }

    let _ = writeln!(
        md,
        "\n## API requests per VA (the API server's `apiserver_request_total`)\n"
    );
    let _ = writeln!(
        md,
        "The contender's requests only (the benchmark's own creates, deletes and `/metrics` reads are left out), \
         divided by the measured VAs; Leases are leader election.\n"
    );
    let _ = writeln!(
        md,
        "| | contender | while attaching | while detaching |\n|---|---|---|---|"
    );
    for r in results.iter().filter(|r| r.not_run.is_none()) {
        for c in [Contender::Fleet, Contender::Hub] {
            let Some(s) = r.summary(c) else { continue };
            let (attach, detach) = if matches!(r.spec.workload, Workload::Idle { .. }) {
                (
                    format!("idle, per minute:<br>{}", requests_line(&s.per_minute)),
                    "—".to_string(),
                )
            } else {
                (
                    requests_line(&s.attach_per_va),
                    requests_line(&s.detach_per_va),
                )
            };
            let _ = writeln!(
                md,
                "| **{}** | {} | {} | {} |",
                r.id,
                c.label(r.spec.drivers),
                attach,
                detach
            );
        }
    }

    let _ = writeln!(md, "\n## Threshold checks\n");
    let _ = writeln!(
        md,
        "| check | measured | threshold | result |\n|---|---|---|---|"
    );
    for c in checks {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} |",
            c.what,
            c.measured,
            c.threshold,
            c.verdict()
        );
    }
    let _ = writeln!(
        md,
        "\ne2's fair-share time: quiet VAs per driver × {ATTACH_WRITES_PER_VA} attach writes × drivers / cap QPS, \
         the time a quiet driver needs when the cap's tokens go round all waiting drivers in turn (the \
         noisy driver keeps all its workers waiting for tokens; without fair sharing its share of the cap \
         would follow how many requests it has waiting)."
    );
    md
}
