//! What an attacher's log says about the run's infrastructure (the API server,
//! the machine), as opposed to the attacher's own decisions.
//!
//! The reference can fail too: on a busy machine the Go attacher's own API
//! calls time out (`markAsDetached` shares the `--timeout` context with the
//! ControllerUnpublish call before it, so a slow CSI call leaves the PATCH
//! only the rest of those 2 s), a watch is cut, the API server answers 429 or
//! 5xx. What either attacher does next (an extra ControllerUnpublish, an error
//! saved in the status, a retry the other side did not need) depends on that
//! accident, not on its logic. So does a JSON Patch refused because the
//! attacher's cache lagged behind its own last write (422). A scenario whose outcomes differ while either
//! side's log shows such an error is run again (see `differential.rs`); the
//! lines found are quoted in the report.
//!
//! The Go attacher's log also shows the one deliberate difference of spec
//! 3.12 at work: a VA re-attached from a stale cache after it was attached
//! (its own PATCH's watch event re-queues the VA before the `attached: true`
//! event arrives). [`stale_reattaches`] finds them.

use std::collections::{BTreeMap, BTreeSet};

/// At most this many lines are kept per scenario and side, for the report.
const MAX_LINES: usize = 3;

/// Longest quoted line in the report (lines with a URL and an object dump
/// can be several kilobytes).
const MAX_LINE_CHARS: usize = 300;

/// Phrases the API server (or etcd behind it) uses for an answer that is about
/// its own health or load, not the request: 429, 500, 503 and 504 answers.
const SERVER_TROUBLE: &[&str] = &[
    "the server was unable to return a response in the time allotted",
    "Timeout: request did not complete within",
    "the server is currently unable to handle the request",
    "the server has received too many requests",
    "Too many requests",
    "TooManyRequests",
    "Internal error occurred",
    "etcdserver: ",
    "has prevented the request from succeeding",
];

/// A JSON Patch whose `test` failed because the attacher built it from a cache
/// that lags behind the API server (422: the PV finalizer patches of
/// `docs/design.md#pv-finalizer`). On a loaded machine the watch lags seconds behind the
/// attacher's own writes; Go then fails the attach and saves this text in
/// `attachError` until its informer catches up (the hub reads the PV live and
/// goes on, see docs/differences.md). Which attempt hits the lag is timing.
const STALE_CACHE: &[&str] = &["the server rejected our request due to an error in our request"];

/// Phrases of a broken or slow connection, as Go's `net/http` and `http2`
/// packages and client-go's rate limiter word them. In the Go log they count
/// only on a line that names an `https://` URL, so a CSI call's
/// `rpc error: code = DeadlineExceeded desc = context deadline exceeded`
/// (which is scenario behaviour: the mock's delay faults) never counts.
const GO_TRANSPORT: &[&str] = &[
    "context deadline exceeded",
    "context canceled",
    "connection reset by peer",
    "connection refused",
    "broken pipe",
    "unexpected EOF",
    ": EOF",
    "i/o timeout",
    "TLS handshake timeout",
    "http2: ",
    "use of closed network connection",
    "net/http: request canceled",
    "Client.Timeout exceeded",
];

/// Lines of client-go that are about the transport whatever else they say.
const GO_ALWAYS: &[&str] = &[
    // The client-side rate limiter gives up when the caller's deadline is
    // closer than the next token: a busy machine, not a decision.
    "would exceed context deadline",
    "client rate limiter Wait returned an error",
    // client-go's REST client timed out reading an answer (no URL in it).
    "unexpected error when reading response body",
    "stream error when reading response body",
    // A reflector's list or watch failed (it re-lists with backoff).
    "Failed to watch",
    "failed to list",
];

/// The hub's wording of the same troubles (kube's error variants for the
/// transport, our own request deadline, a failed shared watch).
const HUB_TRANSPORT: &[&str] = &[
    "no answer within",
    "ServiceError",
    "HyperError",
    "client error (",
    "error trying to connect",
    "connection reset",
    "connection closed",
    "operation timed out",
    "watch failed",
];

/// Which attacher wrote a log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Side {
    Go,
    Hub,
}

