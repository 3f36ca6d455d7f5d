//! The model of the status (one [`Row`] per driver of `/drivers`, with its VolumeAttachments
//! counted) and its renderings: the table and the JSON document.

use std::collections::BTreeMap;

use k8s_openapi::api::storage::v1::VolumeAttachment;
use serde_json::Value;

/// Characters of a driver's last error shown in the table (the JSON output
/// carries it whole).
const LAST_ERROR_WIDTH: usize = 100;

/// VolumeAttachments of one driver (`spec.attacher`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// `status.attached: true`.
    pub attached: usize,
    /// All of them.
    pub total: usize,
    /// With `status.attachError` set.
    pub failing: usize,
}

/// One row of the table, taken from a `/drivers` entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Row {
    /// The driver's name, or its socket while the name is not known yet.
    pub driver: String,
    /// `connecting`, `notReady`, `standby`, `leading`, `failed`, ...
    pub state: String,
    /// Why, for a failed driver.
    pub reason: Option<String>,
    /// The Lease holder, if any.
    pub lease_holder: Option<String>,
    /// Whether the driver runs under leader election.
    pub leader_election: bool,
    /// Depths of the attach, detach and PV queues.
    pub queues: [Option<u64>; 3],
    /// The VolumeAttachments, when counted.
    pub attachments: Option<Counts>,
    /// The driver's last error (cleared by the hub once what caused it is over).
    pub last_error: Option<String>,
    /// How long ago that error happened, when the hub says when.
    pub last_error_age: Option<std::time::Duration>,
    /// Why the cross-namespace Lease guard does not guard this driver, when it cannot.
    pub guard_unavailable: Option<String>,
    /// What the API server pushed back on the driver's requests, when it did.
    pub pushback: Option<Pushback>,
}

/// The API server's pushback on a driver's requests (`apiBudget.pushback` of `/drivers`).
#[derive(Clone, Debug, PartialEq)]
pub struct Pushback {
    /// Throttled now.
    pub throttled: bool,
    /// 429 answers since the driver connected.
    pub too_many_requests: u64,
    /// Seconds waited for `Retry-After` since then.
    pub waited_seconds: f64,
    /// The priority level the API server named (UID).
    pub priority_level_uid: Option<String>,
}

impl Eq for Pushback {}

impl Pushback {
    /// The pushback of a `/drivers` entry; `None` when there was none (or the hub does not say).
    fn of(entry: &Value) -> Option<Self> {
        let p = &entry["apiBudget"]["pushback"];
        let too_many_requests = p["tooManyRequests"].as_u64().filter(|n| *n > 0)?;
        Some(Self {
            throttled: p["throttled"].as_bool().unwrap_or(false),
            too_many_requests,
            waited_seconds: p["retryAfterWaitSeconds"].as_f64().unwrap_or(0.0),
            priority_level_uid: p["priorityLevelUid"]
                .as_str()
                .filter(|s| !s.is_empty())
                .map(str::to_string),
        })
    }

    /// The note's text, after the driver's name.
    fn note(&self) -> String {
        let level = self
            .priority_level_uid
            .as_deref()
            .map(|uid| format!(" (priority level UID {uid})"))
            .unwrap_or_default();
        let when = if self.throttled {
            "the API server is throttling its requests now"
        } else {
            "the API server throttled its requests earlier"
        };
        format!(
            "{when}{level}: {} answered 429 Too Many Requests, {:.1} s waited for Retry-After since it connected",
            self.too_many_requests, self.waited_seconds
        )
    }
}

impl Row {
    /// A driver the hub serves, rather than a discovered socket it records without serving
    /// (a stale socket, a node plugin): only drivers count towards readiness.
    pub fn is_driver(&self) -> bool {
        !matches!(self.state.as_str(), "staleSocket" | "noControllerService")
    }

    /// Ready to act: leading, or standing by while a Lease holder acts.
    pub fn ready(&self) -> bool {
        match self.state.as_str() {
            "leading" => true,
            "standby" => self.lease_holder.is_some() || !self.leader_election,
            _ => false,
        }
    }
}

