//! The spool's folders and files are private (contract v4 §5).

use super::*;

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
