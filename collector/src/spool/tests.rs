//! Unit tests of the spool: format, recovery, group commit, full disk, confirmation.

use std::fs::{self, OpenOptions};
use std::path::Path;

use super::files::*;
use super::format::{encode_earlier_frame, Version, MAGIC_V1};
use super::*;
use crate::measurement::{decode_all, encode, DateTime, Label, Measurement, LAYOUTS};
use uuid::Uuid;

/// A small row whose id and `ttfb_ms` are `n`.
pub(super) fn m(n: u128) -> Measurement<'static> {
    Measurement {
        id: Uuid::from_u128(n),
        site: "s".into(),
        received_at: DateTime(1),
        url: "https://a.b/".into(),
        ts: None,
        referrer: None,
        navigation_type: None,
        ttfb_ms: Some(n as f64),
        fcp_ms: None,
        lcp_ms: None,
        inp_ms: None,
        dom_content_loaded_ms: None,
        load_ms: None,
        cls: None,
        viewport_width: None,
        effective_connection_type: None,
        user_agent: "".into(),
        sample_rate: 1.0,
        // What intake derives from no `ts` and an empty user agent.
        page_view_at: DateTime(1),
        device_type: Label("unknown".into()),
        browser: Label("Other".into()),
        browser_version: Label("".into()),
        os: Label("Other".into()),
        // Not empty: a row's last column, so that a frame never ends in a zero byte, which
        // recovery would count with a prepared segment's zeros (the damage tests need the
        // written end to be the frame's end).
        country: Label("ZZ".into()),
        page_group: Label("/".into()),
        ..Default::default()
    }
}

/// One request's rows, encoded as intake encodes them.
fn rows(ms: &[Measurement<'_>]) -> Record {
    encode(ms)
}

/// The whole frame at `off` of a segment of this release: its payload and the offset after it.
fn frame_at(data: &[u8], off: usize) -> Option<(&[u8], usize)> {
    Version::V5.frame_at(data, off).map(|f| (f.payload, f.next))
}

fn measurements(frame: &Frame) -> Vec<Measurement<'static>> {
    decode_all(&frame.payload).unwrap()
}

fn ids(records: &[Frame]) -> Vec<u128> {
    records
        .iter()
        .flat_map(|r| measurements(r).into_iter().map(|m| m.id.as_u128()))
        .collect()
}

/// Appends a frame of the JSON release (`CSPOOL01`): the rows as a JSON array.
fn v1_frame(data: &mut Vec<u8>, ms: &[Measurement<'_>]) {
    let record = Record {
        layout: 1,
        rows: 0,
        earliest_received_at: 0,
        payload: serde_json::to_vec(ms).unwrap(),
    };
    encode_earlier_frame(data, Version::V1, &record);
}

fn read_all(r: &mut SpoolReader) -> Vec<Frame> {
    let mut out = Vec::new();
    r.read_available(u64::MAX, u64::MAX, &mut out);
    out
}

#[tokio::test]
async fn append_read_confirm_and_replay() {
    let dir = tempfile::tempdir().unwrap();
    let metrics = Arc::new(Metrics::new());
    {
        let (spool, mut reader) = open(dir.path(), 1 << 20, LAYOUTS, metrics.clone()).unwrap();
        spool
            .append(rows(&[m(1), m(2)]), Duration::from_secs(5))
            .await
            .unwrap();
        spool
            .append(rows(&[m(3)]), Duration::from_secs(5))
            .await
            .unwrap();
        let recs = read_all(&mut reader);
        assert_eq!(ids(&recs), [1, 2, 3]);
        assert_eq!(metrics.spool.records.get(), 3);
        reader.confirm(recs[0].end, 2, recs[0].bytes);
        assert_eq!(metrics.spool.records.get(), 1);
    }
    // Reopen: only the unconfirmed record comes back.
    let (_spool, mut reader) = open(dir.path(), 1 << 20, LAYOUTS, metrics.clone()).unwrap();
    assert_eq!(ids(&read_all(&mut reader)), [3]);
    assert_eq!(metrics.spool.records.get(), 1);
}

#[tokio::test]
async fn torn_tail_is_cut_to_the_last_whole_record() {
    let dir = tempfile::tempdir().unwrap();
    let metrics = Arc::new(Metrics::new());
    {
        let (spool, _reader) = open(dir.path(), 1 << 20, LAYOUTS, metrics.clone()).unwrap();
        for n in 1..=3 {
            spool
                .append(rows(&[m(n)]), Duration::from_secs(5))
                .await
                .unwrap();
        }
    }
    let seg = segment_path(dir.path(), 1);
    let len = fs::metadata(&seg).unwrap().len();
    OpenOptions::new()
        .write(true)
        .open(&seg)
        .unwrap()
        .set_len(len - 5)
        .unwrap();
    let (_spool, mut reader) = open(dir.path(), 1 << 20, LAYOUTS, metrics).unwrap();
    assert_eq!(ids(&read_all(&mut reader)), [1, 2]);
    assert!(
        fs::metadata(&seg).unwrap().len() < len - 5,
        "the torn record was cut off"
    );
    assert!(
        !dir.path()
            .join("kept-aside/damaged-00000000000000000001.seg")
            .exists(),
        "a torn tail is what a crash leaves: no copy"
    );
}

#[tokio::test]
async fn corrupt_record_ends_the_segment() {
    let dir = tempfile::tempdir().unwrap();
    let metrics = Arc::new(Metrics::new());
    {
        let (spool, _reader) = open(dir.path(), 1 << 20, LAYOUTS, metrics.clone()).unwrap();
        for n in 1..=3 {
            spool
                .append(rows(&[m(n)]), Duration::from_secs(5))
                .await
                .unwrap();
        }
    }
    let seg = segment_path(dir.path(), 1);
    let mut data = fs::read(&seg).unwrap();
    let last = data.len() - 3;
    data[last] ^= 0xff;
    fs::write(&seg, data).unwrap();
    let (_spool, mut reader) = open(dir.path(), 1 << 20, LAYOUTS, metrics).unwrap();
    assert_eq!(ids(&read_all(&mut reader)), [1, 2]);
    let aside = dir
        .path()
        .join("kept-aside/damaged-00000000000000000001.seg");
    assert!(
        aside.exists(),
        "a whole frame failing its checksum is damage: kept"
    );
}

#[tokio::test]
async fn full_spool_refuses_and_keeps_what_it_has() {
    let dir = tempfile::tempdir().unwrap();
    let metrics = Arc::new(Metrics::new());
    let (spool, mut reader) = open(dir.path(), 2048, LAYOUTS, metrics).unwrap();
    let mut ok = 0;
    let mut full = false;
    for n in 0..100 {
        match spool.append(rows(&[m(n)]), Duration::from_secs(5)).await {
            Ok(()) => ok += 1,
            Err(AppendError::Full) => {
                full = true;
                break;
            }
            Err(e) => panic!("{e}"),
        }
    }
    assert!(full && ok > 0);
    assert!(!spool.has_room(400));
    let recs = read_all(&mut reader);
    assert_eq!(recs.len(), ok);
    let (end, bytes) = (recs.last().unwrap().end, recs.iter().map(|r| r.bytes).sum());
    reader.confirm(end, ok as u64, bytes);
    // Confirming frees the bound: the spool accepts again (the confirmed bytes may stay
    // on disk in the active segment, but they no longer count against the bound).
    assert!(spool.has_room(400), "confirmed records still count");
    spool
        .append(rows(&[m(1000)]), Duration::from_secs(5))
        .await
        .expect("an append after confirming everything");
    let after = read_all(&mut reader);
    assert_eq!(after.len(), 1);
    assert_eq!(measurements(&after[0]), [m(1000)]);
}

#[tokio::test]
async fn segments_rotate_and_confirmed_ones_are_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let metrics = Arc::new(Metrics::new());
    let (spool, mut reader) = open(dir.path(), 1 << 30, LAYOUTS, metrics.clone()).unwrap();
    let big: Vec<Measurement> = (0..50)
        .map(|n| Measurement {
            user_agent: "x".repeat(8000).into(),
            ..m(n)
        })
        .collect();
    let mut appended = 0;
    assert_eq!(spool.shared.segment_target, SEGMENT_TARGET_BYTES);
    while spool.shared.state.lock().unwrap().active == 1 {
        spool
            .append(rows(&big), Duration::from_secs(5))
            .await
            .unwrap();
        appended += 1;
    }
    spool
        .append(rows(&big), Duration::from_secs(5))
        .await
        .unwrap();
    let recs = read_all(&mut reader);
    assert_eq!(recs.len(), appended + 1);
    let bytes = recs.iter().map(|r| r.bytes).sum();
    reader.confirm(recs.last().unwrap().end, 50 * recs.len() as u64, bytes);
    assert!(
        !segment_path(dir.path(), 1).exists(),
        "sealed, confirmed segment deleted"
    );
    assert!(segment_path(dir.path(), 2).exists(), "active segment kept");
    assert_eq!(metrics.spool.records.get(), 0);
    assert_eq!(metrics.spool.bytes.get(), 0);
}

