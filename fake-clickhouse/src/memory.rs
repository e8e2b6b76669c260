//! An in-memory ClickHouse: enough of its HTTP interface for the writer, the prober and the
//! schema check, with the faults the in-process tests need.
//!
//! What it answers, and from where it is taken (ClickHouse's HTTP interface documentation and
//! what the real 18.16 and 26.9 servers answered in `tests/tests/`):
//! - `INSERT INTO measurements (...) FORMAT RowBinary` into [`Table::DATABASE`], naming
//!   every column of [`Table::COLUMNS`] in order (else code 81 or 16), with `decompress=1`:
//!   the body is
//!   ClickHouse's compressed-block framing (16-byte CityHash128 checksum, method byte `0x82`
//!   for LZ4, compressed size including the 9-byte header, decompressed size, then one LZ4
//!   block; the checksum is not checked); rows are decoded with the collector's own RowBinary
//!   decoder ([`Table::decode`]), so the encoding is checked against the decoder, not
//!   against a server. A batch whose `insert_deduplication_token` was seen before is answered 200 and not stored again,
//!   as a replicated table does within its deduplication window (here without end:
//!   [`TokenMemory`]).
//! - A refused row (its [`Table::url`] contains [`ClickHouse::poison`]) fails the whole
//!   INSERT with `500` and `Code: 27. DB::Exception: ...`, as ClickHouse refuses a batch that holds one row
//!   it cannot take.
//! - The prober's `SELECT version() ..., count() FROM system.columns` and its
//!   `system.replicas` query: RowBinary rows of the shape the writer reads without validation;
//!   the table always has every column (the schema-missing path is left to real servers).
//! - Anything else (the schema's `CREATE`/`ALTER`): 200, empty.
//!
//! Faults: [`Fault::Refuse`] answers `503` to everything (a server that is up but failing),
//! [`Fault::Hang`] reads the request and never answers (a frozen server), and
//! [`ClickHouse::set_lagging`] makes the replica report a replication queue.
//! [`ClickHouse::lose_answers`] stores the next INSERTs and answers them as failed (an answer
//! lost after the insert landed); [`ClickHouse::insert_log`] lists every INSERT taken.

use std::marker::PhantomData;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::Request;

use crate::request::{param, params};
use crate::serve::{answer, Answer, Server};
use crate::tokens::TokenMemory;

/// The table the fake holds: its database, its columns and how its RowBinary rows decode
/// (the collector's own decoder: the fake knows nothing of the rows but through it).
pub trait Table: Send + Sync + 'static {
    /// One decoded row.
    type Row: Clone + Send + 'static;
    /// The database the table is in (`COLLECTOR_CLICKHOUSE_DATABASE`).
    const DATABASE: &'static str;
    /// The table's columns, in order.
    const COLUMNS: &'static [&'static str];
    /// The rows of an uncompressed RowBinary body, or why it does not decode.
    fn decode(raw: &[u8]) -> Result<Vec<Self::Row>, String>;
    /// A row's `url`, which [`ClickHouse::poison`] looks in.
    fn url(row: &Self::Row) -> &str;
}

/// A fault the server shows until it is cleared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Answers normally.
    None,
    /// Answers `503` with a ClickHouse exception text to every request.
    Refuse,
    /// Reads each request and never answers it.
    Hang,
}

struct State<R> {
    fault: Fault,
    lagging: bool,
    poison: Option<String>,
    rows: Vec<R>,
    tokens: Arc<TokenMemory>,
    inserts: u64,
    refused_inserts: u64,
    probes: u64,
    /// Every INSERT that decoded and was not refused, in order.
    log: Vec<InsertRecord>,
    /// INSERTs still to store and then answer as failed ([`ClickHouse::lose_answers`]).
    lose_answers: u64,
    /// How long each INSERT takes before it is answered ([`ClickHouse::set_insert_delay`]).
    insert_delay: std::time::Duration,
}

/// One INSERT the server took (decoded, not refused), for [`ClickHouse::insert_log`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InsertRecord {
    /// Rows it held.
    pub rows: usize,
    /// Its `insert_deduplication_token` had been seen: answered 200, nothing stored.
    pub folded: bool,
    /// Stored, but answered as failed ([`ClickHouse::lose_answers`]).
    pub answer_lost: bool,
}

/// One in-memory ClickHouse server on `127.0.0.1:0` holding table `T`. Cheap to clone; stops
/// when its last clone is dropped or with the runtime.
pub struct ClickHouse<T: Table> {
    url: String,
    state: Arc<Mutex<State<T::Row>>>,
    _server: Arc<Server>,
    _table: PhantomData<T>,
}