/// Whether one log line reports an infrastructure error.
pub(crate) fn is_infra_line(side: Side, line: &str) -> bool {
    if SERVER_TROUBLE
        .iter()
        .chain(STALE_CACHE)
        .any(|p| line.contains(p))
    {
        return true;
    }
    match side {
        Side::Go => {
            GO_ALWAYS.iter().any(|p| line.contains(p))
                || (line.contains("https://") && GO_TRANSPORT.iter().any(|p| line.contains(p)))
        }
        Side::Hub => HUB_TRANSPORT.iter().any(|p| line.contains(p)),
    }
}

/// Whether an error of the test's own API calls (creating objects, reading
/// them back) is a transport or server-load error, as kube-rs words them.
pub(crate) fn is_infra_failure(text: &str) -> bool {
    is_infra_line(Side::Hub, text)
}

/// The scenario a log line is about: the longest scenario name `s` such that
/// the line names an object `<run tag>-<s>-<role>`; `None` for lines about
/// no scenario's object (a watch, the process).
fn scenario_of<'a>(line: &str, run_tag: &str, scenarios: &'a [String]) -> Option<&'a str> {
    let prefix = format!("{run_tag}-");
    let mut best: Option<&str> = None;
    for (at, _) in line.match_indices(&prefix) {
        let rest = &line[at + prefix.len()..];
        for s in scenarios {
            let named = rest.len() > s.len()
                && rest.starts_with(s.as_str())
                && rest[s.len()..].starts_with('-');
            if named && best.is_none_or(|b| s.len() > b.len()) {
                best = Some(s);
            }
        }
    }
    best
}

fn shorten(line: &str) -> String {
    let line = line.trim();
    if line.chars().count() <= MAX_LINE_CHARS {
        return line.to_string();
    }
    let cut: String = line.chars().take(MAX_LINE_CHARS).collect();
    format!("{cut}…")
}

/// Infrastructure error lines of one attacher's log, per scenario (by name).
/// A line that names no scenario's object (a failed watch, a rate-limiter
/// refusal) can delay any of them, so it is listed for every scenario.
pub(crate) fn by_scenario(
    side: Side,
    log: &str,
    run_tag: &str,
    scenarios: &[String],
) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut everyone = Vec::new();
    for line in log.lines().filter(|l| is_infra_line(side, l)) {
        match scenario_of(line, run_tag, scenarios) {
            Some(s) => out.entry(s.to_string()).or_default().push(shorten(line)),
            None => everyone.push(shorten(line)),
        }
    }
    for s in scenarios {
        let lines = out.entry(s.clone()).or_default();
        lines.extend(everyone.iter().cloned());
        lines.truncate(MAX_LINES);
    }
    out.retain(|_, v| !v.is_empty());
    out
}

/// Object names of VAs the Go attacher re-attached after it had attached them,
/// with no detach in between: its log has an `"Attaching"` line for the VA
/// after an `"Attached"` one. That is the stale re-attach of
/// `docs/design.md#own-writes` (or, in the
/// reconciler's batch, a forced re-sync, which the hub makes too).
pub(crate) fn stale_reattaches(go_log: &str) -> BTreeSet<String> {
    let mut attached: BTreeSet<String> = BTreeSet::new();
    let mut again = BTreeSet::new();
    for line in go_log.lines() {
        let Some(name) = go_va_name(line) else {
            continue;
        };
        if line.contains("\"Attaching\"") {
            if attached.contains(name) {
                again.insert(name.to_string());
            }
        } else if line.contains("\"Attached\"") {
            attached.insert(name.to_string());
        } else if line.contains("\"Detaching\"") {
            attached.remove(name);
        }
    }
    again
}

/// The `VolumeAttachment="<name>"` value of a klog structured line.
fn go_va_name(line: &str) -> Option<&str> {
    const KEY: &str = "VolumeAttachment=\"";
    let start = line.find(KEY)? + KEY.len();
    let len = line[start..].find('"')?;
    Some(&line[start..start + len])
}

#[cfg(test)]
mod tests {
    use super::*;

