//! A server frozen as its clients see it, while it goes on running: a TCP proxy in front of a
//! real server that, while frozen, accepts connections and then reads nothing, forwards
//! nothing and answers nothing (the kernel holds what clients send, as it does for a
//! SIGSTOPped process or a black-holed address), and once thawed forwards what was held and
//! goes on.
//!
//! Why not SIGSTOP the server itself (issue 38): a ClickHouse replica frozen for longer than
//! the stack's ZooKeeper session timeout (10 s, scripts/stack.sh) loses its session, and after
//! the thaw ClickHouse 18.16 re-initializes it only when each table's restarting thread next
//! runs: measured 0 to 70 s per replica after a 12 s freeze, with the table read-only
//! meanwhile. A test of the collector's drain against a frozen cluster then waited on that
//! instead (in a CI run, 20 ids were still missing on the replica it reads 120 s after the
//! collector's restart). Production's 30 s session timeout
//! (deploy/clickhouse/cluster.xml) rides out such a freeze; so does a replica behind this
//! proxy.

use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// The proxy; stops when dropped (its connections with it).
pub struct Freezable {
    /// Its URL (`http://127.0.0.1:PORT`), to give the client instead of the server's.
    pub url: String,
    frozen: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Freezable {
    /// Starts it on a free loopback port in front of the server at `upstream` (an
    /// `http://HOST:PORT` URL), not frozen.
    pub async fn start(upstream: &str) -> Freezable {
        let address: SocketAddr = upstream
            .trim_start_matches("http://")
            .trim_end_matches('/')
            .parse()
            .unwrap_or_else(|e| panic!("{upstream}: not http://IP:PORT: {e}"));
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the proxy");
        let url = format!("http://{}", listener.local_addr().unwrap());
        let (frozen, watching) = watch::channel(false);
        let task = tokio::spawn(async move {
            let mut connections = tokio::task::JoinSet::new();
            while let Ok((client, _)) = listener.accept().await {
                connections.spawn(serve(client, address, watching.clone()));
            }
        });
        Freezable { url, frozen, task }
    }

    /// Stops forwarding: from now on nothing is read from, or sent to, either side.
    pub fn freeze(&self) {
        self.frozen.send_replace(true);
    }

    /// Forwards again, what was held first.
    pub fn thaw(&self) {
        self.frozen.send_replace(false);
    }
}

impl Drop for Freezable {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Returns once not frozen (at once if not).
async fn thawed(frozen: &mut watch::Receiver<bool>) {
    // An error means the proxy is gone: nothing to wait for.
    let _ = frozen.wait_for(|f| !*f).await;
}

/// One client connection: connected to the server once thawed, then both directions.
async fn serve(client: TcpStream, upstream: SocketAddr, mut frozen: watch::Receiver<bool>) {
    thawed(&mut frozen).await;
    let Ok(server) = TcpStream::connect(upstream).await else {
        return;
    };
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    tokio::join!(
        pump(client_read, server_write, frozen.clone()),
        pump(server_read, client_write, frozen),
    );
}

/// Copies `from` to `to` while not frozen, and passes on the end of the stream.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut frozen: watch::Receiver<bool>,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        thawed(&mut frozen).await;
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        // What was read just as the freeze began waits for the thaw too.
        thawed(&mut frozen).await;
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
    let _ = to.shutdown().await;
}
