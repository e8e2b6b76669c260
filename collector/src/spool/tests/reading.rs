//! Appending, reading, confirming and replaying; the row limit of a read; the dump's reading.

use super::*;

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
