//! The spool's identity, its cursor and the batch in flight, across restarts and copies.

use super::*;

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
