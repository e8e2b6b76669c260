#!/usr/bin/python3
"""Static checks of the container files, run by scripts/check-containers.sh.

    check-containers.py COMPOSE_CONFIG [--dockerfile]
    check-containers.py engine-compose COMPOSE_CONFIG OUT KEY=VALUE...   (see engine_compose)
    check-containers.py stop-grace COMPOSE_CONFIG SERVICE     (seconds of stop_grace_period)

COMPOSE_CONFIG is the output of `docker-compose config` (anchors merged, variables
interpolated, bind-mount paths made absolute). --dockerfile also checks the Dockerfile and
.dockerignore statically (when no container engine can build the image).

Prints one line per check, "ok    NAME" or "FAIL  NAME: WHY"; the caller counts them.
Standard library and PyYAML (Debian's python3-yaml, a dependency of docker-compose) only.
"""

import fnmatch
import ipaddress
import json
import os
import re
import shlex
import subprocess
import sys
import xml.dom.minidom
import xml.etree.ElementTree as ET
from urllib.parse import urlsplit

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEPLOY = os.path.join(ROOT, "deploy")

# Services that run once and exit; every other service must be restarted by the engine.
ONE_SHOTS = {"credentials", "migrate", "seed"}
# The collector's image as built by compose (every collector-image service has `build`).
COLLECTOR_IMAGE = "collector:latest"
# What the drain may take beyond COLLECTOR_DRAIN_GRACE: in-flight requests (10 s) and the
# writer's last flush (10 s), docs/edge.md "Drain".
DRAIN_EXTRA_S = 20.0
# Services that may publish a port on the host's loopback (monitoring). No ClickHouse server:
# its `default` user is reached from inside its container only (docker compose exec).
LOOPBACK_PORTS = {"prometheus", "grafana"}
# ClickHouse's users (deploy/clickhouse/users.xml): the collectors' and Grafana's.
CH_WRITER, CH_READER = "collector", "dashboard"
# The one-shot that writes the collectors' ClickHouse password file from .env.
CREDENTIALS = "credentials"
LOOPBACK_IPS = {"::1", "127.0.0.1"}


class Checks:
    def __init__(self):
        self.failed = 0

    def result(self, name, problems):
        """problems: a list of strings (empty: pass) or a single string."""
        if isinstance(problems, str):
            problems = [problems]
        if problems:
            self.failed += 1
            print(f"FAIL  {name}: " + "; ".join(problems))
        else:
            print(f"ok    {name}")

    def run(self, name, fn, *args):
        """Runs fn(*args) -> list of problems; an exception is a failure too."""
        try:
            self.result(name, fn(*args))
        except Exception as e:  # noqa: BLE001 - any crash of a check is reported as its failure
            self.result(name, f"{type(e).__name__}: {e}")


# ------------------------------------------------------------------ helpers ---

def duration_s(value):
    """Seconds in a compose / humantime duration such as 40s, 1m30s, 500ms, 1.5s."""
    if isinstance(value, (int, float)):
        return float(value)
    units = {"us": 1e-6, "ms": 1e-3, "s": 1, "m": 60, "h": 3600}
    parts = re.findall(r"(\d+(?:\.\d+)?)\s*(us|ms|s|m|h)", str(value))
    if not parts or "".join(n + u for n, u in parts) != re.sub(r"\s", "", str(value)):
        raise ValueError(f"not a duration: {value!r}")
    return sum(float(n) * units[u] for n, u in parts)


def env_of(svc):
    env = svc.get("environment") or {}
    if isinstance(env, list):  # KEY=VALUE list form
        env = dict(e.split("=", 1) if "=" in e else (e, "") for e in env)
    return {k: ("" if v is None else str(v)) for k, v in env.items()}


def mounts_of(svc):
    """(type, source, target) of every mount, short or long syntax."""
    out = []
    for v in svc.get("volumes") or []:
        if isinstance(v, dict):
            out.append((v.get("type", "volume"), v.get("source", ""), v.get("target", "")))
            continue
        parts = v.split(":")
        src, tgt = parts[0], parts[1] if len(parts) > 1 else parts[0]
        kind = "bind" if src.startswith(("/", ".", "~")) else "volume"
        out.append((kind, src, tgt))
    return out


def xml_root(path):
    xml.dom.minidom.parse(path)  # the well-formedness check asked for; ET for the rest
    return ET.parse(path).getroot()


def text(el, path, default=None):
    found = el.find(path)
    return default if found is None or found.text is None else found.text.strip()


# ------------------------------------------------------------------ compose ---

class Compose:
    def __init__(self, path):
        with open(path) as f:
            self.doc = yaml.safe_load(f)
        self.services = self.doc.get("services") or {}
        self.collectors = sorted(
            n for n, s in self.services.items()
            if s.get("image") == COLLECTOR_IMAGE and n not in ONE_SHOTS)
        self.clickhouse = sorted(
            n for n, s in self.services.items()
            if str(s.get("image", "")).startswith("clickhouse/clickhouse-server"))
        self.keepers = sorted(
            n for n, s in self.services.items()
            if str(s.get("image", "")).startswith("clickhouse/clickhouse-keeper"))


def check_restart(c):
    problems = []
    for name, svc in sorted(c.services.items()):
        want = "no" if name in ONE_SHOTS else "unless-stopped"
        got = str(svc.get("restart", "no"))
        if got != want:
            problems.append(f"{name}: restart {got!r}, want {want!r}")
    for name in sorted(ONE_SHOTS - set(c.services)):
        problems.append(f"one-shot service {name} is missing")
    return problems


def check_one_shots(c):
    problems = []
    migrate = c.services.get("migrate", {})
    if migrate.get("command") not in (["migrate"], "migrate"):
        problems.append(f"migrate: command {migrate.get('command')!r}, want ['migrate']")
    urls = env_of(migrate).get("COLLECTOR_CLICKHOUSE_URLS", "").split(",")
    want = sorted(f"http://{n}:8123" for n in c.clickhouse)
    if sorted(urls) != want:
        problems.append(f"migrate must reach every replica: {urls} != {want}")
    for name in c.collectors + ["seed"]:
        dep = (c.services.get(name, {}).get("depends_on") or {}).get("migrate") or {}
        if dep.get("condition") != "service_completed_successfully":
            problems.append(f"{name}: must depend on migrate with service_completed_successfully")
    return problems


