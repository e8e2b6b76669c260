//! The `collector` binary: parse the command line, run, exit with the code `run` returns.

use clap::Parser;

/// jemalloc instead of glibc's allocator: in the benchmark (`docs/benchmarks.md`) it cut CPU
/// per measurement by 10-25 %, halved peak RSS and brought the memory of 10,000 idle
/// connections under 100 MiB.
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() {
    let cli = match collector::cli::Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => match e.kind() {
            clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion => {
                e.exit()
            }
            // `collector spool` alone: clap's text is the help, whose first line is only the
            // description; name what is missing instead.
            clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
                let text = e.to_string();
                let usage = text
                    .lines()
                    .find_map(|l| l.strip_prefix("Usage: "))
                    .unwrap_or("collector --help");
                eprintln!("collector: a subcommand is missing: {usage} (see --help)");
                std::process::exit(collector::EXIT_CONFIG);
            }
            _ => {
                // One clear line, exit code 2 (contract §1).
                let text = e.to_string();
                eprintln!(
                    "collector: {}",
                    text.lines()
                        .next()
                        .unwrap_or("invalid usage")
                        .trim_start_matches("error: ")
                );
                std::process::exit(collector::EXIT_CONFIG);
            }
        },
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let code = runtime.block_on(collector::run(cli));
    // Do not wait for blocking threads (e.g. a stuck disk) beyond what run already drained.
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    std::process::exit(code);
}