async fn spool_with(dir: &Path, n: u128) {
    let (spool, _reader) = open(dir, 1 << 20, LAYOUTS, Arc::new(Metrics::new())).unwrap();
    for i in 1..=n {
        spool
            .append(rows(&[m(i)]), Duration::from_secs(5))
            .await
            .unwrap();
    }
}

#[tokio::test]
async fn a_damaged_record_in_the_middle_costs_only_itself() {
    let dir = tempfile::tempdir().unwrap();
    spool_with(dir.path(), 5).await;
    let seg = segment_path(dir.path(), 1);
    let mut data = fs::read(&seg).unwrap();
    // Damage the second record's payload and its length field alike.
    let second = {
        let (_, next) = frame_at(&data, HEADER_LEN as usize).unwrap();
        next
    };
    data[second + 12] ^= 0xff;
    data[second] ^= 0x7f;
    fs::write(&seg, &data).unwrap();
    let metrics = Arc::new(Metrics::new());
    let (_spool, mut reader) = open(dir.path(), 1 << 20, LAYOUTS, metrics.clone()).unwrap();
    assert_eq!(ids(&read_all(&mut reader)), [1, 3, 4, 5]);
    assert!(dir
        .path()
        .join("kept-aside/damaged-00000000000000000001.seg")
        .exists());
    assert!(metrics.spool.damaged_bytes.get() > 0);
    assert_eq!(metrics.spool.records.get(), 4);
}

#[tokio::test]
async fn a_damaged_magic_loses_no_record() {
    let dir = tempfile::tempdir().unwrap();
    spool_with(dir.path(), 3).await;
    let seg = segment_path(dir.path(), 1);
    let mut data = fs::read(&seg).unwrap();
    data[0] ^= 0xff;
    fs::write(&seg, &data).unwrap();
    let (_spool, mut reader) =
        open(dir.path(), 1 << 20, LAYOUTS, Arc::new(Metrics::new())).unwrap();
    assert_eq!(ids(&read_all(&mut reader)), [1, 2, 3]);
}

/// A segment of an earlier release (`CSPOOL03`, rows without the attribution columns)
/// whose magic is damaged is still read in its own layout: the earlier versions share their
/// framing, and only the right layout reads its first frame as the header's row count (the
/// rows' owner tells, through `Layouts::upgrade`).
#[tokio::test]
async fn a_damaged_magic_of_a_previous_release_segment_is_read_in_its_layout() {
    let dir = tempfile::tempdir().unwrap();
    fs::create_dir_all(dir.path().join("segments")).unwrap();
    let mut data = super::format::MAGIC_V3.to_vec();
    for batch in [[1u128, 2], [3, 4]] {
        let mut payload = Vec::new();
        for n in batch {
            payload.extend(crate::measurement::tests::encoded_in(&m(n), 3));
        }
        let record = Record {
            layout: 3,
            rows: 2,
            earliest_received_at: 1,
            payload,
        };
        encode_earlier_frame(&mut data, Version::V3, &record);
    }
    data[3] ^= 0xff;
    fs::write(segment_path(dir.path(), 1), &data).unwrap();
    let (_spool, mut reader) =
        open(dir.path(), 1 << 20, LAYOUTS, Arc::new(Metrics::new())).unwrap();
    let frames = read_all(&mut reader);
    assert_eq!(ids(&frames), [1, 2, 3, 4]);
    // Layout 3 has no country nor page group: they read as the columns' defaults.
    let in_layout_3 = |n| Measurement {
        country: Label::default(),
        page_group: Label::default(),
        ..m(n)
    };
    assert_eq!(
        frames.iter().flat_map(measurements).collect::<Vec<_>>(),
        [1, 2, 3, 4].map(in_layout_3)
    );
}

#[tokio::test]
async fn numbering_goes_on_past_the_cursor() {
    let dir = tempfile::tempdir().unwrap();
    let metrics = Arc::new(Metrics::new());
    {
        let (spool, mut reader) = open(dir.path(), 1 << 20, LAYOUTS, metrics.clone()).unwrap();
        spool
            .append(rows(&[m(1)]), Duration::from_secs(5))
            .await
            .unwrap();
        let recs = read_all(&mut reader);
        reader.confirm(recs[0].end, 1, recs[0].bytes);
    }
    for e in fs::read_dir(dir.path().join("segments")).unwrap() {
        fs::remove_file(e.unwrap().path()).unwrap();
    }
    {
        let (spool, _reader) = open(dir.path(), 1 << 20, LAYOUTS, metrics.clone()).unwrap();
        spool
            .append(rows(&[m(2)]), Duration::from_secs(5))
            .await
            .unwrap();
    }
    let (_spool, mut reader) = open(dir.path(), 1 << 20, LAYOUTS, metrics).unwrap();
    assert_eq!(
        ids(&read_all(&mut reader)),
        [2],
        "acknowledged after the files vanished: kept"
    );
}

