//! Opening a spool: its folder made and locked, every segment recovered, what an earlier
//! release left held to today's rules, and its threads started ([`open`], [`open_shard`]).

use super::*;

/// Opens (creating if needed) the spool in `dir`, recovers it, and starts the appender thread.
///
/// `layouts` says which layout of rows the appender is given and the writer must receive,
/// and how rows of an earlier layout left by an earlier release become it ([`Layouts`]).
/// Recovery cuts torn tails, deletes confirmed segments, and leaves every unconfirmed record
/// for the reader, which starts at the cursor. Opening an existing spool needs no free space:
/// when no new segment can be made (a full disk), the spool opens unwritable (see the module
/// doc) and the reader still delivers what it holds.
pub fn open(
    dir: &Path,
    max_bytes: u64,
    layouts: Layouts,
    metrics: Arc<Metrics>,
) -> Result<(Spool, SpoolReader), OpenError> {
    open_shard(
        dir,
        crate::config::DEFAULT_SHARD,
        max_bytes,
        layouts,
        None,
        metrics,
    )
}

/// [`open`] for the spool of shard `shard` (contract v5 §3: one spool per shard), whose
/// figures are exported with the label `shard` beside the totals. With `rules`, what an
/// earlier release left in the folder is held to them before anything is read (contract v5
/// §5, [`at_rest`]): segments of an earlier layout rewritten, kept-aside files rewritten.
pub fn open_shard(
    dir: &Path,
    shard: &str,
    max_bytes: u64,
    layouts: Layouts,
    rules: Option<&dyn AtRest>,
    metrics: Arc<Metrics>,
) -> Result<(Spool, SpoolReader), OpenError> {
    let err = |e| OpenError::Io(dir.to_owned(), e);
    let lock = lock_folder(dir)?;
    let (cursor_file, recovered) = recover_folder(dir, &layouts, rules, &metrics).map_err(err)?;
    let Recovery {
        mut state,
        cursor,
        last_seen,
        rewritten,
    } = recovered;

    let identity = identity(dir, rewritten).map_err(err)?;
    let (in_flight_file, in_flight) = in_flight_slot(dir);

    // The last segment made: the appender starts sealed on it and makes the next one below
    // (or, if it cannot, stays unwritable while the reader delivers what is here).
    let active = last_seen.max(cursor.segment);
    let active_len = state.segments.get(&active).copied().unwrap_or(HEADER_LEN);
    state.active = active;
    state.sealed = true;
    state.durable = cursor_file.durable;
    let start = reading_start(&state, cursor);
    let replay_bound = replay_bound(in_flight.as_deref(), &identity, start, &state);
    let (committed, committed_rx) = watch::channel(Position {
        segment: active,
        offset: active_len,
    });
    let shared = Arc::new(Shared {
        dir: dir.to_owned(),
        identity,
        max_bytes,
        segment_target: (max_bytes / 8).clamp(SEGMENT_MIN_BYTES, SEGMENT_TARGET_BYTES),
        layouts,
        state: Mutex::new(state),
        committed,
        gauges: metrics.spool.shard(shard),
        metrics,
        unwritable: AtomicU8::new(0),
        _lock: lock,
    });
    shared.set_unwritable(0);
    shared.publish(&shared.state.lock().unwrap());
    let appender = start_threads(&shared, active_len).map_err(err)?;
    let reader = SpoolReader {
        shared: shared.clone(),
        pos: start,
        replay_bound,
        committed: committed_rx,
        open: None,
        cursor: cursor_file,
        in_flight: in_flight_file,
    };
    Ok((Spool { shared, appender }, reader))
}

/// Recovers every segment of `dir` ([`recover_all`]) and, with `rules`, holds what an earlier
/// release left to them ([`hold_to`]); the cursor's file and what recovery found.
fn recover_folder(
    dir: &Path,
    layouts: &Layouts,
    rules: Option<&dyn AtRest>,
    metrics: &Metrics,
) -> io::Result<(Cursor, Recovery)> {
    let (mut cursor_file, cursor) = Cursor::open(dir)?;
    let mut recovered = recover_all(dir, layouts, cursor, &mut cursor_file, metrics)?;
    if let Some(rules) = rules {
        recovered = hold_to(dir, layouts, rules, recovered, &mut cursor_file, metrics)?;
    }
    Ok((cursor_file, recovered))
}

