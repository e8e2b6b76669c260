//! `bench`: the collector's benchmarks (see `bench --help`; `scripts/bench.sh` runs it).

use clap::Parser;

/// The collector's benchmarks, next to nginx answering `return 204`.
///
/// Full run (no option): about 15 minutes, writes docs/benchmarks.md and prints the table.
/// Every process it starts, and the stack, is stopped on exit (success, failure or Ctrl-C);
/// the logs of a failed run are kept and their folder is printed.
#[derive(Parser)]
struct Args {
    /// Smoke test, about 2 minutes: prints the table, leaves docs/ alone.
    #[arg(long, conflicts_with_all = ["ablation", "storage"])]
    quick: bool,
    /// The spool append's share of a request (about 8 minutes plus two release builds).
    #[arg(long, conflicts_with = "storage")]
    ablation: bool,
    /// The read side: docs/queries.md's queries, v1's layout against v2's (about 15 minutes).
    #[arg(long)]
    storage: bool,
    /// One shard against two: the single-beacon rate of the release build writing to one
    /// ClickHouse shard and to two (about 4 minutes plus the release build).
    #[arg(long, conflicts_with_all = ["quick", "ablation", "storage"])]
    shards: bool,
    /// With --storage: rows generated (default 10,000,000; fewer for a smoke run, which
    /// then leaves docs/ alone).
    #[arg(long, requires = "storage")]
    rows: Option<u64>,
}

fn main() {
    let args = Args::parse();
    let mode = match (args.quick, args.ablation, args.storage, args.shards) {
        (true, ..) => bench::Mode::Quick,
        (_, true, ..) => bench::Mode::Ablation,
        (_, _, true, _) => bench::Mode::Storage,
        (.., true) => bench::Mode::Shards,
        _ => bench::Mode::Full,
    };
    if let Err(e) = bench::main_run(mode, args.rows) {
        eprintln!("bench: error: {e}");
        std::process::exit(1);
    }
}