#[tokio::test]
async fn a_failed_cursor_write_still_frees_the_room() {
    let dir = tempfile::tempdir().unwrap();
    let metrics = Arc::new(Metrics::new());
    let (spool, mut reader) = open(dir.path(), 1 << 20, LAYOUTS, metrics.clone()).unwrap();
    spool
        .append(rows(&[m(1)]), Duration::from_secs(5))
        .await
        .unwrap();
    // A cursor that cannot be written (here: a folder where its file should be).
    let cursor = dir.path().join(CURSOR_FILE);
    fs::remove_file(&cursor).unwrap();
    fs::create_dir(&cursor).unwrap();
    reader.cursor.file = None;
    let recs = read_all(&mut reader);
    reader.confirm(recs[0].end, 1, recs[0].bytes);
    assert_eq!(metrics.spool.records.get(), 0);
    assert_eq!(metrics.spool.bytes.get(), 0);
}

#[tokio::test]
async fn identity_survives_restarts_and_no_two_spools_share_one() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let metrics = Arc::new(Metrics::new());
    let first = open(a.path(), 1 << 20, LAYOUTS, metrics.clone())
        .unwrap()
        .1
        .identity()
        .to_owned();
    let again = open(a.path(), 1 << 20, LAYOUTS, metrics.clone())
        .unwrap()
        .1
        .identity()
        .to_owned();
    let other = open(b.path(), 1 << 20, LAYOUTS, metrics)
        .unwrap()
        .1
        .identity()
        .to_owned();
    assert!(is_identity(&first), "{first}");
    assert_eq!(first, again, "kept across a restart");
    assert_ne!(first, other, "a fresh spool gets its own");
}

#[tokio::test]
async fn the_batch_in_flight_at_a_crash_is_read_again_with_the_same_range() {
    let dir = tempfile::tempdir().unwrap();
    let metrics = Arc::new(Metrics::new());
    let (start, end) = {
        let (spool, mut reader) = open(dir.path(), 1 << 20, LAYOUTS, metrics.clone()).unwrap();
        for n in 1..=2 {
            spool
                .append(rows(&[m(n)]), Duration::from_secs(5))
                .await
                .unwrap();
        }
        let start = reader.position();
        let recs = read_all(&mut reader);
        assert_eq!(recs.len(), 2);
        reader.record_in_flight(start, recs[1].end);
        // More arrives while the batch is in flight; then the process dies unconfirmed.
        spool
            .append(rows(&[m(3)]), Duration::from_secs(5))
            .await
            .unwrap();
        (start, recs[1].end)
    };
    let (_spool, mut reader) = open(dir.path(), 1 << 20, LAYOUTS, metrics.clone()).unwrap();
    assert_eq!(reader.position(), start);
    assert_eq!(reader.replay_bound(), Some(end));
    let recs = read_all(&mut reader);
    assert_eq!(
        ids(&recs),
        [1, 2],
        "cut at the recorded end, not at what is there"
    );
    assert_eq!(recs.last().unwrap().end, end);
    reader.confirm(end, 2, recs.iter().map(|r| r.bytes).sum());
    assert_eq!(reader.replay_bound(), None);
    assert_eq!(ids(&read_all(&mut reader)), [3], "then reading goes on");
}

#[tokio::test]
async fn an_in_flight_record_of_another_identity_or_start_is_ignored() {
    let dir = tempfile::tempdir().unwrap();
    let metrics = Arc::new(Metrics::new());
    {
        let (spool, _reader) = open(dir.path(), 1 << 20, LAYOUTS, metrics.clone()).unwrap();
        spool
            .append(rows(&[m(1)]), Duration::from_secs(5))
            .await
            .unwrap();
    }
    fs::write(
        dir.path().join(INFLIGHT_FILE),
        format!("{} 1 8 1 9\n", "0".repeat(32)),
    )
    .unwrap();
    let (_spool, reader) = open(dir.path(), 1 << 20, LAYOUTS, metrics).unwrap();
    assert_eq!(reader.replay_bound(), None);
}

#[tokio::test]
async fn rewriting_a_damaged_segment_renews_the_identity() {
    let dir = tempfile::tempdir().unwrap();
    spool_with(dir.path(), 3).await;
    let before = fs::read_to_string(dir.path().join(IDENTITY_FILE)).unwrap();
    let seg = segment_path(dir.path(), 1);
    let mut data = fs::read(&seg).unwrap();
    let second = frame_at(&data, HEADER_LEN as usize).unwrap().1;
    data[second + 12] ^= 0xff;
    fs::write(&seg, &data).unwrap();
    let (_spool, reader) = open(dir.path(), 1 << 20, LAYOUTS, Arc::new(Metrics::new())).unwrap();
    assert_ne!(
        reader.identity(),
        before.trim(),
        "positions moved: new tokens"
    );
}

#[tokio::test]
async fn a_copied_spool_folder_gets_an_identity_of_its_own() {
    let dir = tempfile::tempdir().unwrap();
    spool_with(dir.path(), 3).await;
    let original = open(dir.path(), 1 << 20, LAYOUTS, Arc::new(Metrics::new()))
        .unwrap()
        .1
        .identity()
        .to_owned();
    let copy = tempfile::tempdir().unwrap();
    for entry in fs::read_dir(dir.path()).unwrap() {
        let entry = entry.unwrap();
        if entry.file_type().unwrap().is_file() {
            fs::copy(entry.path(), copy.path().join(entry.file_name())).unwrap();
        }
    }
    let (_copied, reader) = open(copy.path(), 1 << 20, LAYOUTS, Arc::new(Metrics::new())).unwrap();
    assert_ne!(
        reader.identity(),
        original,
        "a copy must not share batch tokens"
    );
    drop((_copied, reader));
    let (_again, reader) = open(dir.path(), 1 << 20, LAYOUTS, Arc::new(Metrics::new())).unwrap();
    assert_eq!(reader.identity(), original, "a restart keeps the identity");
}

#[test]
fn an_identity_file_of_an_earlier_release_is_kept() {
    let dir = tempfile::tempdir().unwrap();
    let id = "0123456789abcdef0123456789abcdef";
    fs::write(dir.path().join(IDENTITY_FILE), format!("{id}\n")).unwrap();
    let (_spool, reader) = open(dir.path(), 1 << 20, LAYOUTS, Arc::new(Metrics::new())).unwrap();
    assert_eq!(reader.identity(), id);
    let text = fs::read_to_string(dir.path().join(IDENTITY_FILE)).unwrap();
    assert_eq!(text.lines().count(), 2, "the folder is recorded: {text}");
}

#[test]
fn second_open_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let _guard = rt.enter();
    let metrics = Arc::new(Metrics::new());
    let _first = open(dir.path(), 1 << 20, LAYOUTS, metrics.clone()).unwrap();
    assert!(matches!(
        open(dir.path(), 1 << 20, LAYOUTS, metrics),
        Err(OpenError::Locked(_))
    ));
}

fn received(n: u128, at: u32) -> Measurement<'static> {
    Measurement {
        received_at: DateTime(at),
        ..m(n)
    }
}