impl<T: Table> Clone for ClickHouse<T> {
    fn clone(&self) -> Self {
        ClickHouse {
            url: self.url.clone(),
            state: self.state.clone(),
            _server: self._server.clone(),
            _table: PhantomData,
        }
    }
}

impl<T: Table> ClickHouse<T> {
    /// Starts a server that answers as a healthy, caught-up replica.
    pub async fn start() -> Self {
        let state = Arc::new(Mutex::new(State {
            fault: Fault::None,
            lagging: false,
            poison: None,
            rows: Vec::new(),
            tokens: TokenMemory::with_window(usize::MAX),
            inserts: 0,
            refused_inserts: 0,
            probes: 0,
            log: Vec::new(),
            lose_answers: 0,
            insert_delay: std::time::Duration::ZERO,
        }));
        let server = Server::start(state.clone(), |state, req| async move {
            Ok::<_, String>(handle::<T>(&state, req).await)
        })
        .await;
        ClickHouse {
            url: server.url(),
            state,
            _server: Arc::new(server),
            _table: PhantomData,
        }
    }

    /// The URL to give `COLLECTOR_CLICKHOUSE_URLS`.
    pub fn url(&self) -> String {
        self.url.clone()
    }

    /// Sets the fault shown from now on.
    pub fn set_fault(&self, fault: Fault) {
        self.state.lock().unwrap().fault = fault;
    }

    /// Whether the replica reports a replication queue (`inserts_in_queue` 3): the
    /// catch-up check fails while it does.
    pub fn set_lagging(&self, lagging: bool) {
        self.state.lock().unwrap().lagging = lagging;
    }

    /// Refuses every INSERT holding a row whose `url` contains `marker` (code 27).
    pub fn poison(&self, marker: &str) {
        self.state.lock().unwrap().poison = Some(marker.to_owned());
    }

    /// Every stored row, in insert order.
    pub fn rows(&self) -> Vec<T::Row> {
        self.state.lock().unwrap().rows.clone()
    }

    /// INSERTs answered 200 (first sends and folded resends).
    pub fn inserts(&self) -> u64 {
        self.state.lock().unwrap().inserts
    }

    /// INSERTs refused as bad data.
    pub fn refused_inserts(&self) -> u64 {
        self.state.lock().unwrap().refused_inserts
    }

    /// Probe queries answered (`SELECT version() ...`).
    pub fn probes(&self) -> u64 {
        self.state.lock().unwrap().probes
    }

    /// Every INSERT taken (decoded, not refused), in order: its rows, whether its token
    /// folded it, whether its answer was lost.
    pub fn insert_log(&self) -> Vec<InsertRecord> {
        self.state.lock().unwrap().log.clone()
    }

    /// Each INSERT from now on is answered after `delay` (a slow server that still answers).
    pub fn set_insert_delay(&self, delay: std::time::Duration) {
        self.state.lock().unwrap().insert_delay = delay;
    }

    /// The next `n` INSERTs that store rows store them and then answer `500` (code 209, a
    /// socket timeout: transient), as when the answer of a landed insert is lost. A resend
    /// with the same token is folded (answered 200, not stored again).
    pub fn lose_answers(&self, n: u64) {
        self.state.lock().unwrap().lose_answers = n;
    }
}

fn text(status: u16, body: impl Into<Bytes>) -> Answer {
    answer(status, &[], body)
}

/// Appends a ClickHouse `String` in RowBinary: LEB128 length, bytes.
fn put_string(out: &mut Vec<u8>, s: &str) {
    let mut n = s.len();
    loop {
        let byte = (n & 0x7f) as u8;
        n >>= 7;
        if n == 0 {
            out.push(byte);
            break;
        }
        out.push(byte | 0x80);
    }
    out.extend_from_slice(s.as_bytes());
}

/// Undoes ClickHouse's compressed-block framing (LZ4 blocks only; checksums not checked).
fn decompress(mut body: &[u8]) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    while !body.is_empty() {
        if body.len() < 25 {
            return Err(format!("a block header cut short: {} bytes", body.len()));
        }
        let method = body[16];
        if method != 0x82 {
            return Err(format!("compression method {method:#x}, not LZ4"));
        }
        let compressed = u32::from_le_bytes(body[17..21].try_into().unwrap()) as usize;
        let size = u32::from_le_bytes(body[21..25].try_into().unwrap()) as usize;
        if compressed < 9 || body.len() < 16 + compressed {
            return Err(format!(
                "a block of {compressed} bytes, {} left",
                body.len()
            ));
        }
        let block = &body[25..16 + compressed];
        let data = lz4_flex::block::decompress(block, size).map_err(|e| e.to_string())?;
        out.extend_from_slice(&data);
        body = &body[16 + compressed..];
    }
    Ok(out)
}

