//! Reading a hub: `/drivers` straight from its HTTP endpoint or through the API server's pod
//! proxy, and its VolumeAttachments counted per driver.

use std::collections::BTreeMap;
use std::path::PathBuf;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::{Api, ListParams};
use serde_json::Value;

use super::args::Args;
use super::error::Error;
use super::table::{Counts, count, truncate};

/// Page size when listing VolumeAttachments.
const LIST_PAGE_SIZE: u32 = 500;

/// Where `/drivers` comes from.
pub(crate) enum Source {
    /// Straight from the hub.
    Direct {
        /// `host:port`.
        authority: String,
    },
    /// Through the API server's pod proxy.
    Pod {
        /// The API client.
        client: kube::Client,
        /// The pod's namespace.
        namespace: String,
        /// The pod.
        pod: String,
        /// Its HTTP port.
        port: u16,
    },
}

impl Source {
    pub(crate) fn describe(&self) -> String {
        match self {
            Source::Direct { authority } => format!("http://{authority}/drivers"),
            Source::Pod {
                namespace,
                pod,
                port,
                ..
            } => format!("pod {namespace}/{pod}:{port}/drivers (API server proxy)"),
        }
    }
}

/// `host:port` of an `--address`.
pub(crate) fn authority(address: &str) -> Result<String, Error> {
    let bad = |problem| Error::Address {
        address: address.to_string(),
        problem,
    };
    if address.starts_with("https://") {
        return Err(bad(
            "the hub serves plain HTTP; use http:// (or the pod proxy)",
        ));
    }
    let rest = address.strip_prefix("http://").unwrap_or(address);
    let rest = rest.trim_end_matches('/');
    if rest.contains('/') || rest.contains("://") {
        return Err(bad("expected http://host:port, host:port or :port"));
    }
    let (host, port) = rest
        .rsplit_once(':')
        .ok_or_else(|| bad("no port: expected http://host:port, host:port or :port"))?;
    if port.parse::<u16>().map_or(true, |p| p == 0) {
        return Err(bad("the port must be a number from 1 to 65535"));
    }
    let host = if host.is_empty() { "127.0.0.1" } else { host };
    Ok(format!("{host}:{port}"))
}

/// The API server path of a pod's document `path` (`/drivers`, `/config`), through the pod
/// proxy.
pub fn pod_proxy_path(namespace: &str, pod: &str, port: u16, path: &str) -> String {
    format!("/api/v1/namespaces/{namespace}/pods/{pod}:{port}/proxy{path}")
}

pub(crate) async fn kube_client(kubeconfig: Option<&PathBuf>) -> Result<kube::Client, Error> {
    let config = crate::k8s::client::kube_config(
        kubeconfig.map(PathBuf::as_path),
        crate::k8s::client::Search::KubeconfigFirst,
    )
    .await
    .map_err(|e| Error::KubeConfig(e.into()))?;
    kube::Client::try_from(config).map_err(|e| Error::KubeConfig(e.into()))
}

/// GET `http://<authority><path>` with hyper's HTTP/1 client.
async fn get_direct(authority: &str, path: &str) -> Result<Bytes, Error> {
    let url = format!("http://{authority}{path}");
    let http = |e: Box<dyn std::error::Error + Send + Sync>| Error::Http {
        url: url.clone(),
        source: e,
    };
    let stream = tokio::net::TcpStream::connect(authority)
        .await
        .map_err(|e| http(e.into()))?;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .map_err(|e| http(e.into()))?;
    let connection = tokio::spawn(async move {
        // Ends with the response (the request asks to close); its error, if
        // any, is the request's too.
        let _ = conn.await;
    });
    let request = http::Request::get(path)
        .header(http::header::HOST, authority)
        .header(http::header::CONNECTION, "close")
        .body(Empty::<Bytes>::new())
        .map_err(|e| http(e.into()))?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| http(e.into()))?;
    let status = response.status();
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(|e| http(e.into()))?
        .to_bytes();
    connection.abort();
    if status != http::StatusCode::OK {
        return Err(Error::Status {
            url,
            status: status.as_u16(),
            body: truncate(String::from_utf8_lossy(&body).trim(), 200),
        });
    }
    Ok(body)
}

async fn get_drivers(source: &Source) -> Result<Vec<Value>, Error> {
    get_document(source, "/drivers").await
}

