//! `DIR/stack.env`: the stack's ports and URLs as `KEY=VALUE` lines (no quotes, no spaces), so
//! that a shell can source it and a program split each line on its first `=`. The keys are
//! listed in `scripts/stack.sh`'s header and in [`crate`]'s documentation.

use std::collections::BTreeMap;
use std::path::Path;

use crate::error::{Error, Result};

/// The keys of a `stack.env` file, in the order they are written.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Env {
    entries: Vec<(String, String)>,
}

impl Env {
    /// Reads `path`; a missing file is an empty [`Env`]. Lines that are not `KEY=VALUE` with
    /// `KEY` of `[A-Z][A-Z0-9_]*` are skipped.
    pub fn read(path: &Path) -> Result<Env> {
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Env::default()),
            Err(e) => return Err(Error::new(format!("{}: {e}", path.display()))),
        };
        let mut env = Env::default();
        for line in text.lines() {
            let Some((k, v)) = line.split_once('=') else {
                continue;
            };
            let key_ok = k.starts_with(|c: char| c.is_ascii_uppercase())
                && k.chars()
                    .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_');
            if key_ok {
                env.set(k, v);
            }
        }
        Ok(env)
    }

    /// Writes `path` atomically (a temporary file renamed over it).
    pub fn write(&self, path: &Path) -> Result<()> {
        let mut text = String::new();
        for (k, v) in &self.entries {
            text.push_str(&format!("{k}={v}\n"));
        }
        let tmp = path.with_extension("env.tmp");
        fs_err::write(&tmp, text)?;
        fs_err::rename(&tmp, path)?;
        Ok(())
    }

    /// The value of `key`, if set.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.entries
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// The value of `key` as a port, if set and a number in 1..=65535.
    pub fn port(&self, key: &str) -> Option<u16> {
        self.get(key)?.parse().ok().filter(|p| *p > 0)
    }

    /// The value of `key` as a port. Errors: "KEY is not set in stack.env" when missing or
    /// not a port.
    pub fn need_port(&self, key: &str) -> Result<u16> {
        self.port(key)
            .ok_or_else(|| Error::new(format!("{key} is not set in stack.env")))
    }

    /// Sets `key` (in place when present, else appended).
    pub fn set(&mut self, key: &str, value: impl ToString) {
        let value = value.to_string();
        match self.entries.iter_mut().find(|(k, _)| k == key) {
            Some(entry) => entry.1 = value,
            None => self.entries.push((key.to_owned(), value)),
        }
    }

    /// Removes `key`, if set.
    pub fn remove(&mut self, key: &str) {
        self.entries.retain(|(k, _)| k != key);
    }

    /// Every key and value, in file order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.entries.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }

    /// The entries as a map (for callers that look keys up by name).
    pub fn to_map(&self) -> BTreeMap<String, String> {
        self.entries.iter().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_keeps_order_and_skips_bad_lines() {
        let dir = std::env::temp_dir().join(format!("stack-env-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("stack.env");
        std::fs::write(
            &path,
            "PG_PORT=20001\n# comment\nlower=1\nCH1_URL=http://127.0.0.1:2\n",
        )
        .unwrap();
        let mut env = Env::read(&path).unwrap();
        assert_eq!(env.port("PG_PORT"), Some(20001));
        assert_eq!(env.get("lower"), None);
        env.set("PG_PORT", 20002);
        env.write(&path).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text, "PG_PORT=20002\nCH1_URL=http://127.0.0.1:2\n");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