def check_collectors(c):
    problems = []
    if len(c.collectors) < 2:
        problems.append(f"want at least two collectors, found {c.collectors}")
    for name in c.collectors:
        svc = c.services[name]
        env = env_of(svc)
        grace = duration_s(env.get("COLLECTOR_DRAIN_GRACE", "5s"))
        stop = duration_s(svc.get("stop_grace_period", "10s"))
        if not stop > grace + DRAIN_EXTRA_S:
            problems.append(f"{name}: stop_grace_period {stop:g}s is not above drain grace "
                            f"{grace:g}s + {DRAIN_EXTRA_S:g}s")
        test = (svc.get("healthcheck") or {}).get("test")
        if test != ["CMD", "/usr/local/bin/collector", "probe"]:
            problems.append(f"{name}: healthcheck {test!r} is not `collector probe`")
        hosts = [h.rsplit(":", 1)[0] for h in
                 urlsplit(env.get("COLLECTOR_DATABASE_URL", "")).netloc.rsplit("@", 1)[-1].split(",")]
        if hosts != ["postgres-primary", "postgres-standby"]:
            problems.append(f"{name}: COLLECTOR_DATABASE_URL hosts {hosts}, "
                            "want postgres-primary then postgres-standby")
    return problems


def check_replica_orders(c):
    problems = []
    want = sorted(f"http://{n}:8123" for n in c.clickhouse)
    if len(want) != 3:
        problems.append(f"want three ClickHouse replicas, found {c.clickhouse}")
    orders = {}
    for name in c.collectors:
        urls = env_of(c.services[name]).get("COLLECTOR_CLICKHOUSE_URLS", "").split(",")
        if sorted(urls) != want:
            problems.append(f"{name}: replicas {urls} are not exactly {want}")
        orders[name] = tuple(urls)
    if len(set(orders.values())) != len(orders):
        problems.append(f"collectors share a preference order: {orders}")
    firsts = [o[0] for o in orders.values() if o]
    if len(set(firsts)) != len(firsts):
        problems.append(f"collectors prefer the same first replica: {firsts}")
    return problems


def check_spools(c, spool_dir):
    problems, owner = [], {}
    for name, svc in c.services.items():
        for kind, src, tgt in mounts_of(svc):
            if kind == "volume" and src:
                owner.setdefault(src, []).append(name)
    for name in c.collectors:
        vols = [src for kind, src, tgt in mounts_of(c.services[name])
                if kind == "volume" and tgt == spool_dir]
        if len(vols) != 1:
            problems.append(f"{name}: want one named volume at {spool_dir}, found {vols}")
            continue
        if owner[vols[0]] != [name]:
            problems.append(f"spool volume {vols[0]} is mounted by {owner[vols[0]]}: one collector each")
        spool = env_of(c.services[name]).get("COLLECTOR_SPOOL_DIR", spool_dir)
        if spool != spool_dir:
            problems.append(f"{name}: COLLECTOR_SPOOL_DIR {spool} is not the volume's {spool_dir}")
    return problems


def check_network(c):
    problems = []
    nets = c.doc.get("networks") or {}
    subnets = [cfg.get("subnet") for n in nets.values() if n
               for cfg in ((n.get("ipam") or {}).get("config") or [])]
    if len(subnets) != 1:
        return [f"want one network with a fixed subnet, found {subnets}"]
    subnet = ipaddress.ip_network(subnets[0])
    for name in c.collectors:
        trusted = env_of(c.services[name]).get("COLLECTOR_TRUSTED_PROXIES", "")
        if [ipaddress.ip_network(t.strip()) for t in trusted.split(",") if t.strip()] != [subnet]:
            problems.append(f"{name}: COLLECTOR_TRUSTED_PROXIES {trusted!r} is not the subnet {subnet}")
    users = xml_root(os.path.join(DEPLOY, "clickhouse", "users.xml"))
    for user in (CH_WRITER, CH_READER):
        ips = [e.text.strip() for e in users.findall(f"./users/{user}/networks/ip")]
        if ips != [str(subnet)]:
            problems.append(f"deploy/clickhouse/users.xml lets `{user}` in from {ips}, not from {subnet} only")
    return problems


def check_ports(c):
    problems = []
    for name, svc in sorted(c.services.items()):
        for p in svc.get("ports") or []:
            if isinstance(p, dict):
                host_ip = p.get("host_ip", "")
            else:
                parts = str(p).split(":")
                host_ip = parts[0] if len(parts) == 3 else ""
            if name == "caddy":
                continue
            if name in LOOPBACK_PORTS and host_ip == "127.0.0.1":
                continue  # monitoring ports, loopback only
            problems.append(f"{name} publishes {p} (only caddy may, and "
                            f"{', '.join(sorted(LOOPBACK_PORTS))} on 127.0.0.1)")
    if not c.services.get("caddy", {}).get("ports"):
        problems.append("caddy publishes no port")
    return problems


def check_binds(c):
    problems, used = [], set()
    for name, svc in sorted(c.services.items()):
        for kind, src, tgt in mounts_of(svc):
            if kind != "bind":
                continue
            path = os.path.normpath(os.path.join(ROOT, src))
            rel = os.path.relpath(path, ROOT)
            used.add(rel)
            if not os.path.exists(path):
                problems.append(f"{name}: {rel} does not exist")
            elif not (rel == "deploy" or rel.startswith("deploy" + os.sep)):
                problems.append(f"{name}: {rel} is outside deploy/")
    if not used:
        problems.append("no bind mounts found (compose config changed shape?)")
    return problems


def check_images_pinned(c):
    problems = []
    for name, svc in sorted(c.services.items()):
        image = str(svc.get("image", ""))
        if "build" in svc:
            continue
        tag = image.rsplit(":", 1)[1] if ":" in image.rsplit("/", 1)[-1] else ""
        if tag in ("", "latest"):
            problems.append(f"{name}: image {image!r} is not pinned to a version")
    return problems


def check_caddyfile(c):
    problems = []
    path = os.path.join(DEPLOY, "caddy", "Caddyfile")
    body = "\n".join(line.split("#", 1)[0] for line in open(path))
    m = re.search(r"handle\s+@collector\s*\{\s*uri\s+strip_prefix\s+/perf\s.*?"
                  r"reverse_proxy\s+([^{\n]+)\{(.*?)\}", body, re.S)
    if not m:
        return ["no `handle @collector` that strips /perf with a reverse_proxy block"]
    matcher = re.search(r"@collector\s+path_regexp\s+(\S+)", body)
    if not matcher or "metrics" in matcher.group(1) or "script" not in matcher.group(1):
        problems.append("the @collector matcher does not name only the public paths")
    if not re.search(r"handle\s+/perf/\*\s*\{\s*respond\s+\S.*?404", body, re.S):
        problems.append("the rest of /perf/* is not answered 404")
    upstreams = sorted(m.group(1).split())
    want = sorted(f"{n}:8080" for n in c.collectors)
    if upstreams != want:
        problems.append(f"upstreams {upstreams} are not the collectors {want}")
    if not re.search(r"^\s*health_uri\s+/readyz\s*$", m.group(2), re.M):
        problems.append("no active health check `health_uri /readyz`")
    caddy = c.services.get("caddy", {})
    targets = {tgt: os.path.relpath(os.path.normpath(os.path.join(ROOT, src)), ROOT)
               for kind, src, tgt in mounts_of(caddy) if kind == "bind"}
    if targets.get("/etc/caddy/Caddyfile") != os.path.join("deploy", "caddy", "Caddyfile"):
        problems.append("caddy does not mount deploy/caddy/Caddyfile at /etc/caddy/Caddyfile")
    root = re.search(r"root\s+\*\s+(\S+)", body)
    if not root or targets.get(root.group(1)) != os.path.join("deploy", "demo"):
        problems.append("the file_server root is not deploy/demo mounted into caddy")
    return problems


