//! Group commit: shared syncs, the sync time limit, shedding a full open group.

use super::*;

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
/// The group says it is strained on the way (intake then sheds sites over their budget).
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
    assert!(
        !spool.group_strained(5),
        "an empty open group is not strained"
    );
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
    // Full: fewer than a fifth of its room left (intake sheds loud sites from four fifths).
    assert!(spool.group_strained(5));
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
