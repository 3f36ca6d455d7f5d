//! One-line texts of failed Kubernetes API requests, for log lines, `/drivers` and
//! `attacher-hub status`: the HTTP code, the reason and the server's message, never a `Debug`
//! dump of the API server's `Status` (kube's own `Display` of an API error carries one).
//!
//! ```text
//! cannot get Lease kube-system/external-attacher-leader-pd-csi-storage-gke-io: 403 Forbidden: no grant to get leases.coordination.k8s.io in namespace kube-system; add a Role and RoleBinding there like deploy/base/rbac/role.yaml
//! 429 TooManyRequests: throttled by the API server (retry after 1s)
//! ```
//!
//! A refusal (`403`) names the grant that is missing when the caller says what it asked
//! ([`Grant`]): the verb, the resource, the namespace, and the component or chart value that
//! grants it. A `429` says the API server throttles. Any other failure of a request is
//! `<code> <reason>: <message>`, the message on one line and cut at [`MAX_MESSAGE`]
//! characters (a proxy may answer with a whole HTML page).

use std::error::Error;

/// Longest server message kept in a one-line text, in characters.
pub const MAX_MESSAGE: usize = 200;

/// What kube calls the reason of an error answer whose body is not a `Status`.
const UNPARSED_REASON: &str = "Failed to parse error data";

/// What a request needed: the grant a `403` refused, and what gives it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Grant<'a> {
    /// The verb (`get`, `list`, `watch`, `create`, `update`, `patch`, `delete`).
    pub verb: &'a str,
    /// The resource with its API group: `leases.coordination.k8s.io`.
    pub resource: &'a str,
    /// The namespace; `None` for all namespaces (or a cluster-scoped resource).
    pub namespace: Option<&'a str>,
    /// What grants it: a kustomize component, a chart value, a Role to add.
    pub granted_by: &'a str,
}

impl std::fmt::Display for Grant<'_> {
    /// `no grant to <verb> <resource> in namespace <ns>; <granted_by>`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "no grant to {} {}", self.verb, self.resource)?;
        match self.namespace {
            Some(ns) => write!(f, " in namespace {ns}")?,
            None => f.write_str(" cluster-wide")?,
        }
        write!(f, "; {}", self.granted_by)
    }
}