fn unix_now() -> u32 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as u32
}

/// The exported value of `collector_spool_oldest_record_age_seconds`.
fn exported_age(metrics: &Metrics) -> f64 {
    let text = metrics.encode();
    text.lines()
        .find_map(|l| l.strip_prefix("collector_spool_oldest_record_age_seconds "))
        .unwrap_or_else(|| panic!("no collector_spool_oldest_record_age_seconds in\n{text}"))
        .parse()
        .unwrap()
}

#[tokio::test]
async fn oldest_unconfirmed_age_follows_confirmations_and_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let metrics = Arc::new(Metrics::new());
    let now = unix_now();
    {
        let (spool, mut reader) = open(dir.path(), 1 << 20, LAYOUTS, metrics.clone()).unwrap();
        assert_eq!(exported_age(&metrics), 0.0, "nothing unconfirmed");
        let limit = Duration::from_secs(5);
        // Records are held from their append: their age counts on the monotonic clock from
        // then, whatever their received_at says (an appended record was received just now).
        spool
            .append(rows(&[received(1, now - 300)]), limit)
            .await
            .unwrap();
        let age = exported_age(&metrics);
        assert!((0.0..1.0).contains(&age), "age {age}");
        let recs = read_all(&mut reader);
        reader.confirm(recs[0].end, 1, recs[0].bytes);
        assert_eq!(exported_age(&metrics), 0.0, "everything confirmed");
        spool
            .append(
                rows(&[received(2, now - 100), received(3, now - 120)]),
                limit,
            )
            .await
            .unwrap();
    }
    // After a restart a recovered record is held from the age its received_at gives, once.
    metrics.spool.oldest_held_since.store(
        crate::metrics::NOTHING_HELD,
        std::sync::atomic::Ordering::Relaxed,
    );
    let (_spool, mut reader) = open(dir.path(), 1 << 20, LAYOUTS, metrics.clone()).unwrap();
    let age = exported_age(&metrics);
    assert!((120.0..125.0).contains(&age), "age after restart {age}");
    let recs = read_all(&mut reader);
    assert_eq!(
        recs.len(),
        1,
        "one frame (records 2 and 3); the confirmed one is gone"
    );
    let last = recs.last().unwrap();
    reader.confirm(last.end, 2, recs.iter().map(|r| r.bytes).sum());
    assert_eq!(exported_age(&metrics), 0.0, "everything confirmed");
}

#[test]
fn held_times_stay_increasing_and_bounded() {
    const S: i64 = 1_000_000_000;
    let at = |offset| Position { segment: 1, offset };
    let mut t = HeldTimes::default();
    for (i, nanos) in [
        10 * S,
        10 * S + 1,
        10 * S + S / 2,
        11 * S,
        11 * S + 5,
        12 * S,
    ]
    .into_iter()
    .enumerate()
    {
        t.appended(at(100 + i as u64), nanos);
    }
    assert_eq!(t.0.len(), 3, "one entry per second: {:?}", t.0);
    // A recovered record held since earlier than the last entries folds them into itself.
    t.appended(at(200), 9 * S);
    assert_eq!(t.oldest(), Some(9 * S));
    assert_eq!(t.0.len(), 1, "{:?}", t.0);
    t.appended(at(300), 20 * S);
    t.confirmed(at(199));
    assert_eq!(t.oldest(), Some(9 * S), "a partly confirmed entry stays");
    t.confirmed(at(200));
    assert_eq!(t.oldest(), Some(20 * S));
    t.confirmed(at(300));
    assert_eq!(t.oldest(), None);
}

/// Makes writes under `dir` fail with `ENOSPC` (or succeed again).
fn set_full(dir: &Path, full: bool) {
    let mut disks = FULL_DISKS.lock().unwrap();
    disks.retain(|d| d != dir);
    if full {
        disks.push(dir.to_owned());
    }
}

/// Waits until the spool can write again; panics after 10 s.
async fn wait_writable(spool: &Spool) {
    let start = Instant::now();
    while let Some(why) = spool.unwritable() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "still unwritable after 10 s: {why}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn segment_numbers(dir: &Path) -> Vec<u64> {
    let mut n: Vec<u64> = fs::read_dir(dir.join("segments"))
        .unwrap()
        .map(|e| {
            let name = e.unwrap().file_name();
            name.to_str()
                .unwrap()
                .strip_suffix(".seg")
                .unwrap()
                .parse()
                .unwrap()
        })
        .collect();
    n.sort_unstable();
    n
}

#[tokio::test]
async fn a_full_disk_refuses_appends_until_space_returns() {
    let dir = tempfile::tempdir().unwrap();
    let metrics = Arc::new(Metrics::new());
    let (spool, mut reader) = open(dir.path(), 1 << 20, LAYOUTS, metrics.clone()).unwrap();
    let limit = Duration::from_secs(5);
    spool.append(rows(&[m(1)]), limit).await.unwrap();
    assert_eq!(spool.unwritable(), None);
    assert_eq!(metrics.spool.disk_full.get(), 0);

    set_full(dir.path(), true);
    assert_eq!(
        spool.append(rows(&[m(2)]), limit).await,
        Err(AppendError::DiskFull)
    );
    assert_eq!(spool.unwritable(), Some("spool cannot write: disk full"));
    assert_eq!(metrics.spool.disk_full.get(), 1);
    // Refused at once while the state lasts, and it lasts past several probes.
    tokio::time::sleep(RETRY_WRITE_INTERVAL * 3).await;
    assert_eq!(
        spool.append(rows(&[m(3)]), limit).await,
        Err(AppendError::DiskFull)
    );
    assert_eq!(metrics.spool.disk_full.get(), 1);

    set_full(dir.path(), false);
    wait_writable(&spool).await;
    assert_eq!(metrics.spool.disk_full.get(), 0);
    spool.append(rows(&[m(4)]), limit).await.unwrap();
    let recs = read_all(&mut reader);
    assert_eq!(ids(&recs), [1, 4], "nothing refused was kept");
    assert_eq!(recs[0].end.segment, 1);
    assert_eq!(
        recs[1].end.segment, 2,
        "the segment whose write failed takes no more: a new one"
    );
    assert_eq!(metrics.spool.records.get(), 2);
}

/// Makes the segment syncs under `dir` fail with `EIO` (or succeed again).
fn set_failing_syncs(dir: &Path, failing: bool) {
    let mut disks = FAILING_SYNCS.lock().unwrap();
    disks.retain(|d| d != dir);
    if failing {
        disks.push(dir.to_owned());
    }
}

