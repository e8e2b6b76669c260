//! Prepared segments: made ahead at full length, their zeros never read as frames.

use super::*;

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
