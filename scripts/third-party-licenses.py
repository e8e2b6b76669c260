#!/usr/bin/python3
"""scripts/third-party-licenses.py - the licence notices of what the collector binary is made of.

    scripts/third-party-licenses.py            writes collector/THIRD-PARTY-LICENSES
    scripts/third-party-licenses.py --check    exit 1 (and says why) if that file is not current
    scripts/third-party-licenses.py --stdout   prints it

The Dockerfile copies the file into the image as /usr/share/doc/collector/THIRD-PARTY-LICENSES
(with the project's own LICENSE beside it); scripts/check-containers.sh runs --check, and its
--engine run looks for the file in the image. Regenerate and commit it whenever Cargo.lock or a
vendored data set (collector/assets/) changes.

What it lists: every crate linked into the collector binary on Linux (x86_64 and aarch64), from
`cargo metadata --locked` of this workspace: the collector package's normal dependencies,
transitively (their proc-macros included, build-only and dev-only dependencies not), with
each crate's licence expression and the licence files it ships (LICENSE*, LICENCE*, COPYING*,
NOTICE*, UNLICENSE*, at its top and, for a crate that bundles C code, one folder below);
then the data compiled in from collector/assets/ with its licence (crawler-user-agents: MIT;
uap-core: Apache-2.0); then the licence texts, each distinct text once with the crates it is
for. A crate that ships no licence file gets the standard text of its licence (for a choice
such as "MIT OR Apache-2.0", of the first that has one here), filled in with its authors.

Standard library only; needs cargo, and the crates' sources in cargo's registry (it runs
`cargo fetch --locked` when one is missing, which needs crates.io). The output depends only
on Cargo.lock and the crates' files, so it is reproducible.
"""

import hashlib
import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "collector", "THIRD-PARTY-LICENSES")
PACKAGE = "collector"
TARGETS = ["x86_64-unknown-linux-gnu", "aarch64-unknown-linux-gnu"]
LICENSE_FILE = re.compile(r"^(LICEN[SC]E|COPYING|NOTICE|UNLICENSE)", re.I)
# Vendored data compiled into the binary (include_str!): folder, what it is, licence.
ASSETS = [
    ("collector/assets/crawler-user-agents", "crawler-user-agents 1.60.0 (npm), "
     "github.com/monperrus/crawler-user-agents: the crawler patterns", "MIT"),
    ("collector/assets/uap-core", "uap-core, github.com/ua-parser/uap-core: the user-agent "
     "regexes (regexes.json)", "Apache-2.0"),
]

# Standard texts for a crate that ships no licence file (SPDX's templates; the copyright
# line filled in with the crate's authors). Apache-2.0's is the project's own LICENSE.
MIT = """MIT License

Copyright (c) {authors}

Permission is hereby granted, free of charge, to any person obtaining a copy of this software
and associated documentation files (the "Software"), to deal in the Software without
restriction, including without limitation the rights to use, copy, modify, merge, publish,
distribute, sublicense, and/or sell copies of the Software, and to permit persons to whom the
Software is furnished to do so, subject to the following conditions:

The above copyright notice and this permission notice shall be included in all copies or
substantial portions of the Software.

THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR IMPLIED, INCLUDING
BUT NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY, FITNESS FOR A PARTICULAR PURPOSE AND
NONINFRINGEMENT. IN NO EVENT SHALL THE AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM,
DAMAGES OR OTHER LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING FROM,
OUT OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS IN THE SOFTWARE.
"""
BSD3 = """BSD 3-Clause License

Copyright (c) {authors}

Redistribution and use in source and binary forms, with or without modification, are
permitted provided that the following conditions are met:

1. Redistributions of source code must retain the above copyright notice, this list of
   conditions and the following disclaimer.

2. Redistributions in binary form must reproduce the above copyright notice, this list of
   conditions and the following disclaimer in the documentation and/or other materials
   provided with the distribution.

3. Neither the name of the copyright holder nor the names of its contributors may be used to
   endorse or promote products derived from this software without specific prior written
   permission.

THIS SOFTWARE IS PROVIDED BY THE COPYRIGHT HOLDERS AND CONTRIBUTORS "AS IS" AND ANY EXPRESS
OR IMPLIED WARRANTIES, INCLUDING, BUT NOT LIMITED TO, THE IMPLIED WARRANTIES OF
MERCHANTABILITY AND FITNESS FOR A PARTICULAR PURPOSE ARE DISCLAIMED. IN NO EVENT SHALL THE
COPYRIGHT HOLDER OR CONTRIBUTORS BE LIABLE FOR ANY DIRECT, INDIRECT, INCIDENTAL, SPECIAL,
EXEMPLARY, OR CONSEQUENTIAL DAMAGES (INCLUDING, BUT NOT LIMITED TO, PROCUREMENT OF SUBSTITUTE
GOODS OR SERVICES; LOSS OF USE, DATA, OR PROFITS; OR BUSINESS INTERRUPTION) HOWEVER CAUSED AND
ON ANY THEORY OF LIABILITY, WHETHER IN CONTRACT, STRICT LIABILITY, OR TORT (INCLUDING
NEGLIGENCE OR OTHERWISE) ARISING IN ANY WAY OUT OF THE USE OF THIS SOFTWARE, EVEN IF ADVISED
OF THE POSSIBILITY OF SUCH DAMAGE.
"""


