//! The age of the oldest unconfirmed record, and the receipt times the spool holds.

use super::*;

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