/// The rows of a `/drivers` document, with the VolumeAttachment counts per
/// driver name when known. Missing fields show as unknown, never fail.
pub fn rows(drivers: &[Value], counts: Option<&BTreeMap<String, Counts>>) -> Vec<Row> {
    let text = |v: &Value| v.as_str().filter(|s| !s.is_empty()).map(str::to_string);
    drivers
        .iter()
        .map(|d| {
            // The name the driver reported, else the one configured for its socket (a driver
            // not connected yet), else its socket.
            let name = text(&d["name"]).or_else(|| text(&d["configuredName"]));
            let queues = ["attach", "detach", "pv"].map(|q| d["queues"][q]["depth"].as_u64());
            Row {
                driver: name
                    .clone()
                    .or_else(|| text(&d["socket"]))
                    .unwrap_or_else(|| "?".to_string()),
                state: text(&d["state"]["state"]).unwrap_or_else(|| "?".to_string()),
                reason: text(&d["state"]["reason"]),
                lease_holder: text(&d["leaseHolder"]),
                leader_election: d["leaderElection"].as_bool().unwrap_or(false),
                queues,
                attachments: counts.map(|c| {
                    name.as_ref()
                        .and_then(|n| c.get(n))
                        .copied()
                        .unwrap_or_default()
                }),
                last_error: text(&d["lastError"]),
                last_error_age: text(&d["lastErrorTime"])
                    .and_then(|t| t.parse::<k8s_openapi::jiff::Timestamp>().ok())
                    .and_then(|t| {
                        k8s_openapi::jiff::Timestamp::now()
                            .duration_since(t)
                            .try_into()
                            .ok()
                    }),
                guard_unavailable: (d["leaseGuard"]["state"] == "unavailable")
                    .then(|| text(&d["leaseGuard"]["reason"]))
                    .flatten(),
                pushback: Pushback::of(d),
            }
        })
        .collect()
}

/// A note for a rejected reload of the driver file (`/config` of the hub), with when it
/// happened, why, and what it means; `None` when the last reload was applied or there was none.
pub fn reload_note(config: &Value) -> Option<String> {
    let last = &config["lastReload"];
    if last["successful"].as_bool() != Some(false) {
        return None;
    }
    let path = config["path"].as_str().unwrap_or("the driver file");
    let age = |key: &Value| {
        key.as_str()
            .and_then(|t| t.parse::<k8s_openapi::jiff::Timestamp>().ok())
            .and_then(|t| {
                k8s_openapi::jiff::Timestamp::now()
                    .duration_since(t)
                    .try_into()
                    .ok()
            })
            .map_or_else(|| "?".to_string(), |d| format!("{} ago", short_age(d)))
    };
    Some(format!(
        "\nconfig: the reload of {path} {} was REJECTED; the drivers loaded {} keep running, but a restarted replica would exit on this file: {}\n",
        age(&last["time"]),
        age(&config["loadedTime"]),
        last["error"].as_str().unwrap_or("?")
    ))
}

/// The table's columns.
const HEADER: [&str; 6] = [
    "DRIVER",
    "STATE",
    "LEASE HOLDER",
    "QUEUES A/D/PV",
    "ATTACHED",
    "LAST ERROR",
];

/// The table: a header, one row per driver, then notes (reasons of failed
/// drivers, VolumeAttachments with attach errors) and, when counted, the
/// total of attached VolumeAttachments. Cells other than the last never
/// contain spaces, so rows split on whitespace.
pub fn render_table(rows: &[Row]) -> String {
    let cells: Vec<[String; 6]> = rows.iter().map(cells).collect();
    let widths = column_widths(&cells);
    let mut out = aligned(HEADER, widths);
    for row in &cells {
        out.push_str(&aligned(row.each_ref().map(String::as_str), widths));
    }
    if rows.is_empty() {
        out.push_str("(no drivers)\n");
    }
    let notes: Vec<String> = rows.iter().flat_map(notes).collect();
    if !notes.is_empty() {
        out.push('\n');
        for n in notes {
            out.push_str(&format!("note: {n}\n"));
        }
    }
    if let Some(total) = attached_total(rows) {
        out.push_str(&total);
    }
    out
}

/// The cells of one row, in the order of [`HEADER`]; `-` for nothing to show.
fn cells(r: &Row) -> [String; 6] {
    let dash = || "-".to_string();
    [
        r.driver.clone(),
        r.state.clone(),
        r.lease_holder.clone().unwrap_or_else(dash),
        queues_cell(&r.queues),
        r.attachments
            .map_or_else(dash, |c| format!("{}/{}", c.attached, c.total)),
        last_error_cell(r),
    ]
}

