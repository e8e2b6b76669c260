//! `stack`: the test stack from the command line (`scripts/stack.sh` hands it every
//! subcommand but `install`). See the library's documentation for what each does.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use stack::{Result, Stack, UpOptions};

/// Starts, stops and breaks the throw-away server stack of the tests and the demo.
#[derive(Parser)]
#[command(name = "stack")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Start whatever is not running, wait until every server answers, write DIR/stack.env.
    Up {
        dir: PathBuf,
        /// ClickHouse 18.16 replicas per shard (shards × replicas at most 9; default: as last
        /// started, or 2).
        #[arg(long)]
        replicas: Option<usize>,
        /// ClickHouse 18.16 shards of the cluster `collector` (default: as last started, or 1).
        #[arg(long)]
        shards: Option<usize>,
        /// Also run the ClickHouse 26.x server(s).
        #[arg(long, conflicts_with = "no_ch26")]
        ch26: bool,
        /// How many ClickHouse 26.x servers (1..9; each a shard of the cluster `collector26`;
        /// implies --ch26; default: as last started, or 1).
        #[arg(long, conflicts_with = "no_ch26")]
        ch26_servers: Option<usize>,
        /// Stop the ClickHouse 26.x servers (their data stays).
        #[arg(long)]
        no_ch26: bool,
    },
    /// Stop everything; --purge also deletes DIR.
    Down {
        dir: PathBuf,
        #[arg(long)]
        purge: bool,
    },
    /// stop|kill|freeze|thaw|start ClickHouse replica I, `profile [SETTING=VALUE...]`, or
    /// `user NAME PASSWORD_SHA256_HEX [SETTING=VALUE...]` (a user of its own profile).
    Replica {
        dir: PathBuf,
        i: usize,
        action: String,
        settings: Vec<String>,
    },
    /// The PostgreSQL primary.
    Pg { dir: PathBuf, action: Act },
    /// The PostgreSQL hot standby (start clones the primary the first time).
    PgStandby { dir: PathBuf, action: StandbyAct },
    /// ZooKeeper.
    Zk { dir: PathBuf, action: Act },
    /// A ClickHouse 26.x server (the first, or --server K).
    Ch26 {
        dir: PathBuf,
        action: Act,
        #[arg(long, default_value_t = 1)]
        server: usize,
    },
    /// N free loopback ports, reserved like the stack's own.
    Ports { n: usize },
    /// One line per server; exit status 0 only if every server runs and answers.
    Status { dir: PathBuf },
    /// Writes the files of deploy/ rendered from the templates (deploy/clickhouse/*.xml).
    RenderDeploy,
}

#[derive(Clone, Copy, ValueEnum)]
enum Act {
    Stop,
    Kill,
    Freeze,
    Thaw,
    Start,
}

#[derive(Clone, Copy, ValueEnum)]
enum StandbyAct {
    Stop,
    Kill,
    Freeze,
    Thaw,
    Start,
    Promote,
}

