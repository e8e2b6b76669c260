//! The `Dockerfile` read as its instructions and stages, and `.dockerignore`'s rule for what
//! the build context leaves out: enough to check them without a container engine.

use std::collections::BTreeMap;
use std::path::Path;

use crate::common::root;

/// One stage: `FROM image [AS alias]` and its instructions `(INSTRUCTION, arguments)`.
#[derive(Debug)]
pub struct Stage {
    /// The image it starts from.
    pub from: String,
    /// Its `AS` name.
    pub alias: Option<String>,
    /// Its instructions, upper-case word and the rest of the line.
    pub ins: Vec<(String, String)>,
}

/// The repository's `Dockerfile` as `(INSTRUCTION, arguments)`, continuations joined and
/// comments dropped.
pub fn instructions() -> Vec<(String, String)> {
    let path = root().join("Dockerfile");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut out = vec![];
    let mut cur = String::new();
    for line in text.lines() {
        let comment = line.trim_start().starts_with('#');
        if (cur.is_empty() && line.trim().is_empty()) || comment {
            continue;
        }
        if let Some(head) = line.strip_suffix('\\') {
            cur.push_str(head);
            cur.push(' ');
            continue;
        }
        cur.push_str(line);
        let (word, rest) = cur.trim().split_once(' ').unwrap_or((cur.trim(), ""));
        out.push((word.to_uppercase(), rest.trim().to_owned()));
        cur.clear();
    }
    out
}

/// The `Dockerfile`'s stages in order.
pub fn stages() -> Vec<Stage> {
    let mut out: Vec<Stage> = vec![];
    for (ins, args) in instructions() {
        if ins == "FROM" {
            let words: Vec<&str> = args.split_whitespace().collect();
            let alias = (words.len() >= 3 && words[1].eq_ignore_ascii_case("as"))
                .then(|| words[2].to_owned());
            out.push(Stage {
                from: words[0].to_owned(),
                alias,
                ins: vec![],
            });
        } else if let Some(last) = out.last_mut() {
            last.ins.push((ins, args));
        }
    }
    out
}

/// The variables of one `ENV` instruction (`KEY=VALUE ...` or `KEY VALUE`).
pub fn env_pairs(args: &str) -> BTreeMap<String, String> {
    let words = shell_words(args);
    if words.len() == 2 && !words[0].contains('=') {
        return BTreeMap::from([(words[0].clone(), words[1].clone())]);
    }
    words
        .iter()
        .map(|w| {
            let (k, v) = w
                .split_once('=')
                .unwrap_or_else(|| panic!("ENV {args}: {w} has no ="));
            (k.to_owned(), v.to_owned())
        })
        .collect()
}

/// Words of a shell-like line: blanks separate, double or single quotes group.
fn shell_words(s: &str) -> Vec<String> {
    let mut out = vec![];
    let mut cur = String::new();
    let mut quote = None;
    let mut any = false;
    for ch in s.chars() {
        match (quote, ch) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => cur.push(c),
            (None, '"' | '\'') => {
                quote = Some(ch);
                any = true;
            }
            (None, c) if c.is_whitespace() => {
                if any || !cur.is_empty() {
                    out.push(std::mem::take(&mut cur));
                }
                any = false;
            }
            (None, c) => cur.push(c),
        }
    }
    if any || !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// The source words of a `COPY` (options dropped, the destination last).
pub fn copy_words(args: &str) -> Vec<&str> {
    args.split_whitespace()
        .filter(|w| !w.starts_with("--"))
        .collect()
}

/// `.dockerignore`'s patterns, comments and blank lines dropped.
pub struct Dockerignore(Vec<String>);

impl Dockerignore {
    /// The repository's `.dockerignore`.
    pub fn read() -> Dockerignore {
        let path = root().join(".dockerignore");
        let text =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        Dockerignore(
            text.lines()
                .map(str::trim)
                .filter(|l| !l.is_empty() && !l.starts_with('#'))
                .map(str::to_owned)
                .collect(),
        )
    }

    /// Whether the build context leaves out path `rel` (Docker's rule: the last pattern that
    /// matches the path or one of its parent folders decides).
    pub fn excluded(&self, rel: &str) -> bool {
        let parts: Vec<&str> = rel.split('/').collect();
        let prefixes: Vec<String> = (1..=parts.len()).map(|i| parts[..i].join("/")).collect();
        let mut excluded = false;
        for pat in &self.0 {
            let (neg, p) = match pat.strip_prefix('!') {
                Some(p) => (true, p),
                None => (false, pat.as_str()),
            };
            let p = p.trim_matches('/');
            let hit = match p.strip_prefix("**/") {
                Some(tail) => prefixes
                    .iter()
                    .any(|x| fnmatch(x.rsplit('/').next().unwrap(), tail) || fnmatch(x, tail)),
                None => prefixes
                    .iter()
                    .any(|x| fnmatch(x, p) && x.matches('/').count() == p.matches('/').count()),
            };
            if hit {
                excluded = !neg;
            }
        }
        excluded
    }
}

/// Python's `fnmatch.fnmatch` on POSIX: `*` any text (slashes too), `?` one character,
/// `[...]` a set.
pub fn fnmatch(name: &str, pattern: &str) -> bool {
    let mut re = String::from("^");
    let mut chars = pattern.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '*' => re.push_str(".*"),
            '?' => re.push('.'),
            '[' => {
                let mut set = String::new();
                for d in chars.by_ref() {
                    if d == ']' {
                        break;
                    }
                    set.push(d);
                }
                let set = set
                    .strip_prefix('!')
                    .map_or(set.clone(), |s| format!("^{s}"));
                re.push_str(&format!("[{}]", set.replace('\\', "\\\\")));
            }
            c => re.push_str(&regex::escape(&c.to_string())),
        }
    }
    re.push('$');
    regex::Regex::new(&re).is_ok_and(|r| r.is_match(name))
}

/// Whether `path` (relative to the repository) is a file or folder that exists.
pub fn exists(rel: &str) -> bool {
    Path::new(&root()).join(rel).exists()
}
