//! The few requests of ZooKeeper's client protocol (ClickHouse Keeper speaks the same) that the
//! container checks send to see who may read and change the replication metadata: a session,
//! `addauth digest USER:PASSWORD`, `getChildren` and `create`. Each request waits for its one
//! answer (at most [`TIMEOUT`]), so no watch and no pipelining is needed.
//!
//! Wire format (ZooKeeper's `zookeeper.jute`): every packet is a big-endian `int` length and
//! that many bytes; strings and buffers are an `int` length and the bytes. A reply starts with
//! `xid`, `zxid` and `err` (`int`, `long`, `int`).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// Bound of each exchange (connect, request, answer).
pub const TIMEOUT: Duration = Duration::from_secs(5);

/// ZooKeeper's error code for a request the node's ACL does not allow (`NOAUTH`).
pub const NO_AUTH: i32 = -102;

const OP_CREATE: i32 = 1;
const OP_GET_CHILDREN: i32 = 8;
const OP_AUTH: i32 = 100;
/// The `xid` ZooKeeper gives an auth packet.
const AUTH_XID: i32 = -4;
/// `perms` of `ALL` (read, write, create, delete, admin).
const PERMS_ALL: i32 = 31;

/// What a request came back with: its data, or ZooKeeper's error code (e.g. [`NO_AUTH`]).
pub type Answer<T> = Result<T, i32>;

/// A client session on one server.
pub struct Session {
    stream: TcpStream,
    xid: i32,
}

fn put_str(out: &mut Vec<u8>, s: &[u8]) {
    out.extend((s.len() as i32).to_be_bytes());
    out.extend(s);
}

impl Session {
    /// Opens a session on 127.0.0.1:`port` (timeout 10 s, no password). Errors: the
    /// connection or the handshake failed.
    pub fn open(port: u16) -> Result<Session, String> {
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
        let stream = TcpStream::connect_timeout(&addr, TIMEOUT).map_err(|e| e.to_string())?;
        stream.set_read_timeout(Some(TIMEOUT)).ok();
        stream.set_write_timeout(Some(TIMEOUT)).ok();
        let mut session = Session { stream, xid: 0 };
        // ConnectRequest: protocolVersion, lastZxidSeen, timeOut, sessionId, passwd, readOnly.
        let mut req = vec![];
        req.extend(0i32.to_be_bytes());
        req.extend(0i64.to_be_bytes());
        req.extend(10_000i32.to_be_bytes());
        req.extend(0i64.to_be_bytes());
        put_str(&mut req, &[0; 16]);
        req.push(0);
        session.send(&req)?;
        let answer = session.receive()?;
        if answer.len() < 16 {
            return Err(format!("a short handshake answer ({} bytes)", answer.len()));
        }
        Ok(session)
    }

    fn send(&mut self, body: &[u8]) -> Result<(), String> {
        let mut packet = (body.len() as i32).to_be_bytes().to_vec();
        packet.extend(body);
        self.stream.write_all(&packet).map_err(|e| e.to_string())
    }

    fn receive(&mut self) -> Result<Vec<u8>, String> {
        let mut len = [0; 4];
        self.stream
            .read_exact(&mut len)
            .map_err(|e| e.to_string())?;
        let len = usize::try_from(i32::from_be_bytes(len)).map_err(|e| e.to_string())?;
        let mut body = vec![0; len];
        self.stream
            .read_exact(&mut body)
            .map_err(|e| e.to_string())?;
        Ok(body)
    }

    /// Sends request `op` with `body` and reads its reply: the bytes after the header, or
    /// the error code. Errors (outer): the connection failed or the reply is not this
    /// request's.
    fn call(&mut self, xid: i32, op: i32, body: &[u8]) -> Result<Answer<Vec<u8>>, String> {
        let mut req = xid.to_be_bytes().to_vec();
        req.extend(op.to_be_bytes());
        req.extend(body);
        self.send(&req)?;
        let reply = self.receive()?;
        if reply.len() < 16 {
            return Err(format!("a short reply ({} bytes)", reply.len()));
        }
        let got = i32::from_be_bytes(reply[0..4].try_into().unwrap());
        if got != xid {
            return Err(format!("a reply to xid {got}, not {xid}"));
        }
        let err = i32::from_be_bytes(reply[12..16].try_into().unwrap());
        Ok(if err == 0 {
            Ok(reply[16..].to_vec())
        } else {
            Err(err)
        })
    }

    fn next_xid(&mut self) -> i32 {
        self.xid += 1;
        self.xid
    }

    /// `addauth digest IDENTITY` (`USER:PASSWORD`). ZooKeeper takes any identity: a wrong one
    /// only gives no right.
    pub fn add_digest(&mut self, identity: &str) -> Result<Answer<()>, String> {
        let mut body = 0i32.to_be_bytes().to_vec();
        put_str(&mut body, b"digest");
        put_str(&mut body, identity.as_bytes());
        Ok(self.call(AUTH_XID, OP_AUTH, &body)?.map(|_| ()))
    }

    /// The names of `path`'s children, or the error code.
    pub fn children(&mut self, path: &str) -> Result<Answer<Vec<String>>, String> {
        let mut body = vec![];
        put_str(&mut body, path.as_bytes());
        body.push(0);
        let xid = self.next_xid();
        match self.call(xid, OP_GET_CHILDREN, &body)? {
            Ok(data) => parse_names(&data).map(Ok),
            Err(code) => Ok(Err(code)),
        }
    }

    /// Creates the persistent node `path` (empty, ACL world:anyone ALL), or the error code.
    pub fn create(&mut self, path: &str) -> Result<Answer<()>, String> {
        let mut body = vec![];
        put_str(&mut body, path.as_bytes());
        put_str(&mut body, b"");
        body.extend(1i32.to_be_bytes());
        body.extend(PERMS_ALL.to_be_bytes());
        put_str(&mut body, b"world");
        put_str(&mut body, b"anyone");
        body.extend(0i32.to_be_bytes());
        let xid = self.next_xid();
        Ok(self.call(xid, OP_CREATE, &body)?.map(|_| ()))
    }
}

/// A `vector<ustring>`: a count, then each string.
fn parse_names(data: &[u8]) -> Result<Vec<String>, String> {
    let int = |at: usize| -> Result<usize, String> {
        let bytes = data
            .get(at..at + 4)
            .ok_or_else(|| format!("a list cut short at byte {at}"))?;
        usize::try_from(i32::from_be_bytes(bytes.try_into().unwrap())).map_err(|e| e.to_string())
    };
    let (mut names, mut at) = (vec![], 4);
    for _ in 0..int(0)? {
        let len = int(at)?;
        let name = data
            .get(at + 4..at + 4 + len)
            .ok_or_else(|| format!("a name cut short at byte {at}"))?;
        names.push(String::from_utf8_lossy(name).into_owned());
        at += 4 + len;
    }
    Ok(names)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_list_of_names_is_read_and_a_short_one_refused() {
        let data = [0, 0, 0, 2, 0, 0, 0, 2, b'r', b'1', 0, 0, 0, 0];
        assert_eq!(
            super::parse_names(&data),
            Ok(vec!["r1".into(), String::new()])
        );
        assert!(super::parse_names(&data[..9]).is_err());
    }
}