/// Issue 39: a disk whose every `fdatasync` fails while writes, `fsync` and `fallocate` work.
/// The trial must sync too, or it passes, the spool turns writable between failed groups and
/// each failed group seals a segment: a new file every trial.
#[tokio::test]
async fn a_disk_whose_syncs_fail_stays_unwritable_in_one_new_segment() {
    let dir = tempfile::tempdir().unwrap();
    let metrics = Arc::new(Metrics::new());
    let (spool, mut reader) = open(dir.path(), 1 << 20, LAYOUTS, metrics.clone()).unwrap();
    let limit = Duration::from_secs(5);
    spool.append(rows(&[m(1)]), limit).await.unwrap();
    assert_eq!(segment_numbers(dir.path()), [1]);

    set_failing_syncs(dir.path(), true);
    assert_eq!(
        spool.append(rows(&[m(2)]), limit).await,
        Err(AppendError::Io)
    );
    // Ten trials, a request between each pair: every one refused, never writable.
    for n in 0..10 {
        tokio::time::sleep(RETRY_WRITE_INTERVAL).await;
        assert_eq!(
            spool.unwritable(),
            Some("spool cannot write: write error (the log names it)"),
            "writable again after {} trials while every sync fails",
            n + 1
        );
        assert_eq!(
            spool.append(rows(&[m(10 + n)]), limit).await,
            Err(AppendError::Io)
        );
    }
    assert_eq!(metrics.spool.disk_full.get(), 1);
    assert_eq!(
        segment_numbers(dir.path()),
        [1, 2],
        "the sealed segment and the one new segment the trials share"
    );

    set_failing_syncs(dir.path(), false);
    wait_writable(&spool).await;
    assert_eq!(metrics.spool.disk_full.get(), 0);
    spool.append(rows(&[m(30)]), limit).await.unwrap();
    let recs = read_all(&mut reader);
    assert_eq!(ids(&recs), [1, 30], "nothing refused was kept");
    assert_eq!(
        (recs[0].end.segment, recs[1].end.segment),
        (1, 2),
        "the first write after the spell lands in the trials' segment, over their zeros"
    );
    drop((spool, reader));
    // The zeros of the trials are no damage: a reopen reads the same two records.
    let (_spool, mut reader) = open(dir.path(), 1 << 20, LAYOUTS, metrics.clone()).unwrap();
    assert_eq!(ids(&read_all(&mut reader)), [1, 30]);
}

#[tokio::test]
async fn a_sealed_segment_goes_once_confirmed_and_numbering_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let metrics = Arc::new(Metrics::new());
    let limit = Duration::from_secs(5);
    {
        let (spool, mut reader) = open(dir.path(), 1 << 20, LAYOUTS, metrics.clone()).unwrap();
        spool.append(rows(&[m(1)]), limit).await.unwrap();
        set_full(dir.path(), true);
        assert!(spool.append(rows(&[m(2)]), limit).await.is_err());
        let recs = read_all(&mut reader);
        assert_eq!(ids(&recs), [1]);
        // Still full: confirming needs no space and deletes the sealed, newest segment.
        reader.confirm(recs[0].end, 1, recs[0].bytes);
        assert_eq!(segment_numbers(dir.path()), [] as [u64; 0]);
        assert_eq!(metrics.spool.disk_bytes.get(), 0);
        assert!(spool.unwritable().is_some());
    }
    // Reopened on the still full disk: opens, unwritable, then writes after the cursor.
    let (spool, mut reader) = open(dir.path(), 1 << 20, LAYOUTS, metrics.clone()).unwrap();
    assert_eq!(spool.unwritable(), Some("spool cannot write: disk full"));
    assert_eq!(metrics.spool.disk_full.get(), 1);
    set_full(dir.path(), false);
    wait_writable(&spool).await;
    spool.append(rows(&[m(3)]), limit).await.unwrap();
    assert_eq!(
        segment_numbers(dir.path()),
        [2],
        "a new number, never one whose ranges were sent"
    );
    assert_eq!(ids(&read_all(&mut reader)), [3]);
}

