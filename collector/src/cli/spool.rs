//! `collector spool dump`: what the spool holds, as JSON lines.

use super::{failed, RunError};
use crate::config::{Config, SpoolCommand};
use crate::spool;

/// `collector spool dump`.
pub fn run(config: &Config, command: SpoolCommand) -> Result<(), RunError> {
    let SpoolCommand::Dump { all } = command;
    let dir = &config.spool_dir;
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let summary = match spool::dump::dump(dir, all, &mut out) {
        Ok(s) => s,
        // `collector spool dump | head`: the reader has seen enough.
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => return Ok(()),
        Err(e) => return Err(failed(format!("spool folder {}: {e}", dir.display()))),
    };
    eprintln!(
        "collector: {} rows in {} frames of {} segments ({}); cursor at segment {} offset {}{}",
        summary.rows,
        summary.frames,
        summary.segments,
        if all {
            "all on disk"
        } else {
            "not yet confirmed by ClickHouse"
        },
        summary.cursor.segment,
        summary.cursor.offset,
        if summary.damaged > 0 {
            format!("; {} frames could not be decoded", summary.damaged)
        } else {
            String::new()
        }
    );
    Ok(())
}