/// `attach/detach/pv` depths, `?` for one the hub does not report.
fn queues_cell(queues: &[Option<u64>; 3]) -> String {
    queues
        .iter()
        .map(|q| q.map_or_else(|| "?".to_string(), |d| d.to_string()))
        .collect::<Vec<_>>()
        .join("/")
}

/// The last error on one line, after its age when known, cut to [`LAST_ERROR_WIDTH`].
fn last_error_cell(r: &Row) -> String {
    let Some(error) = r.last_error.as_deref() else {
        return "-".to_string();
    };
    let text = match r.last_error_age {
        Some(age) => format!("{} ago: {}", short_age(age), one_line(error)),
        None => one_line(error),
    };
    truncate(&text, LAST_ERROR_WIDTH)
}

/// Each column's width: its widest cell, the header's included.
fn column_widths(cells: &[[String; 6]]) -> [usize; 6] {
    let mut widths = HEADER.map(|h| h.chars().count());
    for row in cells {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    widths
}

/// One line of the table: each cell but the last padded to its column's width plus two
/// spaces, without trailing spaces.
fn aligned(row: [&str; 6], widths: [usize; 6]) -> String {
    let mut out = String::new();
    for (i, (cell, w)) in row.iter().zip(widths).enumerate() {
        out.push_str(cell);
        if i + 1 < row.len() {
            out.push_str(&" ".repeat(w - cell.chars().count() + 2));
        }
    }
    out.trim_end().to_string() + "\n"
}

/// `text` on one line, its runs of white space each one space (an older hub's reasons span
/// lines).
fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The notes about one driver, each one line: why it is in its state, why its Lease is not
/// guarded, the API server's pushback, its VolumeAttachments with an attach error.
fn notes(r: &Row) -> Vec<String> {
    let mut notes = Vec::new();
    if let Some(reason) = &r.reason {
        notes.push(format!("{}: {}: {}", r.driver, r.state, one_line(reason)));
    }
    if let Some(why) = &r.guard_unavailable {
        notes.push(format!(
            "{}: lease guard unavailable: {}",
            r.driver,
            one_line(why)
        ));
    }
    if let Some(p) = &r.pushback {
        notes.push(format!("{}: {}", r.driver, p.note()));
    }
    if let Some(c) = r.attachments.filter(|c| c.failing > 0) {
        notes.push(format!(
            "{}: {} VolumeAttachment(s) with an attach error",
            r.driver, c.failing
        ));
    }
    notes
}

/// The total of attached VolumeAttachments, when every driver's were counted (and there is a
/// driver).
fn attached_total(rows: &[Row]) -> Option<String> {
    if rows.is_empty() || rows.iter().any(|r| r.attachments.is_none()) {
        return None;
    }
    let (attached, total) = rows
        .iter()
        .filter_map(|r| r.attachments)
        .fold((0, 0), |(a, t), c| (a + c.attached, t + c.total));
    Some(format!(
        "\nattached: {attached}/{total} VolumeAttachments\n"
    ))
}

/// An age as kubectl prints it: `42s`, `3m`, `5h`, `2d`.
fn short_age(age: std::time::Duration) -> String {
    let s = age.as_secs();
    match s {
        0..120 => format!("{s}s"),
        120..7_200 => format!("{}m", s / 60),
        7_200..172_800 => format!("{}h", s / 3_600),
        _ => format!("{}d", s / 86_400),
    }
}

pub(crate) fn truncate(text: &str, width: usize) -> String {
    if text.chars().count() <= width {
        return text.to_string();
    }
    let mut cut: String = text.chars().take(width.saturating_sub(1)).collect();
    cut.push('…');
    cut
}

/// `-o json`: the `/drivers` entries, each with `volumeAttachments`
/// (`attached`, `total`, `withAttachError`) when counted.
pub fn render_json(drivers: &[Value], counts: Option<&BTreeMap<String, Counts>>) -> String {
    let out: Vec<Value> = drivers
        .iter()
        .map(|d| {
            let mut d = d.clone();
            if let (Some(counts), Some(obj)) = (counts, d.as_object_mut()) {
                let c = obj
                    .get("name")
                    .and_then(Value::as_str)
                    .and_then(|n| counts.get(n))
                    .copied()
                    .unwrap_or_default();
                obj.insert(
                    "volumeAttachments".to_string(),
                    serde_json::json!({
                        "attached": c.attached,
                        "total": c.total,
                        "withAttachError": c.failing,
                    }),
                );
            }
            d
        })
        .collect();
    serde_json::to_string_pretty(&out).unwrap_or_default() + "\n"
}

/// Counts VolumeAttachments per `spec.attacher`.
pub fn count(vas: &[VolumeAttachment]) -> BTreeMap<String, Counts> {
    let mut counts: BTreeMap<String, Counts> = BTreeMap::new();
    for va in vas {
        let c = counts.entry(va.spec.attacher.clone()).or_default();
        c.total += 1;
        if let Some(status) = &va.status {
            c.attached += usize::from(status.attached);
            c.failing += usize::from(status.attach_error.is_some());
        }
    }
    counts
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use serde_json::json;

    fn entry(name: &str, state: &str, holder: Option<&str>, depths: [u64; 3]) -> Value {
        json!({
            "socket": format!("unix:///csi/{name}.sock"),
            "name": name,
            "state": {"state": state},
            "lease": format!("external-attacher-leader-{name}"),
            "leaseHolder": holder,
            "leaderElection": true,
            "discovered": false,
            "queues": {
                "attach": {"depth": depths[0], "processing": 0, "oldestSeconds": null},
                "detach": {"depth": depths[1], "processing": 0, "oldestSeconds": null},
                "pv": {"depth": depths[2], "processing": 0, "oldestSeconds": null},
            },
            "lastError": null,
        })
    }

    fn va(attacher: &str, attached: bool, error: bool) -> VolumeAttachment {
        serde_json::from_value(json!({
            "metadata": {"name": "x"},
            "spec": {"attacher": attacher, "nodeName": "n", "source": {"persistentVolumeName": "pv"}},
            "status": {
                "attached": attached,
                "attachError": if error { json!({"message": "boom"}) } else { Value::Null },
            },
        }))
        .expect("a VolumeAttachment")
    }

    #[test]
    fn table_has_one_row_per_driver_with_state_holder_queues_and_attached_counts() {
        let drivers = vec![
            entry(
                "fast.csi.example.com",
                "leading",
                Some("hub-0_1a2b"),
                [3, 0, 1],
            ),
            entry(
                "nfs.csi.example.com",
                "standby",
                Some("hub-1_9f8e"),
                [0, 0, 0],
            ),
        ];
        let counts = count(&[
            va("fast.csi.example.com", true, false),
            va("fast.csi.example.com", false, true),
            va("nfs.csi.example.com", true, false),
            va("other.csi.example.com", true, false),
        ]);
        let table = render_table(&rows(&drivers, Some(&counts)));
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(
            lines[0],
            "DRIVER                STATE    LEASE HOLDER  QUEUES A/D/PV  ATTACHED  LAST ERROR"
        );
        let cells = |l: &str| l.split_whitespace().map(str::to_string).collect::<Vec<_>>();
        assert_eq!(
            cells(lines[1]),
            [
                "fast.csi.example.com",
                "leading",
                "hub-0_1a2b",
                "3/0/1",
                "1/2",
                "-"
            ]
        );
        assert_eq!(
            cells(lines[2]),
            [
                "nfs.csi.example.com",
                "standby",
                "hub-1_9f8e",
                "0/0/0",
                "1/1",
                "-"
            ]
        );
        // Columns line up: every row's second cell starts under STATE.
        let col = lines[0].find("STATE").expect("STATE");
        assert!(lines[1..3].iter().all(|l| l[col..].starts_with(['l', 's'])));
        assert!(
            table.contains(
                "note: fast.csi.example.com: 1 VolumeAttachment(s) with an attach error\n"
            )
        );
        // Only the listed drivers' VolumeAttachments count in the total.
        assert!(
            table.ends_with("\nattached: 2/3 VolumeAttachments\n"),
            "{table}"
        );
    }

    #[test]
    fn table_without_counts_shows_dashes_and_no_total() {
        let mut failed = entry("bad.csi.example.com", "failed", None, [0, 0, 0]);
        failed["state"]["reason"] = json!("GetPluginInfo: deadline exceeded");
        failed["lastError"] = json!("probe failed:\n  connection refused");
        let mut connecting = entry("x", "connecting", None, [0, 0, 0]);
        connecting["name"] = Value::Null;
        let table = render_table(&rows(&[failed, connecting], None));
        let lines: Vec<&str> = table.lines().collect();
        let cells: Vec<&str> = lines[1].split_whitespace().collect();
        assert_eq!(
            cells,
            [
                "bad.csi.example.com",
                "failed",
                "-",
                "0/0/0",
                "-",
                "probe",
                "failed:",
                "connection",
                "refused"
            ]
        );
        // A driver without a name yet shows its socket.
        assert_eq!(
            lines[2].split_whitespace().take(3).collect::<Vec<_>>(),
            ["unix:///csi/x.sock", "connecting", "-"]
        );
        assert!(
            table.contains("note: bad.csi.example.com: failed: GetPluginInfo: deadline exceeded\n")
        );
        assert!(!table.contains("attached:"));
    }

    #[test]
    fn a_driver_the_api_server_throttles_is_a_note_naming_the_priority_level() {
        let mut now = entry("a.csi.example.com", "leading", Some("h"), [4, 0, 0]);
        now["apiBudget"] = json!({"pushback": {
            "tooManyRequests": 12, "retryAfterWaitSeconds": 7.25, "throttled": true,
            "throttledSeconds": 3.0, "heldSeconds": 1.0,
            "priorityLevelUid": "8b5f", "flowSchemaUid": "77c1"}});
        let mut earlier = entry("b.csi.example.com", "leading", Some("h"), [0, 0, 0]);
        earlier["apiBudget"] = json!({"pushback": {
            "tooManyRequests": 2, "retryAfterWaitSeconds": 2.0, "throttled": false}});
        let mut never = entry("c.csi.example.com", "leading", Some("h"), [0, 0, 0]);
        never["apiBudget"] = json!({"pushback": {"tooManyRequests": 0, "throttled": false}});
        // A hub that does not say (an older one) has no note either.
        let older = entry("d.csi.example.com", "leading", Some("h"), [0, 0, 0]);
        let table = render_table(&rows(&[now, earlier, never, older], None));
        assert!(
            table.contains("note: a.csi.example.com: the API server is throttling its requests now (priority level UID 8b5f): 12 answered 429 Too Many Requests, 7.2 s waited for Retry-After since it connected\n"),
            "{table}"
        );
        assert!(
            table.contains("note: b.csi.example.com: the API server throttled its requests earlier: 2 answered 429 Too Many Requests, 2.0 s waited for Retry-After since it connected\n"),
            "{table}"
        );
        assert!(!table.contains("c.csi.example.com: the API"), "{table}");
        assert!(!table.contains("d.csi.example.com: the API"), "{table}");
        // The rows keep their cells: the note is below the table.
        let cells: Vec<&str> = table
            .lines()
            .nth(1)
            .expect("row")
            .split_whitespace()
            .collect();
        assert_eq!(&cells[..2], ["a.csi.example.com", "leading"]);
    }

    #[test]
    fn a_blocked_driver_and_an_unguarded_one_are_explained_in_notes() {
        let mut blocked = entry("pd.csi.storage.gke.io", "blocked", None, [0, 0, 0]);
        blocked["state"]["namespace"] = json!("kube-system");
        blocked["state"]["holder"] = json!("csi-gce-pd-controller-0");
        blocked["state"]["reason"] =
            json!("the Lease ... set leaderElection.namespace: kube-system ...");
        blocked["leaseGuard"] = json!({"state": "blocked", "namespace": "kube-system"});
        let mut unguarded = entry("nfs.csi.example.com", "leading", Some("h"), [0, 0, 0]);
        unguarded["leaseGuard"] = json!({"state": "unavailable", "reason": "403 Forbidden: no grant to list leases.coordination.k8s.io cluster-wide;\n add deploy/components/lease-guard"});
        let table = render_table(&rows(&[blocked, unguarded], None));
        let cells: Vec<&str> = table
            .lines()
            .nth(1)
            .expect("row")
            .split_whitespace()
            .collect();
        assert_eq!(&cells[..2], ["pd.csi.storage.gke.io", "blocked"]);
        assert!(
            table.contains("note: pd.csi.storage.gke.io: blocked: the Lease ... set leaderElection.namespace: kube-system ...\n"),
            "{table}"
        );
        assert!(
            table.contains("note: nfs.csi.example.com: lease guard unavailable: 403 Forbidden: no grant to list leases.coordination.k8s.io cluster-wide; add deploy/components/lease-guard\n"),
            "{table}"
        );
    }

    #[test]
    fn table_of_no_drivers_says_so_and_long_errors_are_cut() {
        assert_eq!(
            render_table(&[]),
            "DRIVER  STATE  LEASE HOLDER  QUEUES A/D/PV  ATTACHED  LAST ERROR\n(no drivers)\n"
        );
        let mut d = entry("d", "leading", Some("h"), [0, 0, 0]);
        d["lastError"] = json!("x".repeat(300));
        let table = render_table(&rows(&[d], None));
        let error = table
            .lines()
            .nth(1)
            .expect("row")
            .split_whitespace()
            .last()
            .expect("cell");
        assert_eq!(error.chars().count(), LAST_ERROR_WIDTH);
        assert!(error.ends_with('…'));
    }

    #[test]
    fn a_last_error_says_how_long_ago_it_happened() {
        let mut d = entry("d", "leading", Some("h"), [0, 0, 0]);
        d["lastError"] = json!("va-1: csinode \"n\" not found");
        let then =
            k8s_openapi::jiff::Timestamp::now() - k8s_openapi::jiff::SignedDuration::from_secs(190);
        d["lastErrorTime"] = json!(then.to_string());
        let table = render_table(&rows(&[d], None));
        assert!(table.contains("3m ago: va-1: csinode"), "{table}");
        assert_eq!(short_age(std::time::Duration::from_secs(42)), "42s");
        assert_eq!(short_age(std::time::Duration::from_secs(3 * 3600)), "3h");
        assert_eq!(short_age(std::time::Duration::from_secs(3 * 86_400)), "3d");
    }

    #[test]
    fn a_driver_not_connected_yet_is_named_from_the_config_else_by_its_socket() {
        let mut configured = entry("x", "connecting", None, [0, 0, 0]);
        configured["name"] = Value::Null;
        configured["configuredName"] = json!("pd.csi.storage.gke.io");
        let mut bare = entry("y", "connecting", None, [0, 0, 0]);
        bare["name"] = Value::Null;
        let rows = rows(&[configured, bare], None);
        assert_eq!(rows[0].driver, "pd.csi.storage.gke.io");
        assert_eq!(rows[1].driver, "unix:///csi/y.sock");
    }

    #[test]
    fn a_rejected_reload_is_a_note_with_its_age_and_cause_and_an_applied_one_is_not() {
        let ago = |s: i64| {
            (k8s_openapi::jiff::Timestamp::now() - k8s_openapi::jiff::SignedDuration::from_secs(s))
                .to_string()
        };
        let rejected = json!({
            "path": "/etc/attacher-hub/drivers.yaml",
            "loadedTime": ago(7_300),
            "lastReload": {"time": ago(300), "successful": false,
                           "error": "drivers.yaml:6:5: drivers[1].timeout: invalid duration"},
        });
        let note = reload_note(&rejected).expect("a note");
        assert!(
            note.contains("/etc/attacher-hub/drivers.yaml 5m ago was REJECTED")
                && note.contains("loaded 2h ago")
                && note.ends_with("drivers.yaml:6:5: drivers[1].timeout: invalid duration\n"),
            "{note}"
        );
        let mut applied = rejected.clone();
        applied["lastReload"] = json!({"time": ago(1), "successful": true, "error": null});
        assert_eq!(reload_note(&applied), None);
        assert_eq!(
            reload_note(&json!({"path": null, "lastReload": null})),
            None
        );
    }

    #[test]
    fn json_output_adds_volume_attachment_counts_to_each_entry() {
        let drivers = vec![entry("a", "leading", Some("h"), [0, 0, 0])];
        let counts = count(&[va("a", true, false), va("a", false, false)]);
        let out: Value = serde_json::from_str(&render_json(&drivers, Some(&counts))).expect("JSON");
        assert_eq!(
            out[0]["volumeAttachments"],
            json!({"attached": 1, "total": 2, "withAttachError": 0})
        );
        assert_eq!(out[0]["leaseHolder"], "h");
        let out: Value = serde_json::from_str(&render_json(&drivers, None)).expect("JSON");
        assert_eq!(out, Value::Array(drivers));
    }

    #[test]
    fn ready_means_leading_or_standby_behind_a_holder() {
        let row = |state: &str, holder: Option<&str>, le: bool| Row {
            driver: "d".into(),
            state: state.into(),
            reason: None,
            lease_holder: holder.map(str::to_string),
            leader_election: le,
            queues: [Some(0); 3],
            attachments: None,
            last_error: None,
            last_error_age: None,
            guard_unavailable: None,
            pushback: None,
        };
        assert!(row("leading", None, true).ready());
        assert!(row("standby", Some("other"), true).ready());
        assert!(!row("standby", None, true).ready());
        assert!(row("standby", None, false).ready());
        // Discovered sockets recorded without being served are not drivers.
        assert!(!row("staleSocket", None, true).is_driver());
        assert!(!row("noControllerService", None, true).is_driver());
        assert!(row("failed", None, true).is_driver());
        for state in [
            "connecting",
            "notReady",
            "failed",
            "blocked",
            "stopped",
            "?",
        ] {
            assert!(!row(state, Some("h"), true).ready(), "{state}");
        }
    }

    fn bare(driver: &str) -> Row {
        Row {
            driver: driver.to_string(),
            state: "leading".to_string(),
            reason: None,
            lease_holder: None,
            leader_election: true,
            queues: [Some(0); 3],
            attachments: None,
            last_error: None,
            last_error_age: None,
            guard_unavailable: None,
            pushback: None,
        }
    }

    #[test]
    fn cells_show_unknown_queues_as_a_question_mark_and_nothing_as_a_dash() {
        assert_eq!(queues_cell(&[Some(3), None, Some(0)]), "3/?/0");
        let mut r = bare("d");
        assert_eq!(cells(&r), ["d", "leading", "-", "0/0/0", "-", "-"]);
        r.lease_holder = Some("hub-0".into());
        r.attachments = Some(Counts {
            attached: 1,
            total: 2,
            failing: 0,
        });
        r.last_error = Some("dial\n  unix:  refused".into());
        r.last_error_age = Some(std::time::Duration::from_secs(150));
        assert_eq!(
            cells(&r),
            [
                "d",
                "leading",
                "hub-0",
                "0/0/0",
                "1/2",
                "2m ago: dial unix: refused"
            ]
        );
        r.last_error = Some("x".repeat(200));
        r.last_error_age = None;
        let cut = last_error_cell(&r);
        assert_eq!(cut.chars().count(), LAST_ERROR_WIDTH);
        assert!(cut.ends_with('…'), "{cut}");
    }

    #[test]
    fn columns_are_as_wide_as_their_widest_cell_and_lines_end_without_spaces() {
        let cells = [["a-long-driver-name", "s", "-", "0/0/0", "-", "-"].map(str::to_string)];
        let widths = column_widths(&cells);
        assert_eq!(widths, [18, 5, 12, 13, 8, 10]);
        assert_eq!(
            aligned(["d", "s", "", "", "", ""], widths),
            format!("d{}s\n", " ".repeat(19))
        );
        assert_eq!(
            aligned(["d", "s", "h", "q", "a", "e r r"], [1; 6]),
            "d  s  h  q  a  e r r\n"
        );
    }

    #[test]
    fn a_drivers_notes_come_in_order_each_on_one_line() {
        let mut r = bare("d");
        assert!(notes(&r).is_empty());
        r.state = "failed".into();
        r.reason = Some("no\nsocket".into());
        r.guard_unavailable = Some("forbidden:\n  list leases".into());
        r.attachments = Some(Counts {
            attached: 0,
            total: 3,
            failing: 2,
        });
        assert_eq!(
            notes(&r),
            [
                "d: failed: no socket",
                "d: lease guard unavailable: forbidden: list leases",
                "d: 2 VolumeAttachment(s) with an attach error",
            ]
        );
    }

    #[test]
    fn the_attached_total_needs_every_driver_counted() {
        let counted = |attached, total| Row {
            attachments: Some(Counts {
                attached,
                total,
                failing: 0,
            }),
            ..bare("d")
        };
        assert_eq!(
            attached_total(&[counted(1, 2), counted(3, 3)]).as_deref(),
            Some("\nattached: 4/5 VolumeAttachments\n")
        );
        assert_eq!(attached_total(&[counted(1, 2), bare("e")]), None);
        assert_eq!(attached_total(&[]), None);
    }
}
