//! The spool's bound, its segments' rotation and deletion, and the rows kept aside.

use super::*;

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