def check_demo():
    problems = []
    src_dir, dst_dir = os.path.join(ROOT, "demo"), os.path.join(DEPLOY, "demo")
    for f in sorted(os.listdir(src_dir)):
        src, dst = os.path.join(src_dir, f), os.path.join(dst_dir, f)
        if not os.path.exists(dst):
            problems.append(f"deploy/demo/{f} is missing (copy of demo/{f})")
            continue
        a, b = open(src, "rb").read(), open(dst, "rb").read()
        if f == "index.html":
            a = a.replace(b'src="__COLLECTOR__/', b'src="/perf/')
        if a != b:
            problems.append(f"deploy/demo/{f} differs from demo/{f}"
                            + (" (beyond __COLLECTOR__ -> /perf)" if f == "index.html" else ""))
    if b"__COLLECTOR__" in open(os.path.join(dst_dir, "index.html"), "rb").read():
        problems.append("deploy/demo/index.html still has the __COLLECTOR__ placeholder")
    return problems


# ------------------------------------------------------------ ClickHouse users ---

# What the collector's statements need (docs/deployment.md, "ClickHouse users"); anything
# beyond is refused by the check, so that a widened grant is a deliberate change here too.
WRITER_RIGHTS = {"SELECT", "INSERT", "CREATE DATABASE", "CREATE TABLE", "ALTER ADD COLUMN",
                 "ALTER DELETE", "ALTER MODIFY TTL", "DROP TABLE"}
READER_RIGHTS = {"SELECT"}
# System tables the collector reads that ClickHouse 26.x shows only with a grant (SELECT only).
WRITER_SYSTEM_TABLES = {"system.replicas", "system.mutations", "system.parts", "system.macros",
                        "system.merge_tree_settings"}
# The engines of the measurements table (replicated and single-server form): ClickHouse 26.x
# creates a table only with TABLE ENGINE on its engine.
WRITER_ENGINES = {"ReplicatedReplacingMergeTree", "ReplacingMergeTree"}


def grants_of(user_el):
    """[(set of privileges, target)] of a users.xml user's <grants><query>GRANT ... ON x</query>;
    a query of another shape is returned as (None, query)."""
    out = []
    for q in user_el.findall("./grants/query"):
        m = re.fullmatch(r"\s*GRANT\s+(.+?)\s+ON\s+(\S+)\s*", q.text or "", re.I | re.S)
        if not m:
            out.append((None, (q.text or "").strip()))
            continue
        out.append(({re.sub(r"\s+", " ", p.strip().upper()) for p in m.group(1).split(",")}, m.group(2)))
    return out


def password_env(user_el):
    """The environment variable a user's password is read from (from_env), or None."""
    for tag in ("password", "password_sha256_hex", "password_double_sha1_hex"):
        el = user_el.find(tag)
        if el is not None and el.get("from_env"):
            return el.get("from_env")
    return None


def check_clickhouse_users(c):
    problems = []
    root = xml_root(os.path.join(DEPLOY, "clickhouse", "users.xml"))
    users = root.find("users")
    if users is None:
        return ["deploy/clickhouse/users.xml has no <users>"]
    default = users.find("default")
    if default is None:
        problems.append("`default` is not restricted (no <default> in users.xml)")
    else:
        nets = default.find("networks")
        ips = {e.text.strip() for e in nets.findall("ip")} if nets is not None else set()
        others = [e.tag for e in nets if e.tag != "ip"] if nets is not None else []
        if nets is None or not ips or not ips <= LOOPBACK_IPS or others:
            problems.append(f"`default` must come from loopback only (<networks> "
                            f"with ::1/127.0.0.1): found {sorted(ips)} {others}")
    profiles = root.find("profiles")
    env_names = {}
    for user, allowed in ((CH_WRITER, WRITER_RIGHTS), (CH_READER, READER_RIGHTS)):
        el = users.find(user)
        if el is None:
            problems.append(f"no user `{user}`")
            continue
        if el.find("password") is not None and el.find("password").text and not el.find("password").get("from_env"):
            problems.append(f"`{user}`: a password written in users.xml (it must come from .env)")
        env = password_env(el)
        if not env:
            problems.append(f"`{user}`: no password from_env")
        env_names[user] = env
        ips = [e.text.strip() for e in el.findall("./networks/ip")]
        if not ips or any(ipaddress.ip_network(i).num_addresses > 256 for i in ips):
            problems.append(f"`{user}`: networks {ips}: want the stack's subnet")
        grants = grants_of(el)
        if not grants:
            problems.append(f"`{user}`: no <grants> (a user without them gets every right)")
        for privs, target in grants:
            if privs is None:
                problems.append(f"`{user}`: grant {target!r} is not `GRANT ... ON collector.*`")
            elif user == CH_WRITER and target in WRITER_SYSTEM_TABLES:
                if privs != {"SELECT"}:
                    problems.append(f"`{user}`: grants {sorted(privs)} on {target}, want SELECT only")
            elif user == CH_WRITER and target in WRITER_ENGINES:
                if privs != {"TABLE ENGINE"}:
                    problems.append(f"`{user}`: grants {sorted(privs)} on {target}, want TABLE ENGINE only")
            elif target != "collector.*":
                problems.append(f"`{user}`: grant on {target}, want collector.* only")
            elif privs - allowed:
                problems.append(f"`{user}`: grants {sorted(privs - allowed)} beyond {sorted(allowed)}")
        if el.find("access_management") is not None and text(el, "access_management") != "0":
            problems.append(f"`{user}`: access_management is on")
    reader = users.find(CH_READER)
    if reader is not None:
        prof = text(reader, "profile")
        readonly = text(profiles, f"./{prof}/readonly") if profiles is not None and prof else None
        if readonly not in ("1", "2"):
            problems.append(f"`{CH_READER}`: profile {prof!r} has readonly {readonly!r}, want 1 (or 2)")
    # Every replica gets the passwords (from .env: compose.yaml refuses to start without them).
    for name in c.clickhouse:
        env = env_of(c.services[name])
        for user, var in env_names.items():
            if var and not env.get(var):
                problems.append(f"{name}: {var} (the password of `{user}`) is not in its environment")
    return problems


