#!/usr/bin/env python3
"""scripts/ch26/server.py - run one ClickHouse 26.x server from the chdb-core package.

chdb-core holds clickhouse-local, which in 26.x can open the HTTP and native TCP
listeners of a real server (`SYSTEM START LISTEN QUERIES ALL`). The stateless call
`chdb._chdb.query(sql, format, path=DATA)` runs that program; it reads config.xml from the
current working directory. So this launcher, in the folder --workdir where the collector-stack
crate wrote config.xml and users.xml (stack/src/ch26.rs, `write_config`, from the one template):

  1. points standard input at /dev/null (clickhouse-local would read a regular file there
     as a table), sets the process's time zone to UTC,
  2. runs `SYSTEM START LISTEN QUERIES ALL; SELECT count() FROM file('<FIFO>', 'LineAsString')`
     in a thread: the listeners open and the query then blocks reading the FIFO,
  3. stops the server by writing a line to the FIFO, on SIGTERM, SIGINT or SIGHUP; anyone may
     also write a line to the FIFO (WORKDIR/stop.fifo) to stop it.

The server lives as long as that query runs: one server per process, and the process is
the server (it shows up as `python`). What it says goes to standard error. Exit status: 0
after a requested stop (signal or FIFO), 1 if the server ended by itself (e.g. a port was
taken: the error is on standard error) or did not stop within --stop-timeout seconds, 2 on
bad arguments. Standard library and chdb only.
"""

import argparse
import errno
import os
import signal
import stat
import sys
import threading
import time

def say(msg):
    print(f"ch26 server.py[{os.getpid()}]: {msg}", file=sys.stderr, flush=True)


def parse_args(argv):
    p = argparse.ArgumentParser(description="Run one ClickHouse 26.x server (chdb-core's clickhouse-local).")
    p.add_argument("--workdir", required=True,
                   help="the server's folder: config.xml and users.xml (written by the "
                        "collector-stack crate), data/, stop.fifo")
    p.add_argument("--stop-timeout", type=float, default=20.0,
                   help="seconds to wait for the server to shut down once asked (default 20)")
    args = p.parse_args(argv)
    args.workdir = os.path.abspath(args.workdir)
    for name in ("config.xml", "users.xml"):
        if not os.path.isfile(os.path.join(args.workdir, name)):
            p.error(f"--workdir: no {name} in {args.workdir}")
    args.data = os.path.join(args.workdir, "data")
    return args


class Stopper:
    """Asks the server to stop by writing one line to the FIFO it blocks on."""

    def __init__(self, fifo):
        self.fifo = fifo
        self.requested = None   # monotonic time of the first request
        self.delivered = False

    def request(self, signum=None, _frame=None):
        # Signal handler: only note it; the main loop does the writing (an open of the FIFO
        # blocks, or fails, until the server has opened it for reading).
        if self.requested is None:
            self.requested = time.monotonic()
            if signum is not None:
                say(f"got signal {signum}; stopping")

    def poke(self):
        if self.requested is None or self.delivered:
            return
        try:
            fd = os.open(self.fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as e:
            if e.errno == errno.ENXIO:   # no reader yet: the server is still starting
                return
            raise
        try:
            os.write(fd, b"stop\n")
        finally:
            os.close(fd)
        self.delivered = True


def load_chdb():
    """chdb's compiled module, without running the chdb package's __init__ if possible.

    That __init__ imports the DB-API and DataFrame helpers (pyarrow, numpy: about a second
    and 50 MB here) and runs a query on an embedded connection; this server needs neither,
    only `_chdb.query`. So load the library the way that __init__ does (RTLD_DEEPBIND, so
    that its C++ allocator is its own) under a bare `chdb` package, and fall back to the
    ordinary import if the package's layout is not the expected one.
    """
    import ctypes
    import importlib.util
    import types
    try:
        spec = importlib.util.find_spec("chdb")
        if spec is None or not spec.submodule_search_locations:
            raise ImportError("no chdb package")
        pkgdir = list(spec.submodule_search_locations)[0]
        lib = os.path.join(pkgdir, "_chdb.abi3.so")
        if not os.path.isfile(lib):
            raise ImportError(f"no {lib}")
        ctypes.CDLL(lib, mode=sys.getdlopenflags() | getattr(os, "RTLD_DEEPBIND", 0x8))
        pkg = types.ModuleType("chdb")
        pkg.__path__ = [pkgdir]
        pkg.__package__ = "chdb"
        sys.modules["chdb"] = pkg
        from chdb import _chdb
        return _chdb
    except (ImportError, OSError) as e:
        for name in ("chdb._chdb", "chdb"):
            sys.modules.pop(name, None)
        say(f"note: loading chdb's library directly failed ({e}); importing the chdb package")
    from chdb import _chdb
    return _chdb


def main(argv):
    args = parse_args(argv)
    fifo = os.path.join(args.workdir, "stop.fifo")
    stopper = Stopper(fifo)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, stopper.request)

    os.makedirs(args.data, exist_ok=True)
    os.chdir(args.workdir)   # clickhouse-local reads ./config.xml

    # Standard input must not be a regular file or a pipe someone writes to.
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    # The zone clickhouse-local uses (it does not apply <timezone> in this mode).
    os.environ["TZ"] = "UTC"
    time.tzset()

    try:
        if not stat.S_ISFIFO(os.lstat(fifo).st_mode):
            os.unlink(fifo)
    except FileNotFoundError:
        pass
    if not os.path.lexists(fifo):
        os.mkfifo(fifo, 0o600)

    try:
        _chdb = load_chdb()
    except ImportError as e:
        say(f"cannot import chdb ({e}); run: scripts/stack.sh install (it puts chdb-core in a venv)")
        return 1
    if stopper.requested is not None:
        say("asked to stop before the server started")
        return 0

    sql_path = fifo.replace("\\", "\\\\").replace("'", "\\'")
    query = f"SYSTEM START LISTEN QUERIES ALL; SELECT count() FROM file('{sql_path}', 'LineAsString')"
    outcome = {}

    def serve():
        try:
            result = _chdb.query(query, "TSV", path=args.data)
            outcome["out"] = result.bytes()
            outcome["err"] = result.error_message()
        except Exception as e:  # noqa: BLE001 - reported below
            outcome["err"] = f"{type(e).__name__}: {e}"

    server = threading.Thread(target=serve, name="clickhouse-local", daemon=True)
    server.start()
    say(f"starting in {args.workdir}")
    while server.is_alive():
        # join with a timeout so that the signal handlers run in this (the main) thread.
        server.join(0.1)
        stopper.poke()
        if stopper.requested is not None and time.monotonic() - stopper.requested > args.stop_timeout:
            say(f"the server did not stop within {args.stop_timeout:g}s; exiting anyway")
            sys.stderr.flush()
            os._exit(1)

    out = (outcome.get("out") or b"").strip()
    if outcome.get("err"):
        say(f"error: {outcome['err']}")
    if out.isdigit():   # the FIFO query ended: a line was written to it
        if stopper.requested is not None:
            say(f"stopped after {time.monotonic() - stopper.requested:.2f}s")
        else:
            say("stopped (a line was written to the FIFO)")
        code = 0
    else:
        say("the server ended by itself (see the error above)")
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip the interpreter's teardown: clickhouse-local has shut down already, and the
    # library's static destructors have nothing left to save.
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
