//! A torn tail and damaged frames or magic: each costs only itself.

use super::*;

#[tokio::test]
async fn torn_tail_is_cut_to_the_last_whole_record() {
    let dir = tempfile::tempdir().unwrap();
    spool_with(dir.path(), 3).await;
    let metrics = Arc::new(Metrics::new());
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
    spool_with(dir.path(), 3).await;
    let metrics = Arc::new(Metrics::new());
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