def check_collector_credentials(c):
    problems = []
    cred = c.services.get(CREDENTIALS)
    if cred is None:
        return [f"no service {CREDENTIALS}"]
    users = xml_root(os.path.join(DEPLOY, "clickhouse", "users.xml"))
    writer = users.find(f"./users/{CH_WRITER}")
    var = password_env(writer) if writer is not None else None
    cred_vols = {tgt: src for kind, src, tgt in mounts_of(cred) if kind == "volume"}
    command = " ".join(cred.get("command") or []) if isinstance(cred.get("command"), list) else str(cred.get("command"))
    if not var or not env_of(cred).get(var):
        problems.append(f"{CREDENTIALS}: {var} (the password of `{CH_WRITER}`) is not in its environment")
    elif f"${var}" not in command.replace("$$", "$"):
        problems.append(f"{CREDENTIALS}: its command does not write ${var}")
    if "chown 10001:10001" not in command:
        problems.append(f"{CREDENTIALS}: the file is not given to uid 10001 (the collector)")
    if str(cred.get("network_mode")) != "none":
        problems.append(f"{CREDENTIALS}: network_mode {cred.get('network_mode')!r}, want 'none'")
    for name in c.collectors + sorted(ONE_SHOTS - {CREDENTIALS}):
        svc = c.services.get(name)
        if svc is None:
            continue
        env = env_of(svc)
        if env.get("COLLECTOR_CLICKHOUSE_USER") != CH_WRITER:
            problems.append(f"{name}: COLLECTOR_CLICKHOUSE_USER {env.get('COLLECTOR_CLICKHOUSE_USER')!r}, want {CH_WRITER!r}")
        pw = env.get("COLLECTOR_CLICKHOUSE_PASSWORD_FILE", "")
        if not pw:
            problems.append(f"{name}: no COLLECTOR_CLICKHOUSE_PASSWORD_FILE")
            continue
        # The file's folder is the volume `credentials` writes, mounted read-only here.
        folder, fname = os.path.split(pw)
        mounted = [v for v in (svc.get("volumes") or [])
                   if mounts_of({"volumes": [v]})[0][2] == folder]
        kind, src, _ = mounts_of({"volumes": mounted[:1]})[0] if mounted else ("", "", "")
        ro = bool(mounted) and (mounted[0].get("read_only") if isinstance(mounted[0], dict)
                                else str(mounted[0]).endswith(":ro"))
        if not mounted or kind != "volume" or src not in cred_vols.values():
            problems.append(f"{name}: {folder} is not the volume {CREDENTIALS} writes")
        elif not ro:
            problems.append(f"{name}: {folder} is mounted writable")
        elif f" {fname}" not in command or "mv -f" not in command:
            problems.append(f"{name}: {CREDENTIALS} does not write {fname}")
        if var and var in env:
            problems.append(f"{name}: {var} is in its environment (it must only get the file)")
    dep = (c.services.get("migrate", {}).get("depends_on") or {}).get(CREDENTIALS) or {}
    if dep.get("condition") != "service_completed_successfully":
        problems.append(f"migrate does not wait for {CREDENTIALS} to complete successfully")
    return problems


def check_grafana_clickhouse(c):
    problems = []
    graf = c.services.get("grafana")
    if graf is None:
        return ["no grafana service"]
    users = xml_root(os.path.join(DEPLOY, "clickhouse", "users.xml"))
    reader = users.find(f"./users/{CH_READER}")
    var = password_env(reader) if reader is not None else None
    path = os.path.join(DEPLOY, "grafana", "provisioning", "datasources", "clickhouse.yml")
    if not os.path.exists(path):
        return ["no deploy/grafana/provisioning/datasources/clickhouse.yml"]
    sources = [d for d in yaml.safe_load(open(path))["datasources"]
               if d.get("type") == "grafana-clickhouse-datasource"]
    if len(sources) != 1:
        return [f"want one ClickHouse data source, found {len(sources)}"]
    ds = sources[0]
    jd, sec = ds.get("jsonData") or {}, ds.get("secureJsonData") or {}
    if jd.get("username") != CH_READER:
        problems.append(f"data source username {jd.get('username')!r}, want {CH_READER!r}")
    if jd.get("host") not in c.clickhouse:
        problems.append(f"data source host {jd.get('host')!r} is not a ClickHouse service")
    if sec.get("password") not in (f"${var}", f"${{{var}}}", f"$__env{{{var}}}"):
        problems.append(f"data source password {sec.get('password')!r}, want ${var}")
    env = env_of(graf)
    if not var or not env.get(var):
        problems.append(f"grafana: {var} is not in its environment")
    if "grafana-clickhouse-datasource" not in env.get("GF_INSTALL_PLUGINS", ""):
        problems.append("grafana: GF_INSTALL_PLUGINS does not install grafana-clickhouse-datasource")
    return problems


# --------------------------------------------------------------- monitoring ---

def check_monitoring(c):
    """Prometheus scrapes exactly the collectors with the rules of deploy/prometheus; Grafana
    gets the data source the dashboard names and the dashboard."""
    problems = []
    prom = c.services.get("prometheus")
    if prom is None:
        return ["no prometheus service"]
    binds = {tgt: os.path.relpath(os.path.normpath(os.path.join(ROOT, src)), ROOT)
             for kind, src, tgt in mounts_of(prom) if kind == "bind"}
    if binds.get("/etc/prometheus") != os.path.join("deploy", "prometheus"):
        problems.append("prometheus does not mount deploy/prometheus at /etc/prometheus")
    config = yaml.safe_load(open(os.path.join(DEPLOY, "prometheus", "prometheus.yml")))
    jobs = {j.get("job_name"): j for j in config.get("scrape_configs") or []}
    targets = sorted(t for sc in (jobs.get("collector") or {}).get("static_configs") or []
                     for t in sc.get("targets") or [])
    want = sorted(f"{n}:9464" for n in c.collectors)
    if targets != want:
        problems.append(f"job collector scrapes {targets}, not the collectors' operations "
                        f"listeners {want}")
    for f in config.get("rule_files") or []:
        if not os.path.exists(os.path.join(DEPLOY, "prometheus", f)):
            problems.append(f"rule file {f} is not in deploy/prometheus")
    graf = c.services.get("grafana")
    if graf is None:
        return problems + ["no grafana service"]
    binds = {tgt: os.path.relpath(os.path.normpath(os.path.join(ROOT, src)), ROOT)
             for kind, src, tgt in mounts_of(graf) if kind == "bind"}
    provider = yaml.safe_load(open(os.path.join(DEPLOY, "grafana", "provisioning", "dashboards",
                                                "collector.yml")))
    path = provider["providers"][0]["options"]["path"]
    if binds.get(f"{path}/collector.json") != os.path.join("deploy", "grafana", "collector.json"):
        problems.append(f"grafana does not mount deploy/grafana/collector.json under {path}")
    for sub in ("datasources", "dashboards"):
        if binds.get(f"/etc/grafana/provisioning/{sub}") != os.path.join(
                "deploy", "grafana", "provisioning", sub):
            problems.append(f"grafana does not mount deploy/grafana/provisioning/{sub}")
    sources = yaml.safe_load(open(os.path.join(DEPLOY, "grafana", "provisioning", "datasources",
                                               "prometheus.yml")))["datasources"]
    uids = {d["uid"] for d in sources if d.get("url") == "http://prometheus:9090"}
    dashboard = json.load(open(os.path.join(DEPLOY, "grafana", "collector.json")))
    used = {p.get("datasource", {}).get("uid") for p in dashboard.get("panels", [])}
    used |= {t.get("datasource", {}).get("uid") for p in dashboard.get("panels", [])
             for t in p.get("targets", [])}
    if not used or not used <= uids:
        problems.append(f"dashboard data sources {sorted(map(str, used))} are not the "
                        f"provisioned Prometheus {sorted(uids)}")
    return problems