/// The in-flight file of `dir` and what it holds; neither when it cannot be opened (said at
/// debug level: a new spool has none yet).
fn in_flight_slot(dir: &Path) -> (Option<SlotFile>, Option<String>) {
    match SlotFile::open(dir, INFLIGHT_FILE) {
        Ok((file, body)) => (Some(file), body),
        Err(e) => {
            tracing::debug!(error = %e, "spool: no in-flight file yet");
            (None, None)
        }
    }
}

/// The end of the batch that was in flight (`in_flight`, the file's text, of this spool's
/// `identity`), to be replayed as it was. Only a bound that recovery left reachable: it starts
/// where reading starts (`start`) and ends on a record boundary inside what was kept.
fn replay_bound(
    in_flight: Option<&str>,
    identity: &str,
    start: Position,
    state: &State,
) -> Option<Position> {
    in_flight
        .and_then(|body| parse_in_flight(body, identity))
        .filter(|(from, to)| {
            *from == start
                && to > from
                && state
                    .segments
                    .get(&to.segment)
                    .is_some_and(|&len| to.offset <= len)
        })
        .map(|(_, to)| to)
}

/// Makes the folder's layout and takes its lock: one collector per folder. The folder and
/// everything in it are private to the collector's user (see [`files::make_private`]).
fn lock_folder(dir: &Path) -> Result<File, OpenError> {
    let err = |e| OpenError::Io(dir.to_owned(), e);
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    for folder in [dir.join("segments"), dir.join("kept-aside")] {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(files::DIR_MODE)
            .create(folder)
            .map_err(err)?;
    }
    let lock = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(files::FILE_MODE)
        .open(dir.join("LOCK"))
        .map_err(err)?;
    match lock.try_lock_exclusive() {
        Ok(true) => {
            // Ours now: what an earlier release left readable by others is narrowed. A folder
            // the collector's user does not own (a volume made by root) keeps its mode: said,
            // not fatal; every file is still made private.
            if let Err(e) = files::make_private(dir) {
                tracing::warn!(spool = %dir.display(), error = %e, "spool: cannot make the folder private to the collector's user (chmod 0700); its files are 0600 all the same");
            }
            Ok(lock)
        }
        Ok(false) => Err(OpenError::Locked(dir.to_owned())),
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Err(OpenError::Locked(dir.to_owned())),
        Err(e) => Err(err(e)),
    }
}

/// What recovery found: the segments and their counts, the cursor (moved if a rewrite moved
/// its frame), the highest segment number seen, and whether a segment was rewritten.
struct Recovery {
    state: State,
    cursor: Position,
    last_seen: u64,
    rewritten: bool,
}

/// Recovers every segment of `dir` ([`recover_segment`]) and deletes the confirmed ones.
fn recover_all(
    dir: &Path,
    layouts: &Layouts,
    mut cursor: Position,
    cursor_file: &mut Cursor,
    metrics: &Metrics,
) -> io::Result<Recovery> {
    let mut state = State::default();
    let numbers = segment_numbers(dir)?;
    // Numbering goes on past every segment seen, even one deleted below, and past the cursor:
    // a new segment numbered like an earlier one would repeat positions, and with them the
    // insert tokens of batches already sent.
    let last_seen = numbers.last().copied().unwrap_or(0);
    let mut rewritten = false;
    for n in numbers {
        let path = segment_path(dir, n);
        if n < cursor.segment {
            // Everything in it was confirmed by ClickHouse before the cursor moved past it.
            tracing::info!(segment = %path.display(), "spool: deleting a confirmed segment");
            fs::remove_file(&path)?;
            continue;
        }
        let found = recover_segment(
            dir,
            layouts,
            n,
            &mut cursor,
            cursor_file,
            metrics,
            &mut state.received,
        )?;
        let Some(recovered) = found else {
            continue;
        };
        rewritten |= recovered.rewritten;
        state.segments.insert(n, recovered.len);
        state.disk_bytes += recovered.len;
        state.unconfirmed_bytes += recovered.bytes_after;
        state.unconfirmed_records += recovered.records_after;
    }
    if state.unconfirmed_records > 0 {
        tracing::info!(
            segments = state.segments.len(),
            records = state.unconfirmed_records,
            bytes = state.unconfirmed_bytes,
            "spool: replaying what ClickHouse has not confirmed"
        );
    }
    Ok(Recovery {
        state,
        cursor,
        last_seen,
        rewritten,
    })
}

