//! One client connection: hyper serves each request, and between requests the connection
//! holds no HTTP state at all.
//!
//! **Why.** A hyper HTTP/1 connection keeps its buffers for its whole life: an 8 KiB read
//! buffer (the request's bytes land in its first page) and an 8 KiB write buffer made at its
//! start (the answer's head lands in its first page), two pages of 4 KiB touched per
//! connection, plus its state in the connection task. 10,000 idle keep-alive connections (one
//! `GET /healthz` each, then held, `scripts/bench.sh` (e)) grew the collector's RSS by
//! 118 MiB, 12.4 KB each, where the goal is 64 MiB (nginx frees a keep-alive connection's
//! buffers while it waits, and holds 10,000 in a few MiB). Neither buffer can be shrunk
//! through hyper's settings (its read buffer is at least 8 KiB).
//!
//! **How.** A connection task waits for a request's first bytes with no buffer of its own
//! (readiness, then one read into a buffer made for what arrived), then hands the socket,
//! those bytes first, to a hyper connection made for it (boxed, so the idle task stays small).
//! hyper serves that request and any that follow as it always does. Once every request it
//! took is answered and none has started for [`PARK_AFTER`], the hyper connection, now
//! waiting for a request head, is told to stop keeping alive, which it does at once, without
//! writing anything; it hands the socket back
//! ([`hyper::server::conn::http1::Connection::poll_without_shutdown`],
//! [`hyper::server::conn::http1::Parts`]) with any bytes it read ahead, and is dropped with its
//! buffers: the connection is *parked*. A client that sends its requests back to back (an edge
//! proxy's pool, a benchmark) keeps its hyper connection and pays nothing more; a browser's
//! connection, idle after a beacon or two, is parked a tenth of a second after its answer.
//! The connection is kept when hyper would have kept it: parked by us (hyper itself ends a
//! connection after `Connection: close`, an HTTP/1.0 request, an error or the client's close)
//! with the last request's body read to its end (else the unread bytes would be taken for a
//! request, so it is closed, as hyper may close it). Measured: 10,000 idle connections grow RSS
//! by 17-18 MiB instead of 118 (docs/edge.md, "Idle connections").
//!
//! Nothing changes for a request in progress: hyper serves it exactly as before, with
//! half-close (a request whose body arrived is processed to its end when the client closes
//! its side), the header timeout, limits and drain. Bytes hyper writes that the socket cannot
//! take at once are kept here ([`ConnIo`]) rather than in hyper, so that a hyper connection
//! that stops never holds unsent bytes; they are sent before the connection waits again.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::Router;
use bytes::{Bytes, BytesMut};
use hyper::body::{Frame, Incoming, SizeHint};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;
use tower::Service;

use super::{header_bytes, normalise_path, MAX_HEADER_BYTES};
use crate::error::error_response;

/// How long a hyper connection with every request answered waits for another before it is
/// parked (its buffers freed). Long enough for a client sending back to back (a proxy's
/// pool under load), short enough that a burst of idle connections holds few at once.
pub const PARK_AFTER: Duration = Duration::from_millis(100);

/// Most bytes read while waiting for a request, before hyper reads the rest: a typical
/// beacon's request whole. The buffer is freed once hyper has read them.
const FIRST_READ_BYTES: usize = 4096;

/// A client connection and what serving it needs.
pub(super) struct Connection {
    pub stream: TcpStream,
    pub peer: SocketAddr,
    pub router: Router,
    pub http: Arc<hyper::server::conn::http1::Builder>,
    /// How long the connection may wait for a request (the first, and each after an answer).
    pub idle_timeout: Duration,
    /// Cancelled when the server drains: idle connections close, a request in progress is
    /// answered with `Connection: close`.
    pub draining: CancellationToken,
}

