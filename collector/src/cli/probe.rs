//! `collector probe`: the container health check.

use super::{failed, RunError};
use crate::config::Config;

/// `collector probe`: `GET /readyz` on the operations listener (`COLLECTOR_ADMIN_LISTEN`; an
/// unspecified address such as `0.0.0.0` is probed on loopback), 2 s at most.
pub async fn run(config: &Config) -> Result<(), RunError> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut addr = config.server.admin_listen;
    if addr.ip().is_unspecified() {
        addr.set_ip(if addr.is_ipv4() {
            std::net::Ipv4Addr::LOCALHOST.into()
        } else {
            std::net::Ipv6Addr::LOCALHOST.into()
        });
    }
    let check = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await?;
        stream
            .write_all(b"GET /readyz HTTP/1.0\r\nHost: probe\r\n\r\n")
            .await?;
        let mut head = [0u8; 12];
        stream.read_exact(&mut head).await?;
        Ok::<_, std::io::Error>(head)
    };
    match tokio::time::timeout(std::time::Duration::from_secs(2), check).await {
        Ok(Ok(head)) if head.ends_with(b" 200") => Ok(()),
        Ok(Ok(head)) => Err(failed(format!(
            "{addr}: /readyz answered {}",
            String::from_utf8_lossy(&head)
        ))),
        Ok(Err(e)) => Err(failed(format!("{addr}: {e}"))),
        Err(_) => Err(failed(format!("{addr}: no answer within 2 s"))),
    }
}