/// Holds what recovery kept to `rules` ([`at_rest`]): rewrites the segments of an earlier
/// layout and counts the folder again if any was, then holds the kept-aside files (a file it
/// cannot rewrite is said and left).
fn hold_to(
    dir: &Path,
    layouts: &Layouts,
    rules: &dyn AtRest,
    recovered: Recovery,
    cursor_file: &mut Cursor,
    metrics: &Metrics,
) -> io::Result<Recovery> {
    let mut cursor = recovered.cursor;
    let recovered =
        if at_rest::rewrite_earlier(dir, layouts.current, rules, &mut cursor, cursor_file)? {
            let again = recover_all(dir, layouts, cursor, cursor_file, metrics)?;
            Recovery {
                last_seen: again.last_seen.max(recovered.last_seen),
                rewritten: true,
                ..again
            }
        } else {
            recovered
        };
    let held = hold_kept_aside(dir, rules)?;
    if held != Held::default() {
        tracing::info!(
            rewritten = held.rewritten,
            deleted = held.deleted,
            rows_dropped = held.rows_dropped,
            "spool: kept-aside files held to the rules of this release"
        );
    }
    Ok(recovered)
}

/// Where reading starts: at the cursor, or at the first segment after it; with nothing to
/// replay, in the segment the appender makes next.
fn reading_start(state: &State, cursor: Position) -> Position {
    match state.segments.range(cursor.segment..).next() {
        Some((&n, _)) if n == cursor.segment => Position {
            segment: n,
            offset: cursor.offset.max(HEADER_LEN),
        },
        Some((&n, _)) => Position {
            segment: n,
            offset: HEADER_LEN,
        },
        None => Position {
            segment: state.active + 1,
            offset: HEADER_LEN,
        },
    }
}

/// Starts the appender (on a fresh segment with room reserved, or unwritable on a full disk),
/// the segment preparer and the watchdog.
fn start_threads(shared: &Arc<Shared>, active_len: u64) -> io::Result<Arc<AppenderHandle>> {
    let groups = Arc::new(Groups::new());
    let preparer = Arc::new(Preparer::new(&shared.dir, shared.segment_target));
    let mut appender = Appender {
        shared: shared.clone(),
        groups: groups.clone(),
        preparer: preparer.clone(),
        file: None,
        size: active_len,
        last_trial: Instant::now(),
        unwritable_since: None,
    };
    if let Err(e) = appender.resume() {
        appender.enter_unwritable(&e, "cannot start a segment at open");
    }
    let mut handle = AppenderHandle {
        groups: groups.clone(),
        preparer: preparer.clone(),
        threads: Vec::with_capacity(3),
    };
    let spawn = |name: &str, f: Box<dyn FnOnce() + Send>| {
        std::thread::Builder::new().name(name.into()).spawn(f)
    };
    handle
        .threads
        .push(spawn("spool-appender", Box::new(move || appender.run()))?);
    handle
        .threads
        .push(spawn("spool-prepare", Box::new(move || preparer.run()))?);
    handle.threads.push(spawn(
        "spool-watchdog",
        Box::new(move || group::watchdog(&groups)),
    )?);
    Ok(Arc::new(handle))
}