# --------------------------------------------------------------- ClickHouse ---

def check_xml_parses():
    problems, n = [], 0
    for dirpath, _, files in os.walk(DEPLOY):
        for f in sorted(files):
            if f.endswith(".xml"):
                n += 1
                try:
                    xml_root(os.path.join(dirpath, f))
                except Exception as e:  # noqa: BLE001
                    problems.append(f"{os.path.relpath(os.path.join(dirpath, f), ROOT)}: {e}")
    return problems if n else ["no XML file under deploy/"]


def stack_sh_config():
    """A replica config as the stack writes it (stack/src/clickhouse.rs, placeholder ports)."""
    out = subprocess.run([os.path.join(ROOT, "scripts", "stack.sh"), "sample-replica-config"],
                         check=True, capture_output=True, text=True).stdout
    return ET.fromstring(out)


def shape(root):
    """What must match between the stack's replica config and the deploy one."""
    clusters = {}
    for cl in root.findall("./remote_servers/*"):
        clusters[cl.tag] = [
            (text(sh, "internal_replication"), sorted({c.tag for r in sh.findall("replica") for c in r}))
            for sh in cl.findall("shard")]
    return {
        "macros": sorted(e.tag for e in root.findall("./macros/*")),
        "shard macro": text(root, "./macros/shard"),
        "zookeeper node": sorted({c.tag for n in root.findall("./zookeeper/node") for c in n}),
        "clusters": clusters,
    }


def replica_configs(c):
    """{service: merged root} of cluster.xml + the rN.xml each replica mounts in config.d."""
    out = {}
    for name in c.clickhouse:
        files = [os.path.normpath(os.path.join(ROOT, src)) for kind, src, tgt
                 in mounts_of(c.services[name])
                 if kind == "bind" and tgt.startswith("/etc/clickhouse-server/config.d/")]
        merged = ET.Element("clickhouse")
        for f in files:
            for child in xml_root(f):
                if merged.find(child.tag) is not None:
                    raise ValueError(f"{name}: <{child.tag}> is in more than one config.d file")
                merged.append(child)
        out[name] = (merged, [os.path.relpath(f, ROOT) for f in files])
    return out


def check_clickhouse_shape(c):
    problems = []
    want = shape(stack_sh_config())
    for name, (root, files) in replica_configs(c).items():
        got = shape(root)
        for key in want:
            if got[key] != want[key]:
                problems.append(f"{name} ({', '.join(files)}): {key} {got[key]} != the stack's {want[key]}")
    return problems


def check_clickhouse_replicas(c):
    problems, seen = [], set()
    keeper_port = text(xml_root(os.path.join(DEPLOY, "keeper", "keeper.xml")), "./keeper_server/tcp_port")
    for name, (root, files) in replica_configs(c).items():
        rn = name.rsplit("-", 1)[-1]  # clickhouse-r1 -> r1
        replica = text(root, "./macros/replica")
        if replica != rn:
            problems.append(f"{name}: macro replica {replica!r}, want {rn!r} ({', '.join(files)})")
        if replica in seen:
            problems.append(f"macro replica {replica!r} is used twice")
        seen.add(replica)
        if text(root, "interserver_http_host") != name:
            problems.append(f"{name}: interserver_http_host {text(root, 'interserver_http_host')!r}, "
                            f"want the service name")
        hosts = sorted(text(r, "host") for r in root.findall("./remote_servers/collector/shard/replica"))
        if hosts != c.clickhouse:
            problems.append(f"{name}: cluster collector lists {hosts}, want {c.clickhouse}")
        zk = sorted((text(n, "host"), text(n, "port")) for n in root.findall("./zookeeper/node"))
        if zk != [(k, keeper_port) for k in c.keepers]:
            problems.append(f"{name}: zookeeper nodes {zk}, want the keepers {c.keepers} on {keeper_port}")
        users = [tgt for kind, src, tgt in mounts_of(c.services[name])
                 if kind == "bind" and src.endswith("deploy/clickhouse/users.xml")]
        if "/etc/clickhouse-server/users.xml" not in users:
            problems.append(f"{name}: deploy/clickhouse/users.xml is not mounted as the server's users.xml")
    return problems


def check_keeper(c):
    problems = []
    root = xml_root(os.path.join(DEPLOY, "keeper", "keeper.xml"))
    servers = {text(s, "id"): text(s, "hostname")
               for s in root.findall("./keeper_server/raft_configuration/server")}
    if sorted(servers.values()) != c.keepers or len(c.keepers) != 3:
        problems.append(f"raft servers {servers} are not the three keeper services {c.keepers}")
    sid = root.find("./keeper_server/server_id")
    env_name = sid.get("from_env") if sid is not None else None
    if not env_name:
        return problems + ["keeper_server/server_id must come from_env"]
    for name in c.keepers:
        got = env_of(c.services[name]).get(env_name)
        if servers.get(got) != name:
            problems.append(f"{name}: {env_name}={got!r} is the raft id of {servers.get(got)!r}")
    return problems


# --------------------------------------------------------------- Dockerfile ---

def dockerfile_instructions(path):
    """[(INSTRUCTION, arguments)] with continuations joined and comments dropped."""
    out, cur = [], ""
    for line in open(path):
        s = line.rstrip("\n")
        if not cur and (not s.strip() or s.lstrip().startswith("#")):
            continue
        if cur and s.lstrip().startswith("#"):
            continue  # comment inside a continued instruction
        if s.endswith("\\"):
            cur += s[:-1] + " "
            continue
        cur += s
        word, _, rest = cur.strip().partition(" ")
        out.append((word.upper(), rest.strip()))
        cur = ""
    return out


def stages(instrs):
    result = []
    for ins, args in instrs:
        if ins == "FROM":
            words = args.split()
            alias = words[2] if len(words) >= 3 and words[1].lower() == "as" else None
            result.append({"from": words[0], "as": alias, "ins": []})
        elif result:
            result[-1]["ins"].append((ins, args))
    return result


