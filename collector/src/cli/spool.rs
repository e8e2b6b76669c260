//! `collector spool dump`: what the spool holds, as JSON lines.
//!
//! The spool hands over its frames as they are on disk ([`spool::dump`]); the rows are read
//! here, with the row's one decoder ([`measurement::read_record`]), in whichever layout a
//! frame holds.

use std::io::Write;

use super::SpoolCommand;
use super::{failed, RunError};
use crate::config::Config;
use crate::measurement;
use crate::spool::{self, dump::Found};

/// `collector spool dump`: one line per row, `{"shard":S,"segment":N,"offset":N,"row":{...}}`
/// (the position being that of the row's frame in shard S's spool), one
/// `{"shard":S,"segment":N,"offset":N,"error":"..."}` per frame that is torn or does not hold
/// whole rows, and a summary per spool on stderr: of every spool folder found
/// ([`crate::shards::spool_dirs`]), or of `--shard`'s.
pub fn run(config: &Config, command: SpoolCommand) -> Result<(), RunError> {
    let SpoolCommand::Dump { all, shard } = command;
    let mut dirs = crate::shards::spool_dirs(&config.spool.dir);
    if let Some(wanted) = &shard {
        dirs.retain(|(name, _)| name == wanted);
    }
    if dirs.is_empty() {
        return Err(failed(format!(
            "no spool folder{} in {}",
            shard.map(|s| format!(" of shard {s}")).unwrap_or_default(),
            config.spool.dir.display()
        )));
    }
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    for (name, dir) in dirs {
        match dump_one(&name, &dir, all, &mut out) {
            Ok(()) => {}
            // `collector spool dump | head`: the reader has seen enough.
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => return Ok(()),
            Err(e) => return Err(failed(format!("spool folder {}: {e}", dir.display()))),
        }
    }
    Ok(())
}

/// Dumps the spool of shard `name` in `dir` to `out`, its summary to stderr.
fn dump_one(
    name: &str,
    dir: &std::path::Path,
    all: bool,
    out: &mut impl Write,
) -> std::io::Result<()> {
    let (mut rows, mut undecodable) = (0usize, 0usize);
    let summary = spool::dump::dump(dir, all, |found| {
        let line = match found {
            Found::Torn { at } => {
                serde_json::json!({"shard": name, "segment": at.segment, "offset": at.offset,
                "error": "torn or damaged frame: the rest of this segment is not listed"})
            }
            Found::Frame {
                at,
                layout,
                payload,
            } => match measurement::read_record(layout, payload) {
                Ok(read) => {
                    for row in read {
                        rows += 1;
                        let line = serde_json::json!({"shard": name, "segment": at.segment, "offset": at.offset, "row": row});
                        writeln!(out, "{line}")?;
                    }
                    return Ok(());
                }
                Err(error) => {
                    undecodable += 1;
                    serde_json::json!({"shard": name, "segment": at.segment, "offset": at.offset, "error": error})
                }
            },
        };
        writeln!(out, "{line}")
    })?;
    out.flush()?;
    let damaged = summary.torn + undecodable;
    eprintln!(
        "collector: shard {name}: {rows} rows in {} frames of {} segments ({}); cursor at segment {} offset {}{}",
        summary.frames,
        summary.segments,
        if all {
            "all on disk"
        } else {
            "not yet confirmed by ClickHouse"
        },
        summary.cursor.segment,
        summary.cursor.offset,
        if damaged > 0 {
            format!("; {damaged} frames could not be decoded")
        } else {
            String::new()
        }
    );
    Ok(())
}