#[tokio::test]
async fn opening_on_a_full_disk_delivers_what_the_spool_holds() {
    let dir = tempfile::tempdir().unwrap();
    spool_with(dir.path(), 3).await;
    set_full(dir.path(), true);
    let metrics = Arc::new(Metrics::new());
    let (spool, mut reader) = open(dir.path(), 1 << 20, LAYOUTS, metrics.clone()).unwrap();
    assert_eq!(spool.unwritable(), Some("spool cannot write: disk full"));
    assert_eq!(
        spool.append(rows(&[m(9)]), Duration::from_secs(5)).await,
        Err(AppendError::DiskFull)
    );
    let recs = read_all(&mut reader);
    assert_eq!(ids(&recs), [1, 2, 3]);
    reader.confirm(recs[2].end, 3, recs.iter().map(|r| r.bytes).sum());
    assert_eq!(metrics.spool.records.get(), 0);
    assert_eq!(
        segment_numbers(dir.path()),
        [] as [u64; 0],
        "delivered and deleted"
    );
    set_full(dir.path(), false);
    wait_writable(&spool).await;
    spool
        .append(rows(&[m(4)]), Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(ids(&read_all(&mut reader)), [4]);
    assert_eq!(segment_numbers(dir.path()), [2]);
}

#[tokio::test]
async fn cursor_and_in_flight_are_rewritten_in_place() {
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().unwrap();
    let metrics = Arc::new(Metrics::new());
    let (spool, mut reader) = open(dir.path(), 1 << 20, LAYOUTS, metrics.clone()).unwrap();
    let cursor = dir.path().join(CURSOR_FILE);
    let in_flight = dir.path().join(INFLIGHT_FILE);
    let inodes = || {
        (
            fs::metadata(&cursor).unwrap().ino(),
            fs::metadata(&in_flight).unwrap().ino(),
        )
    };
    let before = inodes();
    for n in 1..=3 {
        spool
            .append(rows(&[m(n)]), Duration::from_secs(5))
            .await
            .unwrap();
        let start = reader.position();
        let recs = read_all(&mut reader);
        reader.record_in_flight(start, recs[0].end);
        reader.confirm(recs[0].end, 1, recs[0].bytes);
    }
    assert_eq!(inodes(), before, "no new file, no rename");
    assert_eq!(fs::metadata(&cursor).unwrap().len(), 2 * SLOT_BYTES as u64);
    let end = reader.position();
    drop((spool, reader));
    // A write torn by a crash: the newest slot damaged, the one before it holds.
    let mut data = fs::read(&cursor).unwrap();
    let (seq, body) = parse_slots(&data).unwrap();
    assert_eq!(parse_cursor(&body), Some(end));
    let newest = (seq % 2) as usize * SLOT_BYTES;
    data[newest + 2] ^= 0x55;
    fs::write(&cursor, &data).unwrap();
    let (older_seq, older) = parse_slots(&data).unwrap();
    assert_eq!(older_seq, seq - 1);
    assert!(parse_cursor(&older).unwrap() < end);
    let (_spool, mut reader) = open(dir.path(), 1 << 20, LAYOUTS, metrics).unwrap();
    assert_eq!(
        ids(&read_all(&mut reader)),
        [3],
        "replayed from the older slot"
    );
}

#[tokio::test]
async fn a_cursor_of_the_one_line_format_is_read_and_turned_into_slots() {
    let dir = tempfile::tempdir().unwrap();
    spool_with(dir.path(), 3).await;
    let data = fs::read(segment_path(dir.path(), 1)).unwrap();
    let first_end = frame_at(&data, HEADER_LEN as usize).unwrap().1;
    let cursor = dir.path().join(CURSOR_FILE);
    fs::write(&cursor, format!("1 {first_end}\n")).unwrap();
    let (_spool, mut reader) =
        open(dir.path(), 1 << 20, LAYOUTS, Arc::new(Metrics::new())).unwrap();
    let recs = read_all(&mut reader);
    assert_eq!(ids(&recs), [2, 3]);
    reader.confirm(recs[0].end, 1, recs[0].bytes);
    let data = fs::read(&cursor).unwrap();
    assert_eq!(data.len(), 2 * SLOT_BYTES);
    assert_eq!(
        parse_cursor(&parse_slots(&data).unwrap().1),
        Some(recs[0].end)
    );
}

/// A kept-aside file holds what the writer rendered, as it is, named by the batch's start and
/// the first row's index, and its rows are counted.
#[tokio::test]
async fn kept_aside_rows_are_counted() {
    let dir = tempfile::tempdir().unwrap();
    let metrics = Arc::new(Metrics::new());
    let (_spool, reader) = open(dir.path(), 1 << 20, LAYOUTS, metrics.clone()).unwrap();
    let body = br#"{"reason":"Code: 117","measurements":[]}"#;
    let path = reader
        .write_kept_aside(reader.position(), 7, body, 3)
        .unwrap();
    assert!(
        path.ends_with("00000000000000000001-000000000008-000007.json"),
        "{path:?}"
    );
    assert_eq!(fs::read(&path).unwrap(), body);
    assert_eq!(metrics.spool.kept_aside_rows.get(), 3);
}

/// A spool folder written by a release before RowBinary (JSON frames behind the `CSPOOL01`
/// magic) is replayed after the upgrade: its rows come out as RowBinary, the cursor and the
/// in-flight range of that release still count, and new appends go to a v2 segment after it.
#[tokio::test]
async fn a_spool_of_the_json_format_is_replayed() {
    let dir = tempfile::tempdir().unwrap();
    // What the earlier release left: segment 1 with three requests, the first confirmed.
    fs::create_dir_all(dir.path().join("segments")).unwrap();
    let mut data = MAGIC_V1.to_vec();
    v1_frame(&mut data, &[m(1), m(2)]);
    let first_end = data.len();
    v1_frame(&mut data, &[m(3)]);
    v1_frame(&mut data, &[m(4), m(5)]);
    fs::write(segment_path(dir.path(), 1), &data).unwrap();
    fs::write(dir.path().join(CURSOR_FILE), format!("1 {first_end}\n")).unwrap();

    let metrics = Arc::new(Metrics::new());
    let (spool, mut reader) = open(dir.path(), 1 << 20, LAYOUTS, metrics.clone()).unwrap();
    assert_eq!(
        metrics.spool.records.get(),
        3,
        "counted from the JSON frames"
    );
    spool
        .append(rows(&[m(6)]), Duration::from_secs(5))
        .await
        .unwrap();
    let frames = read_all(&mut reader);
    assert_eq!(ids(&frames), [3, 4, 5, 6]);
    assert_eq!(measurements(&frames[1]), [m(4), m(5)], "every value kept");
    assert_eq!(frames[0].end.segment, 1);
    assert_eq!(frames[2].end.segment, 2, "new appends go to a new segment");
    let new = fs::read(segment_path(dir.path(), 2)).unwrap();
    assert_eq!(&new[..8], MAGIC);
    let (end, bytes) = (frames[2].end, frames.iter().map(|f| f.bytes).sum());
    reader.confirm(end, 4, bytes);
    assert!(
        !segment_path(dir.path(), 1).exists(),
        "the old segment goes once delivered"
    );
    assert_eq!(metrics.spool.records.get(), 0);
}

/// A reader asked for a number of rows stops at the first frame that reaches it, however many
/// bytes it may read (a backlog is batched by `COLLECTOR_BATCH_MAX_ROWS` too).
#[tokio::test]
async fn reading_stops_at_the_row_limit() {
    let dir = tempfile::tempdir().unwrap();
    let (spool, mut reader) = open(dir.path(), 1 << 20, LAYOUTS, Arc::new(Metrics::new())).unwrap();
    for n in 0..10 {
        spool
            .append(
                rows(&[m(3 * n), m(3 * n + 1), m(3 * n + 2)]),
                Duration::from_secs(5),
            )
            .await
            .unwrap();
    }
    let mut out = Vec::new();
    reader.read_available(u64::MAX, 7, &mut out);
    assert_eq!(out.len(), 3, "9 rows: the frame that reaches 7 is the last");
    out.clear();
    reader.read_available(u64::MAX, u64::MAX, &mut out);
    assert_eq!(ids(&out), (9..30).collect::<Vec<u128>>());
}

/// The dump's reading lists every frame of a segment up to a torn or damaged one and says
/// where it stopped; a folder that is not a spool is named as such.
#[tokio::test]
async fn the_dump_lists_frames_and_says_where_a_segment_is_damaged() {
    use super::dump::{dump, Found};
    let listed = |dir: &Path| {
        let mut found = Vec::new();
        let summary = dump(dir, false, |f| {
            found.push(match f {
                Found::Frame {
                    at,
                    layout,
                    payload,
                } => {
                    assert_eq!(layout, crate::measurement::LAYOUT);
                    (at.offset, decode_all(payload).unwrap().len())
                }
                Found::Torn { at } => (at.offset, 0),
            });
            Ok(())
        })
        .unwrap();
        (summary, found)
    };
    let dir = tempfile::tempdir().unwrap();
    spool_with(dir.path(), 3).await;
    let (summary, found) = listed(dir.path());
    assert_eq!((summary.frames, summary.torn), (3, 0));
    assert_eq!(found.iter().map(|f| f.1).sum::<usize>(), 3);
    let seg = segment_path(dir.path(), 1);
    let mut data = fs::read(&seg).unwrap();
    let second = frame_at(&data, HEADER_LEN as usize).unwrap().1;
    data[second + 24] ^= 0xff;
    fs::write(&seg, &data).unwrap();
    let (summary, found) = listed(dir.path());
    assert_eq!((summary.frames, summary.torn), (1, 1));
    assert_eq!(found.last(), Some(&(second as u64, 0)), "{found:?}");
    let empty = tempfile::tempdir().unwrap();
    let e = dump(empty.path(), false, |_| Ok(())).unwrap_err();
    assert!(e.to_string().contains("not a spool folder"), "{e}");
}

/// Makes writes under `dir` take `t` each (or none).
fn set_slow(dir: &Path, t: Option<Duration>) {
    let mut disks = SLOW_DISKS.lock().unwrap();
    disks.retain(|(d, _)| d != dir);
    if let Some(t) = t {
        disks.push((dir.to_owned(), t));
    }
}

/// The count of `collector_spool_sync_duration_seconds`: syncs so far.
fn syncs(metrics: &Metrics) -> u64 {
    let text = metrics.encode();
    text.lines()
        .find_map(|l| l.strip_prefix("collector_spool_sync_duration_seconds_count "))
        .unwrap_or_else(|| panic!("no sync count in:\n{text}"))
        .trim()
        .parse()
        .unwrap()
}

/// Many requests at once share syncs (group commit), and each is read back once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_appends_share_syncs_and_each_is_read_once() {
    let dir = tempfile::tempdir().unwrap();
    let metrics = Arc::new(Metrics::new());
    let (spool, mut reader) = open(dir.path(), 1 << 26, LAYOUTS, metrics.clone()).unwrap();
    let before = syncs(&metrics);
    let tasks: Vec<_> = (0..400u128)
        .map(|n| {
            let spool = spool.clone();
            tokio::spawn(async move { spool.append(rows(&[m(n)]), Duration::from_secs(5)).await })
        })
        .collect();
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    let mut got = ids(&read_all(&mut reader));
    got.sort_unstable();
    assert_eq!(got, (0..400).collect::<Vec<u128>>(), "each once");
    let syncs = syncs(&metrics) - before;
    assert!(
        (1..400).contains(&syncs),
        "{syncs} syncs for 400 requests: no group shared a sync"
    );
    assert_eq!(metrics.spool.records.get(), 400);
}