impl Connection {
    /// Serves requests until the client closes, stays idle past the timeout, a request ends
    /// the connection, or the server drains.
    pub async fn run(self) {
        let mut io = ConnIo {
            stream: self.stream,
            read_first: Bytes::new(),
            unsent: Vec::new(),
            sent: 0,
        };
        loop {
            if io.read_first.is_empty() {
                match first_bytes(&io.stream, self.idle_timeout, &self.draining).await {
                    Some(bytes) => io.read_first = bytes,
                    None => return,
                }
            }
            let turn = Arc::new(Turn::default());
            let service = service(self.router.clone(), self.peer, turn.clone());
            let mut conn = Box::new(self.http.serve_connection(TokioIo::new(io), service));
            let drained = self.draining.cancelled();
            tokio::pin!(drained);
            let park = tokio::time::sleep(PARK_AFTER);
            tokio::pin!(park);
            let (mut stopping, mut parked, mut answers_seen) = (false, false, 0);
            let served = std::future::poll_fn(|cx| {
                if !stopping && drained.as_mut().poll(cx).is_ready() {
                    Pin::new(&mut *conn).graceful_shutdown();
                    stopping = true;
                }
                let polled = conn.poll_without_shutdown(cx);
                if polled.is_ready() || stopping {
                    return polled;
                }
                let (requests, answers) = turn.counts();
                if answers != answers_seen {
                    answers_seen = answers;
                    park.as_mut()
                        .reset(tokio::time::Instant::now() + PARK_AFTER);
                }
                if answers > 0 && requests == answers && park.as_mut().poll(cx).is_ready() {
                    // Every request answered and none begun since: hyper waits for a head
                    // (bytes of one may be in its buffer, handed back), so it stops at once.
                    Pin::new(&mut *conn).graceful_shutdown();
                    stopping = true;
                    parked = true;
                    return conn.poll_without_shutdown(cx);
                }
                Poll::Pending
            })
            .await;
            if served.is_err() {
                // A broken request, a timeout, a reset: hyper has answered what it could.
                return;
            }
            let parts = conn.into_parts();
            io = parts.io.into_inner();
            io.put_back(parts.read_buf);
            let flushed = std::future::poll_fn(|cx| io.poll_send_unsent(cx)).await;
            if flushed.is_err() {
                return;
            }
            if !(parked && turn.body_ended.load(Ordering::Acquire)) || self.draining.is_cancelled()
            {
                let _ = tokio::io::AsyncWriteExt::shutdown(&mut io.stream).await;
                return;
            }
        }
    }
}

/// Waits for a request's first bytes, holding no buffer while it waits (one is made when
/// bytes are there); `None` when the client closed, the wait timed out, the server drains, or
/// the socket failed.
async fn first_bytes(
    stream: &TcpStream,
    timeout: Duration,
    draining: &CancellationToken,
) -> Option<Bytes> {
    let deadline = tokio::time::sleep(timeout);
    tokio::pin!(deadline);
    loop {
        // Readiness first: on a starved core the deadline and a request's bytes may be ready
        // in the same poll, and closing on unread bytes resets the connection (the client's
        // request lost: seen as "connection reset" by a load test on a loaded machine).
        tokio::select! {
            biased;
            ready = stream.readable() => ready.ok()?,
            () = &mut deadline => return None,
            () = draining.cancelled() => return None,
        }
        // Read into uninitialised room: what arrived is all that is touched.
        let mut buf = BytesMut::with_capacity(FIRST_READ_BYTES);
        match stream.try_read_buf(&mut buf) {
            Ok(0) => return None,
            Ok(_) => return Some(buf.freeze()),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(_) => return None,
        }
    }
}

/// What the requests of one hyper connection came to, as far as parking it needs.
#[derive(Default)]
struct Turn {
    /// Requests the hyper connection took.
    requests: AtomicU32,
    /// Requests answered (hyper writes an answer's head in the poll that takes it).
    answers: AtomicU32,
    /// The last request's body was read to its end (a request without one: at once).
    body_ended: AtomicBool,
}

impl Turn {
    /// Requests taken and answered.
    fn counts(&self) -> (u32, u32) {
        (
            self.requests.load(Ordering::Acquire),
            self.answers.load(Ordering::Acquire),
        )
    }
}

type ServiceFuture = Pin<
    Box<dyn Future<Output = Result<axum::response::Response, std::convert::Infallible>> + Send>,
>;

/// The service of one hyper connection: the router, with the header limit and path
/// normalisation, noting in `turn` what keep-alive needs to know.
fn service(
    router: Router,
    peer: SocketAddr,
    turn: Arc<Turn>,
) -> impl hyper::service::Service<
    Request<Incoming>,
    Response = axum::response::Response,
    Error = std::convert::Infallible,
    Future = ServiceFuture,