def env_pairs(args):
    words = shlex.split(args)
    if len(words) == 2 and "=" not in words[0]:
        return {words[0]: words[1]}
    return dict(w.split("=", 1) for w in words)


def dockerignore_excluded(rel, patterns):
    """Whether the build context leaves out path rel (Docker's rule: the last pattern that
    matches the path or one of its parent folders decides)."""
    parts = rel.split("/")
    prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    excluded = False
    for pat in patterns:
        neg = pat.startswith("!")
        p = pat[1:] if neg else pat
        p = p.strip("/")
        if p.startswith("**/"):
            hit = any(fnmatch.fnmatch(x.split("/")[-1], p[3:]) or fnmatch.fnmatch(x, p[3:])
                      for x in prefixes)
        else:
            hit = any(fnmatch.fnmatch(x, p) and x.count("/") == p.count("/") for x in prefixes)
        if hit:
            excluded = not neg
    return excluded


def check_dockerfile():
    problems = []
    st = stages(dockerfile_instructions(os.path.join(ROOT, "Dockerfile")))
    if len(st) < 2:
        return [f"want a multi-stage build, found {len(st)} stage(s)"]
    builder, final = st[0], st[-1]
    if builder["as"] != "builder" or not builder["from"].startswith("rust:"):
        problems.append(f"first stage is FROM {builder['from']} AS {builder['as']}, "
                        "want a rust image AS builder")
    if not any(i == "RUN" and "cargo build --release -p collector --locked" in a for i, a in builder["ins"]):
        problems.append("the builder never runs `cargo build --release -p collector --locked`")
    if not (final["from"].startswith("debian:bookworm-slim") or "distroless/cc" in final["from"]):
        problems.append(f"runtime stage FROM {final['from']}: want debian:bookworm-slim or distroless cc")
    fi = final["ins"]
    users = [a for i, a in fi if i == "USER"]
    if not users or users[-1].split(":")[0] in ("root", "0"):
        problems.append(f"runtime USER {users[-1] if users else 'missing'}: must be a non-root user")
    elif not users[-1].split(":")[0].isdigit():
        problems.append(f"runtime USER {users[-1]}: use a fixed numeric uid (volumes are chowned by number)")
    hc = [a for i, a in fi if i == "HEALTHCHECK"]
    cmd = hc[-1].split("CMD", 1)[1].strip() if hc and "CMD" in hc[-1] else ""
    try:
        probe = json.loads(cmd) if cmd.startswith("[") else None
    except ValueError:
        probe = None
    if probe != ["/usr/local/bin/collector", "probe"]:
        problems.append(f"HEALTHCHECK {hc[-1] if hc else 'missing'}: want CMD [\"/usr/local/bin/collector\", \"probe\"]")
    if [a for i, a in fi if i == "STOPSIGNAL"] != ["SIGTERM"]:
        problems.append("STOPSIGNAL SIGTERM is missing")
    env = {}
    for i, a in fi:
        if i == "ENV":
            env.update(env_pairs(a))
    spool = env.get("COLLECTOR_SPOOL_DIR")
    vols = []
    for i, a in fi:
        if i == "VOLUME":
            vols += json.loads(a) if a.startswith("[") else a.split()
    if not spool or spool not in vols:
        problems.append(f"no VOLUME for the spool (COLLECTOR_SPOOL_DIR={spool}, VOLUME {vols})")
    if env.get("COLLECTOR_LISTEN") != "0.0.0.0:8080":
        problems.append(f"COLLECTOR_LISTEN={env.get('COLLECTOR_LISTEN')}, want 0.0.0.0:8080")
    if "8080" not in " ".join(a for i, a in fi if i == "EXPOSE").split():
        problems.append("EXPOSE 8080 is missing")
    if env.get("COLLECTOR_ADMIN_LISTEN") != "0.0.0.0:9464":
        problems.append(f"COLLECTOR_ADMIN_LISTEN={env.get('COLLECTOR_ADMIN_LISTEN')}, want 0.0.0.0:9464")
    if not any(i == "COPY" and "--from=builder" in a and "/usr/local/bin/collector" in a for i, a in fi):
        problems.append("the runtime does not COPY --from=builder the binary to /usr/local/bin/collector")
    # Cache-friendly order: only manifests are copied before the first cargo build.
    copied_before = []
    for i, a in builder["ins"]:
        if i == "RUN" and "cargo build" in a:
            break
        if i == "COPY":
            copied_before += [w for w in a.split()[:-1] if not w.startswith("--")]
    stray = [p for p in copied_before if os.path.basename(p) not in ("Cargo.toml", "Cargo.lock")]
    if not copied_before or stray:
        problems.append(f"the first cargo build should see only manifests (dependency layer), "
                        f"but it sees {stray or 'nothing'}")
    return problems


# The licence notices in the image: the project's LICENSE and the generated third-party file
# (scripts/third-party-licenses.py), copied from the build context by the runtime stage.
LICENSE_FILES = ["LICENSE", "collector/THIRD-PARTY-LICENSES"]
LICENSE_DIR = "/usr/share/doc/collector/"


def check_license_copy():
    problems = []
    final_instructions = stages(dockerfile_instructions(os.path.join(ROOT, "Dockerfile")))[-1]["ins"]
    patterns = [line.strip() for line in open(os.path.join(ROOT, ".dockerignore"))
                if line.strip() and not line.lstrip().startswith("#")]
    copied = {}
    for i, a in final_instructions:
        if i == "COPY" and "--from" not in a:
            words = [w for w in a.split() if not w.startswith("--")]
            for src in words[:-1]:
                copied[src] = words[-1]
    for f in LICENSE_FILES:
        dst = copied.get(f)
        if dst is None:
            problems.append(f"the runtime stage does not COPY {f} (licence notices)")
        elif not (dst == LICENSE_DIR or dst == LICENSE_DIR + os.path.basename(f)):
            problems.append(f"{f} is copied to {dst}, want {LICENSE_DIR}")
        elif not os.path.exists(os.path.join(ROOT, f)):
            problems.append(f"{f} does not exist")
        elif dockerignore_excluded(f, patterns):
            problems.append(f"{f} is left out of the build context by .dockerignore")
    notices = os.path.join(ROOT, "collector", "THIRD-PARTY-LICENSES")
    if os.path.exists(notices):
        body = open(notices, encoding="utf-8").read()
        for folder in ("crawler-user-agents", "uap-core"):
            if f"collector/assets/{folder}/LICENSE" not in body:
                problems.append(f"collector/THIRD-PARTY-LICENSES lacks the licence of collector/assets/{folder}")
    return problems


