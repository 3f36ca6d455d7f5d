//! The body of a response: HTTP/2 DATA frames (each one's flow-control window given back as it
//! is handed on; trailers ignored), or hyper's HTTP/1.1 body. Each HTTP/2 body is bounded: a
//! frame within the read bound of the previous one, and a watch's whole stream within its
//! deadline.

use std::{
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};

use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};
use tokio::time::{Instant, Sleep};

use super::conn::Conn;

/// Why a response body failed on our side.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    /// No DATA for longer than the read bound.
    #[error("no data from the API server for {0:?}")]
    Silent(Duration),
    /// A watch outlived its server-side timeout by more than the slack.
    #[error("the watch ran past its deadline")]
    PastDeadline,
    /// The stream or the connection failed.
    #[error(transparent)]
    H2(#[from] h2::Error),
}

/// A response body.
pub struct ResponseBody {
    /// Which protocol carries it.
    kind: Kind,
}

/// [`ResponseBody`]'s variants.
enum Kind {
    /// An HTTP/2 stream.
    H2(Box<H2Body>),
    /// An HTTP/1.1 body (bounded by the connection's read timeout).
    Http1(hyper::body::Incoming),
}

/// An HTTP/2 response body.
struct H2Body {
    /// The stream.
    recv: h2::RecvStream,
    /// Keeps the connection open while the body streams.
    _conn: Arc<Conn>,
    /// Longest silence between two frames.
    bound: Duration,
    /// Fires after `bound` without a frame.
    silent: Pin<Box<Sleep>>,
    /// Fires at the stream's deadline (watches only).
    deadline: Option<Pin<Box<Sleep>>>,
}

impl ResponseBody {
    pub(crate) fn h2(
        recv: h2::RecvStream,
        conn: Arc<Conn>,
        bound: Duration,
        deadline: Option<Instant>,
    ) -> Self {
        Self {
            kind: Kind::H2(Box::new(H2Body {
                recv,
                _conn: conn,
                bound,
                silent: Box::pin(tokio::time::sleep(bound)),
                deadline: deadline.map(|at| Box::pin(tokio::time::sleep_until(at))),
            })),
        }
    }

    pub(crate) fn http1(body: hyper::body::Incoming) -> Self {
        Self {
            kind: Kind::Http1(body),
        }
    }
}

impl std::fmt::Debug for ResponseBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self.kind {
            Kind::H2(_) => "ResponseBody::H2",
            Kind::Http1(_) => "ResponseBody::Http1",
        })
    }
}

impl Body for ResponseBody {
    type Data = Bytes;
    type Error = tower::BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        match &mut self.get_mut().kind {
            Kind::Http1(body) => Pin::new(body).poll_frame(cx).map_err(Into::into),
            Kind::H2(body) => body.poll_data(cx).map_err(Into::into),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Http1(body) => body.is_end_stream(),
            Kind::H2(body) => body.recv.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Http1(body) => body.size_hint(),
            Kind::H2(_) => SizeHint::default(),
        }
    }
}

impl H2Body {
    fn poll_data(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        if let Some(deadline) = &mut self.deadline
            && deadline.as_mut().poll(cx).is_ready()
        {
            return Poll::Ready(Some(Err(BodyError::PastDeadline)));
        }
        loop {
            return match self.recv.poll_data(cx) {
                // An empty DATA frame (the one that carries END_STREAM, often) is nothing to hand on.
                Poll::Ready(Some(Ok(data))) if data.is_empty() => continue,
                Poll::Ready(Some(Ok(data))) => {
                    // Handed on now: the server may send as much again.
                    let _ = self.recv.flow_control().release_capacity(data.len());
                    self.silent.as_mut().reset(Instant::now() + self.bound);
                    Poll::Ready(Some(Ok(Frame::data(data))))
                }
                Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e.into()))),
                // The end of the data; trailers, if any, carry nothing the API client reads.
                Poll::Ready(None) => Poll::Ready(None),
                Poll::Pending => {
                    if self.silent.as_mut().poll(cx).is_ready() {
                        return Poll::Ready(Some(Err(BodyError::Silent(self.bound))));
                    }
                    Poll::Pending
                }
            };
        }
    }
}