async fn handle<T: Table>(
    state: &Mutex<State<T::Row>>,
    req: Request<hyper::body::Incoming>,
) -> Answer {
    let params = params(req.uri().query());
    let param = |name: &str| param(&params, name);
    let body = match req.into_body().collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => return text(400, format!("cannot read the body: {e}")),
    };
    let fault = state.lock().unwrap().fault;
    match fault {
        Fault::None => {}
        Fault::Refuse => {
            return text(
                503,
                "Code: 242. DB::Exception: Table is in readonly mode (fake)",
            )
        }
        Fault::Hang => std::future::pending::<()>().await,
    }
    let sql = param("query").unwrap_or_else(|| String::from_utf8_lossy(&body).into_owned());
    if sql.starts_with("INSERT INTO measurements") {
        // As a real server would: the table is in the configured database, and the INSERT
        // names every column in the table's order (the rows are RowBinary: by position).
        if param("database").as_deref() != Some(T::DATABASE) {
            return text(
                404,
                format!(
                    "Code: 81. DB::Exception: Database {:?} does not exist (fake)",
                    param("database")
                ),
            );
        }
        let wanted = format!(
            "INSERT INTO measurements ({}) FORMAT RowBinary",
            T::COLUMNS.join(", ")
        );
        if sql.trim() != wanted {
            return text(
                400,
                format!("Code: 16. DB::Exception: the INSERT's columns are not the table's: {sql} (fake)"),
            );
        }
        let delay = state.lock().unwrap().insert_delay;
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        return insert::<T>(
            state,
            &body,
            param("decompress").as_deref() == Some("1"),
            param("insert_deduplication_token"),
        );
    }
    let mut out = Vec::new();
    if sql.contains("SELECT version()") {
        state.lock().unwrap().probes += 1;
        put_string(&mut out, "26.9.1.1");
        out.extend_from_slice(&(T::COLUMNS.len() as u64).to_le_bytes());
    } else if sql.contains("FROM system.replicas") {
        let lagging = state.lock().unwrap().lagging;
        // is_readonly, is_session_expired, log_pointer, log_max_index, inserts_in_queue,
        // absolute_delay.
        out.extend_from_slice(&[0, 0]);
        for v in [1u64, 0, if lagging { 3 } else { 0 }, 0] {
            out.extend_from_slice(&v.to_le_bytes());
        }
    }
    text(200, out)
}

fn insert<T: Table>(
    state: &Mutex<State<T::Row>>,
    body: &[u8],
    compressed: bool,
    token: Option<String>,
) -> Answer {
    let raw = if compressed {
        match decompress(body) {
            Ok(raw) => raw,
            Err(e) => {
                return text(
                    500,
                    format!("Code: 271. DB::Exception: cannot decompress: {e} (fake)"),
                )
            }
        }
    } else {
        body.to_vec()
    };
    let rows = match T::decode(&raw) {
        Ok(rows) => rows,
        Err(e) => {
            return text(
                500,
                format!("Code: 33. DB::Exception: Cannot read all data: {e} (fake)"),
            )
        }
    };
    let mut s = state.lock().unwrap();
    if let Some(marker) = &s.poison {
        if rows.iter().any(|r| T::url(r).contains(marker.as_str())) {
            s.refused_inserts += 1;
            return text(
                500,
                "Code: 27. DB::Exception: Cannot parse input: a poisoned row (fake)",
            );
        }
    }
    let n = rows.len();
    let folded = token.is_some_and(|token| !s.tokens.remember(&token));
    let answer_lost = !folded && s.lose_answers > 0;
    s.log.push(InsertRecord {
        rows: n,
        folded,
        answer_lost,
    });
    if !folded {
        s.rows.extend(rows);
    }
    if answer_lost {
        s.lose_answers -= 1;
        return text(
            500,
            "Code: 209. DB::Exception: Timeout exceeded while writing to socket (fake: stored, answer lost)",
        );
    }
    s.inserts += 1;
    text(200, "")
}
