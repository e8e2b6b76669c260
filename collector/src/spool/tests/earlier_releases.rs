//! Spool folders of earlier releases: their layouts, identity file, cursor and JSON frames.

use super::*;

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