/// Segments after the first are prepared: made at their full length ahead of time, so
/// appending to one writes no inode; its zeros are never read as frames, a restart cuts them
/// without counting damage, and a clean stop leaves neither zeros nor the prepared file.
#[tokio::test]
async fn prepared_segments_are_used_and_their_zeros_are_not_damage() {
    let dir = tempfile::tempdir().unwrap();
    let metrics = Arc::new(Metrics::new());
    // max / 8 = the smallest segment target, 64 KiB.
    let max = 8 * SEGMENT_MIN_BYTES;
    let prepared = dir.path().join(prepare::PREPARED_FILE);
    let mut n = 0u128;
    {
        let (spool, mut reader) = open(dir.path(), max, LAYOUTS, metrics.clone()).unwrap();
        assert_eq!(spool.shared.segment_target, SEGMENT_MIN_BYTES);
        let start = Instant::now();
        while !prepared
            .metadata()
            .is_ok_and(|m| m.len() == SEGMENT_MIN_BYTES)
        {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "nothing prepared"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        while spool.shared.state.lock().unwrap().active == 1 {
            spool
                .append(rows(&[m(n)]), Duration::from_secs(5))
                .await
                .unwrap();
            n += 1;
        }
        // Segment 2 is the prepared file: full length at once, holding what was appended.
        let len2 = fs::metadata(segment_path(dir.path(), 2)).unwrap().len();
        let data2 = spool.shared.state.lock().unwrap().segments[&2];
        assert_eq!(len2, SEGMENT_MIN_BYTES, "made at its full length");
        assert!(data2 < len2, "{data2} bytes of data");
        assert_eq!(ids(&read_all(&mut reader)), (0..n).collect::<Vec<_>>());
        // Unused space is zeros, not frames.
        let raw = fs::read(segment_path(dir.path(), 2)).unwrap();
        assert!(format::is_unused(&raw[data2 as usize..]));
        // A crash now leaves the zeros: simulated on a copy of the folder.
        let copy = tempfile::tempdir().unwrap();
        for sub in ["segments", "kept-aside"] {
            fs::create_dir_all(copy.path().join(sub)).unwrap();
        }
        for n in [1, 2] {
            fs::copy(segment_path(dir.path(), n), segment_path(copy.path(), n)).unwrap();
        }
        let copied = Arc::new(Metrics::new());
        let (_s, mut r) = open(copy.path(), max, LAYOUTS, copied.clone()).unwrap();
        assert_eq!(
            ids(&read_all(&mut r)),
            (0..n).collect::<Vec<_>>(),
            "each once"
        );
        assert_eq!(copied.spool.damaged_bytes.get(), 0, "zeros are not damage");
        assert_eq!(
            fs::metadata(segment_path(copy.path(), 2)).unwrap().len(),
            data2,
            "cut to its frames"
        );
        assert_eq!(
            fs::read_dir(copy.path().join("kept-aside"))
                .unwrap()
                .count(),
            0
        );
    }
    // A clean stop: the active segment holds its frames only, the prepared file is gone.
    assert!(!prepared.exists(), "prepared file left after a clean stop");
    let len2 = fs::metadata(segment_path(dir.path(), 2)).unwrap().len();
    let raw = fs::read(segment_path(dir.path(), 2)).unwrap();
    assert!(
        !format::is_unused(&raw[raw.len() - 4..]),
        "{len2} bytes end in zeros"
    );
    let (_spool, mut reader) = open(dir.path(), max, LAYOUTS, metrics.clone()).unwrap();
    assert_eq!(ids(&read_all(&mut reader)), (0..n).collect::<Vec<_>>());
}

/// A sync that outlives its requests' limit answers them `SyncTimeout` (no timer per request:
/// the watchdog ends the group), their rows still land, and later requests go on normally.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sync_past_the_limit_answers_sync_timeout_and_the_rows_still_land() {
    let dir = tempfile::tempdir().unwrap();
    let metrics = Arc::new(Metrics::new());
    let (spool, mut reader) = open(dir.path(), 1 << 26, LAYOUTS, metrics.clone()).unwrap();
    spool
        .append(rows(&[m(1)]), Duration::from_secs(5))
        .await
        .unwrap();
    set_slow(dir.path(), Some(Duration::from_millis(1500)));
    let start = Instant::now();
    let timed_out = spool
        .append(rows(&[m(2)]), Duration::from_millis(300))
        .await;
    let waited = start.elapsed();
    assert_eq!(timed_out, Err(AppendError::SyncTimeout));
    assert!(
        waited >= Duration::from_millis(300) && waited < Duration::from_millis(1000),
        "answered after {waited:?}, limit 300 ms"
    );
    // Joins the next group while the slow sync goes on, and waits it out within its limit.
    let patient = spool.append(rows(&[m(3)]), Duration::from_secs(10));
    set_slow(dir.path(), None);
    patient.await.unwrap();
    let mut got = ids(&read_all(&mut reader));
    got.sort_unstable();
    assert_eq!(got, [1, 2, 3], "the timed-out rows landed too");
}

