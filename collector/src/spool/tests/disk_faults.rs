//! A full disk and a disk whose syncs fail: refused appends, recovery, no file per trial.

use super::*;

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