def check_build_context():
    """Every COPY source of the builder, and every file the crate compiles in with
    include_str!/include_bytes!, is in the build context and copied into the builder."""
    problems = []
    patterns = [line.strip() for line in open(os.path.join(ROOT, ".dockerignore"))
                if line.strip() and not line.lstrip().startswith("#")]
    for must_go in ("target", ".stack", ".git", "spool", ".env", "deploy"):
        if not dockerignore_excluded(must_go + "/x", patterns) and not dockerignore_excluded(must_go, patterns):
            problems.append(f".dockerignore lets {must_go} into the build context")
    st = stages(dockerfile_instructions(os.path.join(ROOT, "Dockerfile")))
    sources = []
    for i, a in st[0]["ins"]:
        if i == "COPY" and "--from" not in a:
            sources += [w for w in a.split()[:-1] if not w.startswith("--")]
    for s in sources:
        path = os.path.join(ROOT, s)
        if not os.path.exists(path):
            problems.append(f"COPY {s}: does not exist")
            continue
        # A folder counts as sent when some file in it is (an allow-list re-includes parts).
        files = [os.path.relpath(os.path.join(d, f), ROOT)
                 for d, _, fs in os.walk(path) for f in fs] if os.path.isdir(path) else [s]
        if all(dockerignore_excluded(f, patterns) for f in files):
            problems.append(f"COPY {s}: left out of the build context by .dockerignore")

    def in_builder(rel):
        return any(rel == s or rel.startswith(s.rstrip("/") + "/") for s in sources)

    src_dir = os.path.join(ROOT, "collector", "src")
    found = 0
    for dirpath, _, files in os.walk(src_dir):
        for f in files:
            if not f.endswith(".rs"):
                continue
            path = os.path.join(dirpath, f)
            for m in re.finditer(r'include_(?:str|bytes)!\(\s*"([^"]+)"', open(path).read()):
                found += 1
                rel = os.path.relpath(os.path.normpath(os.path.join(dirpath, m.group(1))), ROOT)
                if not os.path.exists(os.path.join(ROOT, rel)):
                    problems.append(f"{os.path.relpath(path, ROOT)} includes {rel}, which does not exist")
                elif dockerignore_excluded(rel, patterns):
                    problems.append(f"{rel} (compiled in) is left out by .dockerignore")
                elif not in_builder(rel):
                    problems.append(f"{rel} (compiled in) is not copied into the builder")
    if not found:
        problems.append("no include_str! found in collector/src (expected the schema files)")
    return problems


# ------------------------------------------------------- engine compose file ---

# The part of compose.yaml that runs on a machine with podman but no image registry and no
# network but loopback (scripts/check-containers.sh --engine).
ENGINE_SERVICES = ["postgres-primary", "postgres-standby", "credentials", "migrate", "seed", "collector-a",
                   "collector-b"]
POSTGRES_SERVICES = {"postgres-primary", "postgres-standby"}
POSTGRES_PORT = "5432"


def engine_compose(config, out, opts):
    """Writes to `out` the services ENGINE_SERVICES of the resolved compose file `config`,
    changed only where this machine needs it, everything else (commands, entrypoints,
    environment, health checks, stop_grace_period, read_only, cap_drop, security_opt, mounts,
    restart, depends_on conditions among these services) kept as compose.yaml has it:

    - network_mode host (but where it is none), no networks or ports: every server listens on 127.0.0.1 on its own
      port (opts[SERVICE] for the PostgreSQL servers and the collectors), and the service
      names in URLs and variables become those loopback addresses; the ClickHouse services
      become the loopback replicas of scripts/stack.sh (opts["clickhouse-rN"], URLs);
    - depends_on entries on services not started here (ClickHouse) are dropped;
    - images: the collector image built by the checks (opts["image"], no `build`), and the
      local stand-in for postgres:15 (opts["postgres_image"]);
    - named volumes prefixed with opts["volume_prefix"], so that they never meet a real
      stack's volumes on the same machine;
    - ulimits nofile lowered to the host's hard limit (opts["nofile"]) when above it, and
      nproc opts["nproc"] beside it (this VM refuses podman's own values).
    """
    doc = yaml.safe_load(open(config))
    hosts = {}  # "name:port" -> "127.0.0.1:port", and http URLs of the replicas
    for name in POSTGRES_SERVICES:
        hosts[f"{name}:{POSTGRES_PORT}"] = f"127.0.0.1:{opts[name]}"
    urls = {f"http://{n}:8123": opts[n] for n in doc["services"] if n.startswith("clickhouse-r")}

    def rewrite(value):
        for a, b in list(urls.items()) + list(hosts.items()):
            value = value.replace(a, b)
        return value

    services, volumes = {}, {}
    for name in ENGINE_SERVICES:
        svc = dict(doc["services"][name])
        svc.pop("networks", None)
        svc.pop("ports", None)
        if svc.get("network_mode") != "none":  # `credentials` needs no network at all
            svc["network_mode"] = "host"
        deps = svc.get("depends_on") or {}
        if isinstance(deps, list):
            deps = {d: {"condition": "service_started"} for d in deps}
        deps = {d: c for d, c in deps.items() if d in ENGINE_SERVICES}
        if deps:
            svc["depends_on"] = deps
        else:
            svc.pop("depends_on", None)
        if svc.get("image") == COLLECTOR_IMAGE:
            svc.pop("build", None)
            svc["image"] = opts["image"]
        elif str(svc.get("image", "")).startswith("postgres:"):
            svc["image"] = opts["postgres_image"]
        env = {k: rewrite(v) for k, v in env_of(svc).items()}
        if name in POSTGRES_SERVICES:
            port = opts[name]
            svc["command"] = list(svc["command"]) + ["-c", f"port={port}", "-c", "listen_addresses=127.0.0.1"]
            hc = dict(svc["healthcheck"])
            hc["test"] = [port if w == POSTGRES_PORT else w for w in hc["test"]]
            svc["healthcheck"] = hc
            if "PRIMARY_HOST" in env:
                env["PRIMARY_HOST"] = "127.0.0.1"
                env["PRIMARY_PORT"] = opts["postgres-primary"]
        if name in opts and name not in POSTGRES_SERVICES:  # the collectors
            env["COLLECTOR_LISTEN"] = f"127.0.0.1:{opts[name]}"
            env["COLLECTOR_ADMIN_LISTEN"] = f"127.0.0.1:{opts[name + '-admin']}"
        svc["environment"] = env
        if svc.get("ulimits"):
            ulimits = dict(svc["ulimits"])
            nofile = ulimits.get("nofile")
            if isinstance(nofile, dict):
                ulimits["nofile"] = {k: min(int(v), int(opts["nofile"])) for k, v in nofile.items()}
            # Podman then sets only the ulimits given, and its own nproc is refused here.
            ulimits.setdefault("nproc", {"soft": int(opts["nproc"]), "hard": int(opts["nproc"])})
            svc["ulimits"] = ulimits
        mounts = []
        for v in svc.get("volumes") or []:
            kind, src, tgt = mounts_of({"volumes": [v]})[0]
            if kind == "volume" and src:
                new = f"{opts['volume_prefix']}-{src}"
                volumes[new] = {"name": new}
                v = {**v, "source": new} if isinstance(v, dict) else new + v[len(src):]
            mounts.append(v)
        if mounts:
            svc["volumes"] = mounts
        services[name] = svc
    out_doc = {"services": services, "volumes": volumes}
    if "version" in doc:
        out_doc["version"] = doc["version"]
    with open(out, "w") as f:
        f.write("# Made by scripts/check-containers.py engine-compose from compose.yaml: see engine_compose().\n")
        yaml.safe_dump(out_doc, f, sort_keys=True)
    return 0