fn main() -> ExitCode {
    match run(Cli::parse().command) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("stack: error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Runs one subcommand; Ok(false) is a status that is not healthy.
fn run(command: Command) -> Result<bool> {
    match command {
        Command::Up {
            dir,
            replicas,
            shards,
            ch26,
            ch26_servers,
            no_ch26,
        } => {
            let ch26 = (ch26 || no_ch26 || ch26_servers.is_some()).then_some(!no_ch26);
            let options = UpOptions {
                replicas,
                ch26,
                shards,
                ch26_servers,
            };
            let stack = Stack::up(&dir, options)?;
            print!("{}", stack.summary()?);
        }
        Command::Down { dir, purge } => Stack::down(&dir, purge)?,
        Command::Replica {
            dir,
            i,
            action,
            settings,
        } => replica(&Stack::open(&dir)?, i, &action, &settings)?,
        Command::Pg { dir, action } => {
            let stack = Stack::open(&dir)?;
            let pg = stack.postgres();
            act(
                action,
                || pg.stop(),
                || pg.kill(),
                || pg.freeze(),
                || pg.thaw(),
                || pg.start(),
            )?;
        }
        Command::PgStandby { dir, action } => standby(&Stack::open(&dir)?, action)?,
        Command::Zk { dir, action } => {
            let stack = Stack::open(&dir)?;
            let zk = stack.zookeeper();
            act(
                action,
                || zk.stop(),
                || zk.kill(),
                || zk.freeze(),
                || zk.thaw(),
                || zk.start(),
            )?;
        }
        Command::Ch26 {
            dir,
            action,
            server,
        } => {
            let stack = Stack::open(&dir)?;
            let c = stack.ch26_server(server).ok_or_else(|| {
                stack::Error::new(format!(
                    "no ClickHouse 26.x server {server} in {} (run: up {0} --ch26 [--ch26-servers K])",
                    dir.display()
                ))
            })?;
            act(
                action,
                || c.stop(),
                || c.kill(),
                || c.freeze(),
                || c.thaw(),
                || c.start(),
            )?;
        }
        Command::Ports { n } => {
            let ports: Vec<String> = stack::ports::alloc(n)?.iter().map(u16::to_string).collect();
            println!("{}", ports.join(" "));
        }
        Command::RenderDeploy => {
            let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
            let written = stack::deploy::render(&repo)?;
            if written.is_empty() {
                println!("deploy/: every rendered file is up to date");
            }
            for path in written {
                println!("wrote {path}");
            }
        }
        Command::Status { dir } => {
            let (text, ok) = Stack::open(&dir)?.status()?;
            print!("{text}");
            return Ok(ok);
        }
    }
    Ok(true)
}

/// One of the five actions every server takes.
fn act(
    action: Act,
    stop: impl FnOnce() -> Result<()>,
    kill: impl FnOnce() -> Result<()>,
    freeze: impl FnOnce() -> Result<()>,
    thaw: impl FnOnce() -> Result<()>,
    start: impl FnOnce() -> Result<()>,
) -> Result<()> {
    match action {
        Act::Stop => stop(),
        Act::Kill => kill(),
        Act::Freeze => freeze(),
        Act::Thaw => thaw(),
        Act::Start => start(),
    }
}

fn replica(stack: &Stack, i: usize, action: &str, settings: &[String]) -> Result<()> {
    if !(1..=stack::MAX_REPLICAS).contains(&i)
        || !stack.dir().join(format!("ch{i}/config.xml")).exists()
    {
        return Err(stack::Error::new(format!(
            "replica {i} does not exist in {}",
            stack.dir().display()
        )));
    }
    let r = stack.replica(i);
    match action {
        "stop" => r.stop(),
        "kill" => r.kill(),
        "freeze" => r.freeze(),
        "thaw" => r.thaw(),
        "start" => r.start(),
        "profile" => r.profile(&settings.iter().map(String::as_str).collect::<Vec<_>>()),
        "user" => match settings {
            [name, hex, rest @ ..] => r.add_user(
                name,
                hex,
                &rest.iter().map(String::as_str).collect::<Vec<_>>(),
            ),
            _ => Err(stack::Error::new(
                "replica: user NAME PASSWORD_SHA256_HEX [SETTING=VALUE...]",
            )),
        },
        other => Err(stack::Error::new(format!(
            "replica: unknown action {other} (stop|kill|freeze|thaw|start|profile|user)"
        ))),
    }
}

fn standby(stack: &Stack, action: StandbyAct) -> Result<()> {
    let sb = stack.pg_standby();
    match action {
        StandbyAct::Stop => sb.stop(),
        StandbyAct::Kill => sb.kill(),
        StandbyAct::Freeze => sb.freeze(),
        StandbyAct::Thaw => sb.thaw(),
        StandbyAct::Start => sb.start(),
        StandbyAct::Promote => sb.promote(),
    }
}