    const GO_PATCH_TIMEOUT: &str = r#"I1201 10:00:01.000000   42 csi_handler.go:300] "Error processing" VolumeAttachment="go-b-1-va-recreated-other-node-va" err="failed to detach: could not mark as detached: Patch \"https://127.0.0.1:40001/apis/storage.k8s.io/v1/volumeattachments/go-b-1-va-recreated-other-node-va\": context deadline exceeded""#;
    const GO_CSI_TIMEOUT: &str = r#"I1201 10:00:01.000000   42 csi_handler.go:300] "Error processing" VolumeAttachment="go-b-1-slow-va" err="failed to attach: rpc error: code = DeadlineExceeded desc = context deadline exceeded""#;

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_string()).collect()
    }

    #[test]
    fn an_api_timeout_counts_and_a_csi_timeout_does_not() {
        assert!(is_infra_line(Side::Go, GO_PATCH_TIMEOUT));
        assert!(!is_infra_line(Side::Go, GO_CSI_TIMEOUT));
        assert!(is_infra_line(
            Side::Go,
            r#"E1201 reflector.go:200] "Failed to watch" err="an error on the server (\"\") has prevented the request from succeeding""#
        ));
        assert!(is_infra_line(
            Side::Go,
            r#"I1201 "Error processing" err="client rate limiter Wait returned an error: rate: Wait(n=1) would exceed context deadline""#
        ));
        assert!(is_infra_line(
            Side::Hub,
            "WARN sync failed; retrying with backoff error=ServiceError: PATCH volumeattachments/x: no answer within 30s"
        ));
        assert!(is_infra_line(
            Side::Hub,
            "WARN sync failed error=the server was unable to return a response in the time allotted, but may still be processing the request"
        ));
        assert!(!is_infra_line(
            Side::Hub,
            "WARN sync failed; retrying with backoff error=rpc error: code = DeadlineExceeded desc = context deadline exceeded"
        ));
        assert!(is_infra_failure(
            "creating VA va: ServiceError: client error (Connect)"
        ));
        assert!(is_infra_line(
            Side::Go,
            "could not mark as detached: unexpected error when reading response body. Please retry. Original error: context deadline exceeded"
        ));
        assert!(is_infra_line(
            Side::Go,
            r#"I1201 "Error processing" err="failed to attach: could not add PersistentVolume finalizer: the server rejected our request due to an error in our request""#
        ));
        assert!(!is_infra_failure(
            "VA va: no status.attached=true within 45s"
        ));
    }

    #[test]
    fn lines_go_to_the_scenario_they_name_the_longest_name_first() {
        let scenarios = names(&["va", "va-recreated-other-node", "slow"]);
        let log = format!("{GO_PATCH_TIMEOUT}\n{GO_CSI_TIMEOUT}\n");
        let found = by_scenario(Side::Go, &log, "go-b-1", &scenarios);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found["va-recreated-other-node"].len(), 1);
    }

    #[test]
    fn a_line_about_no_scenario_counts_for_all_of_them() {
        let scenarios = names(&["a", "b"]);
        let log = r#"E1201 reflector.go:200] "Failed to watch" err="Get \"https://127.0.0.1:1/apis\": unexpected EOF""#;
        let found = by_scenario(Side::Go, log, "go-b-1", &scenarios);
        assert_eq!(found.keys().collect::<Vec<_>>(), ["a", "b"]);
    }

    #[test]
    fn a_reattach_after_attached_is_found_and_a_new_cycle_is_not() {
        let line =
            |msg: &str, va: &str| format!(r#"I1201 x.go:1] "{msg}" VolumeAttachment="{va}""#);
        let log = [
            line("Attaching", "r-s-va"),
            line("Attached", "r-s-va"),
            line("Attaching", "r-s-va"),
            line("Attaching", "r-t-va"),
            line("Attached", "r-t-va"),
            line("Detaching", "r-t-va"),
            line("Attaching", "r-t-va"),
        ]
        .join("\n");
        assert_eq!(
            stale_reattaches(&log),
            BTreeSet::from(["r-s-va".to_string()])
        );
    }
}
