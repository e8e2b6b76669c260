//! A loopback HTTP/1.1 server running one handler, stopped when dropped.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;

/// An answer of the servers of this crate.
pub type Answer = Response<Full<Bytes>>;

/// What a handler returns: an answer, or an error that closes the connection without one
/// (a connection cut before the answer, as a client sees it).
pub type Outcome = Result<Answer, String>;

/// A running server; stops accepting, and ends its open connections, when dropped.
pub struct Server {
    /// Its address on 127.0.0.1.
    pub addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Server {
    /// Binds a free port on 127.0.0.1 and serves every request with `handler`, each
    /// connection in a task of its own. Panics when no port can be bound (a test fixture).
    pub async fn start<S, F, Fut>(state: Arc<S>, handler: F) -> Server
    where
        S: Send + Sync + 'static,
        F: Fn(Arc<S>, Request<Incoming>) -> Fut + Send + Sync + Copy + 'static,
        Fut: Future<Output = Outcome> + Send + 'static,
    {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a loopback port for a fake ClickHouse server");
        let addr = listener.local_addr().expect("the bound address");
        let task = tokio::spawn(async move {
            // Dropped with this task when the server is: every connection ends with it.
            let mut connections = tokio::task::JoinSet::new();
            loop {
                while connections.try_join_next().is_some() {}
                // An accept that fails (out of file descriptors) is tried again shortly.
                let stream = match listener.accept().await {
                    Ok((stream, _)) => stream,
                    Err(_) => {
                        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                        continue;
                    }
                };
                let state = state.clone();
                connections.spawn(async move {
                    let service =
                        hyper::service::service_fn(move |req| handler(state.clone(), req));
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Server { addr, task }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// An answer with `status`, `headers` and `body`.
pub fn answer(status: u16, headers: &[(&str, String)], body: impl Into<Bytes>) -> Answer {
    let mut resp = Response::builder().status(status);
    for (k, v) in headers {
        resp = resp.header(*k, v);
    }
    resp.body(Full::new(body.into()))
        .expect("a status and headers of this crate are valid")
}