/// A JSON document of the hub at `path` (`/drivers`, `/config`).
async fn get_document<T: serde::de::DeserializeOwned>(
    source: &Source,
    path: &str,
) -> Result<T, Error> {
    let (url, body) = match source {
        Source::Direct { authority } => (source.describe(), get_direct(authority, path).await?),
        Source::Pod {
            client,
            namespace,
            pod,
            port,
        } => {
            let request = http::Request::get(pod_proxy_path(namespace, pod, *port, path))
                .body(Vec::new())
                .map_err(|e| Error::Http {
                    url: source.describe(),
                    source: e.into(),
                })?;
            let text = client
                .request_text(request)
                .await
                .map_err(|e| Error::Proxy {
                    namespace: namespace.clone(),
                    pod: pod.clone(),
                    source: e,
                })?;
            (source.describe(), Bytes::from(text))
        }
    };
    serde_json::from_slice(&body).map_err(|e| Error::Document { url, source: e })
}

async fn count_attachments(
    client: &kube::Client,
    selector: Option<&str>,
) -> Result<BTreeMap<String, Counts>, Error> {
    let api: Api<VolumeAttachment> = Api::all(client.clone());
    let mut all = Vec::new();
    let mut params = ListParams::default().limit(LIST_PAGE_SIZE);
    if let Some(s) = selector {
        params = params.labels(s);
    }
    loop {
        let page = api
            .list(&params)
            .await
            .map_err(Error::ListVolumeAttachments)?;
        let next = page.metadata.continue_.clone().filter(|c| !c.is_empty());
        all.extend(page.items);
        match next {
            Some(token) => params = params.continue_token(&token),
            None => break,
        }
    }
    Ok(count(&all))
}

/// One look at the hub.
pub(crate) struct Snapshot {
    /// The `/drivers` entries.
    pub(crate) drivers: Vec<Value>,
    /// VolumeAttachments per driver, when counted.
    pub(crate) counts: Option<BTreeMap<String, Counts>>,
    /// The `/config` document, when the hub serves one (older hubs do not).
    pub(crate) config: Option<Value>,
    /// Why VolumeAttachments were not counted with a configuration found by the usual search.
    pub(crate) uncounted: Option<String>,
}

/// Who counts the VolumeAttachments.
pub(crate) struct Counter {
    /// A client of the API server.
    pub(crate) client: kube::Client,
    /// Found by the usual search rather than asked for (`--kubeconfig`, `--pod`): when it
    /// cannot count, the table goes without counts (as it would without any configuration)
    /// instead of failing, and says why.
    pub(crate) implicit: bool,
}

pub(crate) async fn snapshot(
    source: &Source,
    counter: Option<&Counter>,
    args: &Args,
) -> Result<Snapshot, Error> {
    let timeout = args.request_timeout;
    let within = |what: String| Error::Timeout { what, timeout };
    let drivers = tokio::time::timeout(timeout, get_drivers(source))
        .await
        .map_err(|_| within(source.describe()))??;
    let mut uncounted = None;
    let counts = match counter {
        Some(counter) => {
            let counted = tokio::time::timeout(
                timeout,
                count_attachments(&counter.client, args.selector.as_deref()),
            )
            .await
            .map_err(|_| within("listing VolumeAttachments".to_string()))
            .and_then(|r| r);
            match counted {
                Ok(counts) => Some(counts),
                Err(e) if counter.implicit => {
                    uncounted = Some(e.one_line());
                    None
                }
                Err(e) => return Err(e),
            }
        }
        None => None,
    };
    let config = tokio::time::timeout(timeout, get_document::<Value>(source, "/config"))
        .await
        .ok()
        .and_then(Result::ok)
        .filter(|c| c.is_object());
    Ok(Snapshot {
        drivers,
        counts,
        config,
        uncounted,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_http_endpoints() {
        assert_eq!(authority("http://10.0.0.1:8080/").unwrap(), "10.0.0.1:8080");
        assert_eq!(authority("hub.local:9000").unwrap(), "hub.local:9000");
        assert_eq!(authority(":8080").unwrap(), "127.0.0.1:8080");
        for bad in [
            "https://h:1",
            "h",
            "h:0",
            "h:x",
            "http://h:1/drivers",
            "unix:///s",
        ] {
            let e = authority(bad).expect_err(bad).to_string();
            assert!(e.starts_with(&format!("--address {bad:?}: ")), "{e}");
        }
        assert_eq!(
            pod_proxy_path("ns", "hub-0", 8080, "/drivers"),
            "/api/v1/namespaces/ns/pods/hub-0:8080/proxy/drivers"
        );
    }
}
