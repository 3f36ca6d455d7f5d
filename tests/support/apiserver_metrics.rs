//! The API server's own view of its load, read from its `/metrics`: requests
//! served (`apiserver_request_total`, by verb, resource and subresource) and
//! watches held open (`apiserver_longrunning_requests{verb="WATCH"}`).
//!
//! A request is counted when it completes, so a watch that stays open is not
//! in `apiserver_request_total` but in the long-running gauge.

use std::collections::BTreeMap;
use std::fmt;

use kube::Client;

/// What a request did, as the API server labels it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct RequestKind {
    /// `GET`, `LIST`, `WATCH`, `POST`, `PUT`, `PATCH`, `DELETE`, ...
    pub(crate) verb: String,
    /// Plural resource, e.g. `volumeattachments`; empty for non-resource paths (`/metrics`).
    pub(crate) resource: String,
    /// E.g. `status`; empty for the main resource.
    pub(crate) subresource: String,
}

impl RequestKind {
    /// Whether the request changes state (everything but reads and watches).
    pub(crate) fn is_write(&self) -> bool {
        !matches!(
            self.verb.as_str(),
            "GET" | "LIST" | "WATCH" | "HEAD" | "OPTIONS" | "CONNECT"
        )
    }
}

impl fmt::Display for RequestKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.verb, self.resource)?;
        if !self.subresource.is_empty() {
            write!(f, "/{}", self.subresource)?;
        }
        Ok(())
    }
}

/// One reading of the API server's metrics.
#[derive(Clone, Debug, Default)]
pub(crate) struct ApiServerMetrics {
    /// Completed requests so far, summed over the other labels (code, scope, ...).
    pub(crate) requests: BTreeMap<RequestKind, f64>,
    /// Watches open right now, over all resources.
    pub(crate) watches: f64,
}

/// The API server's `/metrics` text, read through `client` (which needs the right to: the
/// admin has it).
pub(crate) async fn metrics_text(client: &Client) -> String {
    client
        .request_text(
            http::Request::get("/metrics")
                .body(Vec::new())
                .expect("a GET request without body is valid"),
        )
        .await
        .unwrap_or_else(|e| panic!("reading the API server's /metrics: {e}"))
}

impl ApiServerMetrics {
    /// Reads `/metrics` through `client` (which needs the right to: the admin has it).
    pub(crate) async fn scrape(client: &Client) -> ApiServerMetrics {
        ApiServerMetrics::parse(&metrics_text(client).await)
    }

    /// Parses the Prometheus text format, keeping the two families of interest.
    pub(crate) fn parse(text: &str) -> ApiServerMetrics {
        let mut out = ApiServerMetrics::default();
        for line in text.lines() {
            let Some((name, labels, value)) = sample(line) else {
                continue;
            };
            match name {
                "apiserver_request_total" => {
                    let kind = RequestKind {
                        verb: label(&labels, "verb"),
                        resource: label(&labels, "resource"),
                        subresource: label(&labels, "subresource"),
                    };
                    *out.requests.entry(kind).or_insert(0.0) += value;
                }
                "apiserver_longrunning_requests" if label(&labels, "verb") == "WATCH" => {
                    out.watches += value;
                }
                _ => {}
            }
        }
        out
    }

    /// Requests completed between `before` and this reading (kinds with none left out).
    pub(crate) fn requests_since(&self, before: &ApiServerMetrics) -> BTreeMap<RequestKind, f64> {
        self.requests
            .iter()
            .filter_map(|(kind, after)| {
                let delta = after - before.requests.get(kind).copied().unwrap_or(0.0);
                (delta > 0.0).then(|| (kind.clone(), delta))
            })
            .collect()
    }
}

fn label(labels: &[(String, String)], key: &str) -> String {
    labels
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.clone())
        .unwrap_or_default()
}

/// One sample line: metric name, labels in order, value.
type SampleLine<'a> = (&'a str, Vec<(String, String)>, f64);

/// Splits `name{k="v",...} value` into its parts; `None` for comments,
/// blank lines and lines that do not parse.
fn sample(line: &str) -> Option<SampleLine<'_>> {
    if line.starts_with('#') || line.trim().is_empty() {
        return None;
    }
    let (name, rest) = match line.find(['{', ' ']) {
        Some(i) => line.split_at(i),
        None => return None,
    };
    let mut labels = Vec::new();
    let rest = if let Some(body) = rest.strip_prefix('{') {
        let mut chars = body.char_indices();
        let mut end = None;
        loop {
            // key
            let mut key = String::new();
            for (i, c) in chars.by_ref() {
                match c {
                    '=' => break,
                    '}' => {
                        end = Some(i);
                        break;
                    }
                    ',' | ' ' => {}
                    c => key.push(c),
                }
            }
            if end.is_some() {
                break;
            }
            // value, quoted, with \" \\ \n escapes
            if chars.next().map(|(_, c)| c) != Some('"') {
                return None;
            }
            let mut value = String::new();
            let mut escaped = false;
            for (_, c) in chars.by_ref() {
                match (escaped, c) {
                    (true, 'n') => {
                        value.push('\n');
                        escaped = false;
                    }
                    (true, c) => {
                        value.push(c);
                        escaped = false;
                    }
                    (false, '\\') => escaped = true,
                    (false, '"') => break,
                    (false, c) => value.push(c),
                }
            }
            labels.push((key, value));
        }
        &body[end? + 1..]
    } else {
        rest
    };
    let value = rest.split_whitespace().next()?.parse().ok()?;
    Some((name, labels, value))
}