def standard_text(spdx, authors):
    if spdx == "MIT":
        return MIT.format(authors=authors)
    if spdx == "BSD-3-Clause":
        return BSD3.format(authors=authors)
    if spdx == "Apache-2.0":
        return open(os.path.join(ROOT, "LICENSE"), encoding="utf-8").read()
    return None


def cargo_metadata(target):
    cmd = ["cargo", "metadata", "--format-version", "1", "--locked", "--filter-platform", target,
           "--manifest-path", os.path.join(ROOT, "Cargo.toml")]
    out = subprocess.run(cmd + ["--offline"], capture_output=True, text=True)
    if out.returncode != 0:  # the index is not cached: ask crates.io
        out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"cargo metadata failed:\n{out.stderr}")
    return json.loads(out.stdout)


def linked_crates():
    """{package id: package} of every crate linked into PACKAGE on TARGETS."""
    found = {}
    for target in TARGETS:
        meta = cargo_metadata(target)
        packages = {p["id"]: p for p in meta["packages"]}
        nodes = {n["id"]: n for n in meta["resolve"]["nodes"]}
        root = next(p["id"] for p in meta["packages"] if p["name"] == PACKAGE and p["source"] is None)
        todo, seen = [root], set()
        while todo:
            pid = todo.pop()
            if pid in seen:
                continue
            seen.add(pid)
            for dep in nodes[pid]["deps"]:
                if any(k["kind"] is None for k in dep["dep_kinds"]):
                    todo.append(dep["pkg"])
        for pid in seen - {root}:
            if packages[pid]["source"] is None:
                continue  # a member of this workspace: the project's own licence
            found[pid] = packages[pid]
    return found


def license_files(folder):
    """Relative paths of the licence files of a crate: at its top, and one folder below
    (C code a -sys crate bundles, e.g. jemalloc/COPYING)."""
    out = []
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        if os.path.isfile(path) and LICENSE_FILE.match(name):
            out.append(name)
        elif os.path.isdir(path) and not name.startswith(".") and name not in ("src", "tests", "benches", "examples", "target"):
            for sub in sorted(os.listdir(path)):
                if os.path.isfile(os.path.join(path, sub)) and LICENSE_FILE.match(sub):
                    out.append(f"{name}/{sub}")
    return out


def read_text(path):
    with open(path, "rb") as f:
        return f.read().decode("utf-8", "replace").replace("\r\n", "\n").rstrip() + "\n"