def check_edge(c):
    """The edge services (profile "edge"): deploy/edge/ mounted where the run scripts expect it,
    host networking (VRRP), the capabilities keepalived needs, one container per host."""
    problems = []
    edge = {n: s for n, s in c.services.items() if "edge" in (s.get("profiles") or [])}
    if sorted(edge) != ["edge-haproxy", "edge-keepalived"]:
        return [f"want services edge-haproxy and edge-keepalived in profile edge, found {sorted(edge)}"]
    scripts = {"edge-haproxy": "haproxy-run.sh", "edge-keepalived": "keepalived-run.sh"}
    for name, svc in sorted(edge.items()):
        if svc.get("network_mode") != "host":
            problems.append(f"{name}: network_mode {svc.get('network_mode')!r}, want 'host' (VRRP)")
        if not svc.get("container_name"):
            problems.append(f"{name}: no container_name (the engine's single-instance guard)")
        binds = {tgt: os.path.relpath(os.path.normpath(os.path.join(ROOT, src)), ROOT)
                 for kind, src, tgt in mounts_of(svc) if kind == "bind"}
        if binds.get("/etc/collector-edge") != os.path.join("deploy", "edge"):
            problems.append(f"{name}: deploy/edge is not mounted at /etc/collector-edge")
        command = svc.get("command") or []
        want = f"/etc/collector-edge/{scripts[name]}"
        if command[:1] != [want]:
            problems.append(f"{name}: command {command!r}, want [{want!r}]")
        elif not os.access(os.path.join(DEPLOY, "edge", scripts[name]), os.X_OK):
            problems.append(f"deploy/edge/{scripts[name]} is not executable")
    caps = set(edge["edge-keepalived"].get("cap_add") or [])
    for cap in ("NET_ADMIN", "NET_RAW"):
        if cap not in caps:
            problems.append(f"edge-keepalived lacks {cap}")
    if edge["edge-haproxy"].get("stop_signal") != "SIGUSR1":
        problems.append("edge-haproxy: stop_signal is not SIGUSR1 (HAProxy's soft stop)")
    return problems


def main():
    if sys.argv[1] == "engine-compose":
        opts = dict(a.split("=", 1) for a in sys.argv[4:])
        return engine_compose(sys.argv[2], sys.argv[3], opts)
    if sys.argv[1] == "stop-grace":
        # Whole seconds of a service's stop_grace_period in a resolved compose file.
        svc = yaml.safe_load(open(sys.argv[2]))["services"][sys.argv[3]]
        print(int(duration_s(svc.get("stop_grace_period", "10s"))))
        return 0
    config, with_dockerfile = sys.argv[1], "--dockerfile" in sys.argv[2:]
    ck = Checks()
    c = Compose(config)
    spool_dir = "/var/lib/collector/spool"
    for ins, args in dockerfile_instructions(os.path.join(ROOT, "Dockerfile")):
        if ins == "ENV":
            spool_dir = env_pairs(args).get("COLLECTOR_SPOOL_DIR", spool_dir)

    ck.run("compose: long-running services restart unless-stopped, one-shots never", check_restart, c)
    ck.run("compose: migrate reaches every replica; collectors and seed wait for it", check_one_shots, c)
    ck.run("compose: collectors' stop_grace_period > drain grace + 20s; probe healthcheck; both PostgreSQL hosts",
           check_collectors, c)
    ck.run("compose: collectors list the same three replicas in different orders", check_replica_orders, c)
    ck.run("compose: one spool volume per collector, shared with no one", check_spools, c, spool_dir)
    ck.run("compose: fixed subnet = COLLECTOR_TRUSTED_PROXIES = ClickHouse users.xml network", check_network, c)
    ck.run("compose: only caddy publishes ports (and prometheus, grafana on 127.0.0.1); no ClickHouse port",
           check_ports, c)
    ck.run("clickhouse: `default` from loopback only; `collector` and `dashboard` with passwords from .env "
           "and the stack's subnet; rights on the collector database only; `dashboard` read-only",
           check_clickhouse_users, c)
    ck.run("compose: collectors and one-shots log in as `collector` with a password file from "
           "`credentials` (read-only volume, no password in their environment)",
           check_collector_credentials, c)
    ck.run("monitoring: grafana's ClickHouse data source logs in as `dashboard` with its password",
           check_grafana_clickhouse, c)
    ck.run("compose: every bind-mounted file exists under deploy/", check_binds, c)
    ck.run("compose: third-party images pinned to a version", check_images_pinned, c)
    ck.run("monitoring: prometheus scrapes the collectors with deploy/prometheus; grafana gets the "
           "dashboard and its data source", check_monitoring, c)
    ck.run("caddy: /perf/* balanced over the collectors with health_uri /readyz; demo root mounted",
           check_caddyfile, c)
    ck.run("demo: deploy/demo is demo/ with the script at /perf/script.js", check_demo)
    ck.run("clickhouse: every XML file under deploy/ parses", check_xml_parses)
    ck.run("clickhouse: macros/remote_servers/zookeeper have the shape the stack (stack/src/clickhouse.rs) writes",
           check_clickhouse_shape, c)
    ck.run("clickhouse: per-replica macros, interserver hosts, cluster and Keeper nodes match compose",
           check_clickhouse_replicas, c)
    ck.run("keeper: raft members are the keeper services, server ids from their environment", check_keeper, c)
    ck.run("edge: host networking, NET_ADMIN/NET_RAW, deploy/edge mounted, run scripts, one container each",
           check_edge, c)
    ck.run("licences: the image gets LICENSE and collector/THIRD-PARTY-LICENSES (crates, vendored data) "
           "in /usr/share/doc/collector", check_license_copy)
    if with_dockerfile:
        ck.run("dockerfile: multi-stage, non-root USER, probe HEALTHCHECK, STOPSIGNAL SIGTERM, spool VOLUME",
               check_dockerfile)
        ck.run("dockerfile: COPY sources and compiled-in files are in the build context", check_build_context)
    return 0


if __name__ == "__main__":
    sys.exit(main())