/// `error` and its causes on one line, `: `-separated, each cause once: a cause whose text
/// the error's own already repeats is not written again, and the first API error of the
/// chain ends it, written by [`status_line`] (`grant`: what a `403` refused).
pub fn one_line(error: &(dyn Error + 'static), grant: Option<&Grant<'_>>) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut current: Option<&(dyn Error + 'static)> = Some(error);
    while let Some(e) = current {
        if let Some(status) = api_status(e) {
            parts.push(status_line(status, grant));
            break;
        }
        let mut text = e.to_string();
        // thiserror's `{source}` in a message: the cause follows as its own part.
        if let Some(source) = e.source() {
            let source_text = source.to_string();
            if !source_text.is_empty()
                && let Some(at) = text.find(&source_text)
            {
                text.truncate(at);
            }
        }
        let text = collapse(text.trim_end_matches([':', ' ', '(']));
        if !text.is_empty() && parts.last() != Some(&text) {
            parts.push(text);
        }
        current = e.source();
    }
    parts.join(": ")
}

/// The API server's answer, when `error` is one: a kube API error or the `Status` it carries
/// (a watch reports an error event as a bare `Status`).
fn api_status<'a>(error: &'a (dyn Error + 'static)) -> Option<&'a kube::core::Status> {
    if let Some(kube::Error::Api(status)) = error.downcast_ref::<kube::Error>() {
        return Some(status);
    }
    error.downcast_ref::<kube::core::Status>().or_else(|| {
        error
            .downcast_ref::<Box<kube::core::Status>>()
            .map(|b| &**b)
    })
}

/// One API error answer on one line: `<code> <reason>: <message>`; a `403` with the grant it
/// lacks (when known), a `429` as throttled.
pub fn status_line(status: &kube::core::Status, grant: Option<&Grant<'_>>) -> String {
    let code = status.code;
    let parsed = status.reason != UNPARSED_REASON;
    let reason = if parsed && !status.reason.is_empty() {
        status.reason.clone()
    } else {
        // The body was not a Status (a proxy's page, plain text): the HTTP reason phrase.
        http_reason(code).to_string()
    };
    let head = if code == 0 {
        reason
    } else {
        format!("{code} {reason}").trim_end().to_string()
    };
    match (code, grant) {
        (403, Some(grant)) => format!("{head}: {grant}"),
        (429, _) => {
            let after = status
                .details
                .as_ref()
                .map(|d| d.retry_after_seconds)
                .filter(|s| *s > 0)
                .map_or_else(String::new, |s| format!(" (retry after {s}s)"));
            format!("{head}: throttled by the API server{after}")
        }
        _ => {
            let message = collapse(&status.message);
            if message.is_empty() {
                head
            } else {
                format!("{head}: {}", cut(&message, MAX_MESSAGE))
            }
        }
    }
}

/// The reason phrase of an HTTP status code (`""` for an unknown one).
fn http_reason(code: u16) -> &'static str {
    http::StatusCode::from_u16(code)
        .ok()
        .and_then(|c| c.canonical_reason())
        .unwrap_or("")
}

/// `text` on one line: runs of whitespace (newlines included) become one space.
fn collapse(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// `text` cut to at most `max` characters, `...` marking a cut.
fn cut(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_string();
    }
    let kept: String = text.chars().take(max.saturating_sub(3)).collect();
    format!("{}...", kept.trim_end())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(code: u16, reason: &str, message: &str) -> kube::Error {
        kube::Error::Api(
            kube::core::Status::failure(message, reason)
                .with_code(code)
                .boxed(),
        )
    }

    const LIST_LEASES: Grant<'static> = Grant {
        verb: "list",
        resource: "leases.coordination.k8s.io",
        namespace: None,
        granted_by: "add deploy/components/lease-guard (chart: rbac.leaseGuard=true)",
    };

    /// What kube's own `Display` would have written: a `Debug` dump.
    fn assert_one_line_without_debug(text: &str) {
        assert!(!text.contains('\n'), "{text}");
        for dump in [
            "Status {",
            "ErrorResponse {",
            "StatusDetails {",
            "Some(",
            "ApiError",
        ] {
            assert!(!text.contains(dump), "{dump} in {text}");
        }
    }

    #[test]
    fn a_refusal_names_the_missing_grant_and_what_grants_it() {
        let e = api(
            403,
            "Forbidden",
            "leases.coordination.k8s.io is forbidden: User \"system:serviceaccount:default:csi-attacher\" cannot list resource \"leases\" in API group \"coordination.k8s.io\" at the cluster scope",
        );
        let text = one_line(&e, Some(&LIST_LEASES));
        assert_eq!(
            text,
            "403 Forbidden: no grant to list leases.coordination.k8s.io cluster-wide; add deploy/components/lease-guard (chart: rbac.leaseGuard=true)"
        );
        assert_one_line_without_debug(&text);
        // Without the request's grant: the server's message.
        let text = one_line(&e, None);
        assert!(
            text.starts_with("403 Forbidden: leases.coordination.k8s.io is forbidden: User"),
            "{text}"
        );
        assert_one_line_without_debug(&text);
    }

    #[test]
    fn throttling_says_throttled() {
        let mut status = kube::core::Status::failure(
            "Too many requests, please try again later.",
            "TooManyRequests",
        )
        .with_code(429);
        status.details = Some(kube::core::response::StatusDetails {
            name: String::new(),
            group: String::new(),
            kind: String::new(),
            uid: String::new(),
            causes: Vec::new(),
            retry_after_seconds: 1,
        });
        let text = one_line(&kube::Error::Api(status.boxed()), Some(&LIST_LEASES));
        assert_eq!(
            text,
            "429 TooManyRequests: throttled by the API server (retry after 1s)"
        );
    }

    #[test]
    fn a_body_that_is_no_status_is_cut_to_one_line_with_the_http_reason() {
        // What kube makes of a proxy's HTML page.
        let page = format!(
            "<html>\n<head><title>502 Bad Gateway</title></head>\n<body>{}</body>\n</html>",
            "x".repeat(2_000)
        );
        let text = one_line(&api(502, UNPARSED_REASON, &page), None);
        assert!(text.starts_with("502 Bad Gateway: <html> <head>"), "{text}");
        assert!(text.chars().count() < MAX_MESSAGE + 30, "{text}");
        assert!(text.ends_with("..."), "{text}");
        assert_one_line_without_debug(&text);
    }

    /// A wrapper whose message repeats its cause, as thiserror's `{source}` or kube-runtime's
    /// watcher errors do.
    #[derive(Debug, thiserror::Error)]
    #[error("failed to perform initial object list: {0}")]
    struct Listing(#[source] kube::Error);

    /// A wrapper that names its step only, as this crate's errors do.
    #[derive(Debug, thiserror::Error)]
    #[error("cannot get Lease kube-system/l")]
    struct Step(#[source] Listing);

    #[test]
    fn a_chain_names_each_step_once_and_ends_with_the_api_answer() {
        let e = Step(Listing(api(
            503,
            "ServiceUnavailable",
            "the server is currently unable to handle the request",
        )));
        let text = one_line(&e, None);
        assert_eq!(
            text,
            "cannot get Lease kube-system/l: failed to perform initial object list: 503 ServiceUnavailable: the server is currently unable to handle the request"
        );
        // A bare Status (a watch's error event).
        let status = kube::core::Status::failure("too old resource version: 1 (5)", "Expired")
            .with_code(410);
        assert_eq!(
            one_line(&status, None),
            "410 Expired: too old resource version: 1 (5)"
        );
        // Errors without an API answer keep their text.
        let e = kube::Error::Service("no answer within 10s".into());
        assert_eq!(one_line(&e, None), "ServiceError: no answer within 10s");
    }

    #[test]
    fn the_grant_names_its_namespace() {
        let g = Grant {
            verb: "get",
            resource: "leases.coordination.k8s.io",
            namespace: Some("kube-system"),
            granted_by: "add a Role and RoleBinding there like deploy/base/rbac/role.yaml",
        };
        assert_eq!(
            g.to_string(),
            "no grant to get leases.coordination.k8s.io in namespace kube-system; add a Role and RoleBinding there like deploy/base/rbac/role.yaml"
        );
    }
}