def generate():
    crates = linked_crates()
    if any(not os.path.isdir(os.path.dirname(p["manifest_path"])) for p in crates.values()):
        subprocess.run(["cargo", "fetch", "--locked", "--manifest-path", os.path.join(ROOT, "Cargo.toml")],
                       check=True, stdout=subprocess.DEVNULL)
    rows, texts = [], {}  # texts: sha -> [text, [labels]]

    def add_text(text, label):
        key = hashlib.sha256(re.sub(r"\s+", " ", text).strip().encode()).hexdigest()
        texts.setdefault(key, [text, []])[1].append(label)

    for p in sorted(crates.values(), key=lambda p: (p["name"], p["version"])):
        folder = os.path.dirname(p["manifest_path"])
        label = f"{p['name']} {p['version']}"
        expr = p.get("license") or ("see " + p["license_file"] if p.get("license_file") else "none given")
        files = license_files(folder)
        if p.get("license_file"):
            lf = os.path.normpath(p["license_file"])
            if lf not in files and os.path.exists(os.path.join(folder, lf)):
                files.append(lf)
        note = ""
        for f in files:
            add_text(read_text(os.path.join(folder, f)), f"{label} ({f})")
        if not files:
            ids = re.findall(r"[A-Za-z0-9.+-]+", expr.replace(" OR ", " ").replace(" AND ", " ").replace(" WITH ", " "))
            authors = ", ".join(re.sub(r"\s*<[^>]*>", "", a) for a in p.get("authors") or []) or f"the {p['name']} authors"
            for spdx in ids:
                text = standard_text(spdx, authors)
                if text:
                    add_text(text, f"{label} (no licence file in the crate: the standard {spdx} text)")
                    note = f"; no licence file in the crate, the standard {spdx} text below"
                    break
            else:
                note = "; no licence file in the crate and no standard text here"
        rows.append(f"  {label:<48} {expr}{note}")
    assets = []
    for folder, what, spdx in ASSETS:
        path = os.path.join(ROOT, folder, "LICENSE")
        add_text(read_text(path), f"{os.path.basename(folder)} ({folder}/LICENSE)")
        assets.append(f"  {what}: {spdx}")

    out = [
        "Third-party software in the collector (/usr/local/bin/collector in the container image)",
        "=" * 88,
        "",
        "Generated by scripts/third-party-licenses.py from Cargo.lock and the crates' own licence",
        "files; do not edit. The collector itself: Apache-2.0 (LICENSE beside this file). The Rust",
        "standard library linked into it: MIT OR Apache-2.0 (the Rust project).",
        "",
        f"Rust crates linked in ({len(rows)}), with their licence expressions:",
        "",
        *rows,
        "",
        "Data compiled in (collector/assets/):",
        "",
        *assets,
        "",
        f"Licence texts ({len(texts)} distinct), each followed by what it is for",
    ]
    for text, labels in sorted(texts.values(), key=lambda t: (t[1][0].lower(), t[0])):
        out += ["", "-" * 88, "For: " + "; ".join(labels), "-" * 88, "", text.rstrip()]
    return "\n".join(out) + "\n"


def main():
    text = generate()
    if "--stdout" in sys.argv[1:]:
        sys.stdout.write(text)
        return 0
    if "--check" in sys.argv[1:]:
        current = open(OUT, encoding="utf-8").read() if os.path.exists(OUT) else ""
        if current != text:
            have, want = set(want_rows(current)), set(want_rows(text))
            print(f"{os.path.relpath(OUT, ROOT)} is not current (run scripts/third-party-licenses.py): "
                  f"missing {sorted(want - have)[:10]}, not linked any more {sorted(have - want)[:10]}"
                  + ("" if want != have else ", the texts differ"))
            return 1
        print(f"{os.path.relpath(OUT, ROOT)} is current: {len(want_rows(text))} crates")
        return 0
    with open(OUT, "w", encoding="utf-8") as f:
        f.write(text)
    print(f"wrote {os.path.relpath(OUT, ROOT)}: {len(want_rows(text))} crates, {len(text) // 1000} kB")
    return 0


def want_rows(text):
    """The crates the file lists (its first list)."""
    head = text.split("\nData compiled in", 1)[0]
    return re.findall(r"^  (\S+ \d\S*) ", head, re.M)


if __name__ == "__main__":
    sys.exit(main())