> + Unpin {
    hyper::service::service_fn(move |req: Request<Incoming>| -> ServiceFuture {
        let turn = turn.clone();
        let mut router = router.clone();
        turn.requests.fetch_add(1, Ordering::AcqRel);
        let mut req = req.map(|body| {
            let ended = hyper::body::Body::is_end_stream(&body);
            turn.body_ended.store(ended, Ordering::Release);
            Body::new(Tracked {
                inner: body,
                turn: turn.clone(),
            })
        });
        req.extensions_mut()
            .insert(axum::extract::ConnectInfo(peer));
        Box::pin(async move {
            let response = if header_bytes(&req) > MAX_HEADER_BYTES {
                error_response(
                    StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                    "request headers larger than 16 KiB",
                )
            } else {
                normalise_path(req.uri_mut());
                match router.call(req).await {
                    Ok(response) => response,
                    Err(never) => match never {},
                }
            };
            turn.answers.fetch_add(1, Ordering::AcqRel);
            Ok(response)
        })
    })
}

/// A request body that notes in its [`Turn`] when it was read to its end.
struct Tracked {
    inner: Incoming,
    turn: Arc<Turn>,
}

impl hyper::body::Body for Tracked {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let frame = ready!(Pin::new(&mut self.inner).poll_frame(cx));
        if frame.is_none() || self.inner.is_end_stream() {
            self.turn.body_ended.store(true, Ordering::Release);
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The socket as a hyper connection sees it: bytes already read from it (`read_first`) come
/// first, and what hyper writes that the socket cannot take now is kept (`unsent`) and sent
/// by [`Connection::run`] before it waits again. At most one answer's bytes are kept: every
/// answer of the collector is a body already in memory (the script, a JSON error, metrics).
struct ConnIo {
    stream: TcpStream,
    /// Read from the socket, not yet read by hyper.
    read_first: Bytes,
    /// Written by hyper, not yet taken by the socket from `sent` on.
    unsent: Vec<u8>,
    sent: usize,
}

impl ConnIo {
    /// Puts bytes a hyper connection read and did not use before those not yet read.
    fn put_back(&mut self, read_ahead: Bytes) {
        if read_ahead.is_empty() {
            return;
        }
        if self.read_first.is_empty() {
            self.read_first = read_ahead;
        } else {
            let mut both = BytesMut::with_capacity(read_ahead.len() + self.read_first.len());
            both.extend_from_slice(&read_ahead);
            both.extend_from_slice(&self.read_first);
            self.read_first = both.freeze();
        }
    }

    /// Sends what is kept unsent; ready once nothing is (its memory freed).
    fn poll_send_unsent(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.sent < self.unsent.len() {
            let n = ready!(Pin::new(&mut self.stream).poll_write(cx, &self.unsent[self.sent..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.sent += n;
        }
        if self.unsent.capacity() > 0 {
            self.unsent = Vec::new();
            self.sent = 0;
        }
        Poll::Ready(Ok(()))
    }
}

impl AsyncRead for ConnIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !this.read_first.is_empty() {
            let n = this.read_first.len().min(buf.remaining());
            buf.put_slice(&this.read_first.split_to(n));
            if this.read_first.is_empty() {
                // An empty slice still holds its buffer.
                this.read_first = Bytes::new();
            }
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for ConnIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.poll_send_unsent(cx)?.is_ready() {
            if let Poll::Ready(written) = Pin::new(&mut this.stream).poll_write(cx, buf) {
                return Poll::Ready(written);
            }
        }
        this.unsent.extend_from_slice(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.poll_send_unsent(cx)?.is_ready() {
            if let Poll::Ready(written) = Pin::new(&mut this.stream).poll_write_vectored(cx, bufs) {
                return Poll::Ready(written);
            }
        }
        let mut n = 0;
        for b in bufs {
            this.unsent.extend_from_slice(b);
            n += b.len();
        }
        Poll::Ready(Ok(n))
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.get_mut().poll_send_unsent(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_send_unsent(cx))?;
        Pin::new(&mut this.stream).poll_shutdown(cx)
    }
}
