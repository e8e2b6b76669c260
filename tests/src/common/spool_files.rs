//! Spool files as an earlier release left them, written here byte by byte (independently of
//! the collector's codec): segments of the JSON release (`CSPOOL01`), kept-aside files, and a
//! search of a folder for bytes that must not be there.

use std::path::{Path, PathBuf};

use serde_json::{json, Value};

/// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), bit by bit: what a `CSPOOL01` frame
/// carries of its payload.
pub fn crc32c(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0x82F6_3B78
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// A segment of the JSON release: the magic `CSPOOL01`, then per request a frame of its
/// length (u32 LE), the CRC-32C of its payload (u32 LE) and the payload, the request's rows as
/// a JSON array.
pub fn v1_segment(requests: &[Vec<Value>]) -> Vec<u8> {
    let mut data = b"CSPOOL01".to_vec();
    for rows in requests {
        let payload = serde_json::to_vec(rows).unwrap();
        data.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        data.extend_from_slice(&crc32c(&payload).to_le_bytes());
        data.extend_from_slice(&payload);
    }
    data
}

/// A row as the JSON release stored it (the columns of its layout, as sent), received now.
pub fn v1_row(id: &str, site: &str, url: &str, referrer: &str, user_agent: &str) -> Value {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    json!({
        "id": id, "site": site, "received_at": now, "url": url, "ts": null,
        "referrer": referrer, "navigation_type": "navigate", "ttfb_ms": 80.5, "fcp_ms": null,
        "lcp_ms": 1200.5, "inp_ms": null, "dom_content_loaded_ms": null, "load_ms": null,
        "cls": 0.01, "viewport_width": 390, "effective_connection_type": null,
        "user_agent": user_agent,
    })
}

/// Writes a spool folder at `dir` as the JSON release left it: `segments/1` holding
/// `requests`, nothing confirmed.
pub fn write_v1_spool(dir: &Path, requests: &[Vec<Value>]) {
    std::fs::create_dir_all(dir.join("segments")).unwrap();
    std::fs::create_dir_all(dir.join("kept-aside")).unwrap();
    std::fs::write(
        dir.join("segments/00000000000000000001.seg"),
        v1_segment(requests),
    )
    .unwrap();
}

/// Writes `kept-aside/NAME` in `dir`: a kept-aside file holding `rows`, as the writer writes one.
pub fn write_kept_aside(dir: &Path, name: &str, rows: &[Value]) -> PathBuf {
    let path = dir.join("kept-aside").join(name);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let body = json!({"reason": "Code: 117. DB::Exception: bad data", "measurements": rows});
    std::fs::write(&path, serde_json::to_vec_pretty(&body).unwrap()).unwrap();
    path
}

/// Writes `kept-aside/damaged-<n>.seg` in `dir`: a `CSPOOL01` segment of `requests` with
/// bytes of damage between its magic and its first frame, as recovery copies one aside.
pub fn write_damaged(dir: &Path, n: u64, requests: &[Vec<Value>]) -> PathBuf {
    let mut data = v1_segment(requests);
    data.splice(8..8, b"\x07damage\x00".iter().copied());
    let path = dir.join("kept-aside").join(format!("damaged-{n:020}.seg"));
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, data).unwrap();
    path
}

/// The 16 bytes a row's `id` is in a RowBinary row (the spool's segments): the UUID's two
/// halves, each a little-endian u64, the high one first.
pub fn uuid_row_bytes(id: &str) -> Vec<u8> {
    let (high, low) = uuid::Uuid::parse_str(id).unwrap().as_u64_pair();
    [high.to_le_bytes(), low.to_le_bytes()].concat()
}

/// Every file under `dir` (all folders, all files) whose bytes hold `needle`.
pub fn files_holding(dir: &Path, needle: impl AsRef<[u8]>) -> Vec<PathBuf> {
    let needle = needle.as_ref();
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            found.extend(files_holding(&path, needle));
        } else {
            let bytes = std::fs::read(&path).unwrap();
            if bytes.windows(needle.len()).any(|w| w == needle) {
                found.push(path);
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    /// The check value of CRC-32C (RFC 3720 B.4): "123456789".
    #[test]
    fn crc32c_of_the_check_string() {
        assert_eq!(super::crc32c(b"123456789"), 0xE306_9283);
    }
}