/// With a sync stuck, the open group takes `APPEND_QUEUE` requests; the next is shed at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_open_group_sheds_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let metrics = Arc::new(Metrics::new());
    let (spool, mut reader) = open(dir.path(), 1 << 28, LAYOUTS, metrics.clone()).unwrap();
    set_slow(dir.path(), Some(Duration::from_secs(2)));
    let first = tokio::spawn({
        let spool = spool.clone();
        async move { spool.append(rows(&[m(0)]), Duration::from_secs(10)).await }
    });
    let start = Instant::now();
    while spool.appender.groups.open.lock().unwrap().syncing.is_none() {
        assert!(start.elapsed() < Duration::from_secs(5), "never synced");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let waiting: Vec<_> = (1..=APPEND_QUEUE as u128)
        .map(|n| {
            let spool = spool.clone();
            tokio::spawn(async move { spool.append(rows(&[m(n)]), Duration::from_secs(10)).await })
        })
        .collect();
    while spool.appender.groups.open.lock().unwrap().requests < APPEND_QUEUE {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "the group did not fill"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let shed_at = Instant::now();
    assert_eq!(
        spool
            .append(rows(&[m(99_999)]), Duration::from_secs(10))
            .await,
        Err(AppendError::QueueFull)
    );
    assert!(
        shed_at.elapsed() < Duration::from_millis(100),
        "shed at once"
    );
    set_slow(dir.path(), None);
    first.await.unwrap().unwrap();
    for w in waiting {
        w.await.unwrap().unwrap();
    }
    assert_eq!(read_all(&mut reader).len(), APPEND_QUEUE + 1);
}

/// Appends racing at the bound never cross it: bytes waiting in groups count against it
/// before they are durable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_appends_at_the_bound_never_cross_it() {
    let dir = tempfile::tempdir().unwrap();
    let metrics = Arc::new(Metrics::new());
    let max = 64 * 1024;
    let (spool, mut reader) = open(dir.path(), max, LAYOUTS, metrics.clone()).unwrap();
    // Slow syncs keep bytes waiting in groups while more requests arrive.
    set_slow(dir.path(), Some(Duration::from_millis(50)));
    let big = |n: u128| Measurement {
        user_agent: "x".repeat(900).into(),
        ..m(n)
    };
    let tasks: Vec<_> = (0..300u128)
        .map(|n| {
            let spool = spool.clone();
            let r = rows(&[big(n)]);
            tokio::spawn(async move { spool.append(r, Duration::from_secs(10)).await })
        })
        .collect();
    let mut accepted = 0;
    for t in tasks {
        match t.await.unwrap() {
            Ok(()) => accepted += 1,
            Err(AppendError::Full) => {}
            Err(e) => panic!("{e}"),
        }
    }
    set_slow(dir.path(), None);
    let held: u64 = read_all(&mut reader).iter().map(|f| f.bytes).sum();
    assert!(held <= max, "{held} bytes held, bound {max}");
    assert!(accepted > 0 && accepted < 300, "{accepted} of 300 accepted");
    assert_eq!(metrics.spool.bytes.get() as u64, held);
}

/// An open group past its deadline (behind a stuck sync) is answered `SyncTimeout`, and a
/// request arriving after that waits in a new group instead of getting the old answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_out_open_group_is_replaced_for_later_requests() {
    let dir = tempfile::tempdir().unwrap();
    let metrics = Arc::new(Metrics::new());
    let (spool, mut reader) = open(dir.path(), 1 << 26, LAYOUTS, metrics.clone()).unwrap();
    set_slow(dir.path(), Some(Duration::from_millis(1500)));
    let stuck = tokio::spawn({
        let spool = spool.clone();
        async move { spool.append(rows(&[m(1)]), Duration::from_secs(10)).await }
    });
    let start = Instant::now();
    while spool.appender.groups.open.lock().unwrap().syncing.is_none() {
        assert!(start.elapsed() < Duration::from_secs(5), "never synced");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Waits in the open group behind the stuck sync, past its limit.
    assert_eq!(
        spool
            .append(rows(&[m(2)]), Duration::from_millis(200))
            .await,
        Err(AppendError::SyncTimeout)
    );
    set_slow(dir.path(), None);
    // Joins after the timeout: not answered with the old group's outcome.
    let joined = Instant::now();
    spool
        .append(rows(&[m(3)]), Duration::from_secs(10))
        .await
        .unwrap();
    assert!(
        joined.elapsed() > Duration::from_millis(100),
        "answered before its sync"
    );
    stuck.await.unwrap().unwrap();
    let mut got = ids(&read_all(&mut reader));
    got.sort_unstable();
    assert_eq!(got, [1, 2, 3]);
}

/// A frame torn by a machine crash in a prepared segment, zeros after it: a torn tail, not
/// damage: no copy aside (which would need space), only the torn bytes counted.
#[tokio::test]
async fn a_torn_frame_before_a_prepared_segments_zeros_is_a_torn_tail() {
    let dir = tempfile::tempdir().unwrap();
    for sub in ["segments", "kept-aside"] {
        fs::create_dir_all(dir.path().join(sub)).unwrap();
    }
    let mut data = MAGIC.to_vec();
    for n in 1..=2 {
        format::encode_frame(&mut data, &rows(&[m(n)]));
    }
    let mut third = Vec::new();
    format::encode_frame(&mut third, &rows(&[m(3)]));
    // Cut after a non-zero byte (its `received_at`), as any torn write ends: zeros after it
    // are the prepared room.
    data.extend_from_slice(&third[..39]);
    data.resize(64 * 1024, 0);
    fs::write(segment_path(dir.path(), 1), &data).unwrap();
    set_full(dir.path(), true);
    let metrics = Arc::new(Metrics::new());
    let (spool, mut reader) = open(dir.path(), 1 << 20, LAYOUTS, metrics.clone()).unwrap();
    assert_eq!(ids(&read_all(&mut reader)), [1, 2]);
    assert_eq!(
        metrics.spool.damaged_bytes.get(),
        39,
        "the torn bytes, not the zeros"
    );
    assert_eq!(
        fs::read_dir(dir.path().join("kept-aside")).unwrap().count(),
        0
    );
    assert!(spool.unwritable().is_some());
    set_full(dir.path(), false);
}

/// Contract v4 §5: the spool's folders are 0700 and its files 0600, what an earlier release
/// left with the umask's modes included.
#[tokio::test]
async fn the_spools_folders_and_files_are_private() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    fs::create_dir_all(dir.path().join("kept-aside")).unwrap();
    let old = dir.path().join("kept-aside/old.json");
    fs::write(&old, b"{}").unwrap();
    fs::set_permissions(&old, fs::Permissions::from_mode(0o644)).unwrap();
    let metrics = Arc::new(Metrics::new());
    let (spool, reader) = open(dir.path(), 1 << 20, LAYOUTS, metrics).unwrap();
    spool
        .append(rows(&[m(1)]), Duration::from_secs(5))
        .await
        .unwrap();
    reader
        .write_kept_aside(reader.position(), 0, b"{}", 1)
        .unwrap();
    let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
    for folder in [
        dir.path(),
        &dir.path().join("segments"),
        &dir.path().join("kept-aside"),
    ] {
        assert_eq!(mode(folder), 0o700, "{}", folder.display());
    }
    let mut files = 0;
    for sub in ["", "segments", "kept-aside"] {
        for e in fs::read_dir(dir.path().join(sub)).unwrap() {
            let p = e.unwrap().path();
            if p.is_file() {
                files += 1;
                assert_eq!(mode(&p), 0o600, "{}", p.display());
            }
        }
    }
    assert!(
        files >= 6,
        "LOCK, IDENTITY, CURSOR, a segment, two kept-aside: {files}"
    );
}
