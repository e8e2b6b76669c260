//! The figures of a run as `KEY=VALUE` (the report's input), kept in memory and in
//! `DIR/results`, and the commands as run (`DIR/commands.txt`, paths made generic).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::error::{Context, Result};

/// The run's figures, by key (`tp_collector_1_rps`, `lat_nginx_p99_ms`, ...).
#[derive(Debug, Default)]
pub struct Results {
    map: BTreeMap<String, String>,
    file: Option<PathBuf>,
    commands: Option<PathBuf>,
    /// Replaced in logged commands: (text, by).
    generic: Vec<(String, String)>,
}

impl Results {
    /// Results written through to `dir/results`, commands to `dir/commands.txt`; `generic`
    /// are (path, name) replacements for the logged commands (`/tmp/x` -> `DIR`).
    pub fn in_dir(dir: &Path, generic: Vec<(String, String)>) -> Results {
        Results {
            map: BTreeMap::new(),
            file: Some(dir.join("results")),
            commands: Some(dir.join("commands.txt")),
            generic,
        }
    }

    /// Results from `KEY=VALUE` lines (tests).
    pub fn from_lines(text: &str) -> Results {
        let mut r = Results::default();
        for (k, v) in text.lines().filter_map(|l| l.split_once('=')) {
            r.map.insert(k.to_owned(), v.to_owned());
        }
        r
    }

    /// Sets `key` (and appends the line to the results file).
    pub fn put(&mut self, key: &str, value: impl ToString) -> Result<()> {
        let value = value.to_string();
        if let Some(file) = &self.file {
            append(file, &format!("{key}={value}"))?;
        }
        self.map.insert(key.to_owned(), value);
        Ok(())
    }

    /// Logs a command as run, paths made generic.
    pub fn command(&self, line: &str) -> Result<()> {
        let mut line = line.to_owned();
        for (from, to) in &self.generic {
            line = line.replace(from, to);
        }
        match &self.commands {
            Some(file) => append(file, &line),
            None => Ok(()),
        }
    }

    /// `key`'s text, or "?".
    pub fn get(&self, key: &str) -> &str {
        self.map.get(key).map(String::as_str).unwrap_or("?")
    }

    /// `key`'s text if set.
    pub fn opt(&self, key: &str) -> Option<&str> {
        self.map.get(key).map(String::as_str)
    }

    /// `key` as a number; NaN when missing or not a number.
    pub fn num(&self, key: &str) -> f64 {
        self.opt(key)
            .and_then(|v| v.parse().ok())
            .unwrap_or(f64::NAN)
    }

    /// Every (key, value) whose key starts with `prefix`, in key order.
    pub fn with_prefix<'a>(
        &'a self,
        prefix: &'a str,
    ) -> impl Iterator<Item = (&'a str, &'a str)> + 'a {
        self.map
            .range(prefix.to_owned()..)
            .take_while(move |(k, _)| k.starts_with(prefix))
            .map(|(k, v)| (k.as_str(), v.as_str()))
    }
}

fn append(file: &Path, line: &str) -> Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(file)
        .context(|| file.display().to_string())?;
    writeln!(f, "{line}").context(|| file.display().to_string())
}

/// `a:1,b:x` -> {a: 1, b: x} (a run's record).
pub fn parse_kv(text: &str) -> BTreeMap<&str, &str> {
    text.split(',').filter_map(|p| p.split_once(':')).collect()
}
