//! Which rooms of `host/` may import which. A room is a directory or file directly under
//! `host/` (`comm/`, `env.rs`, ...); it imports another when its code names a `crate::<room>`
//! path (also inside a grouped `use crate::{…}`). [`ALLOWED`] lists every such import there is:
//! the test reads the sources and fails, naming file and line, on one the table lacks, and on
//! an entry nothing uses any more (so the table stays the true picture). Adding an import is a
//! deliberate edit here, and one that closes a circle fails a second check: every circle of the
//! table must lie inside one of [`KNOWN_CIRCLES`], which is empty (issue 51 broke the last one:
//! the rooms form layers, docs/architecture.md lists them).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Each room and the rooms it may import.
const ALLOWED: &[(&str, &[&str])] = &[
    (
        "api",
        &["bootstrap", "comm", "cuda", "enqueue", "error", "transport"],
    ),
    ("bootstrap", &["env", "error", "sockets", "test_aids"]),
    (
        "capi",
        &["bootstrap", "comm", "cuda", "debug", "enqueue", "error"],
    ),
    ("clock", &[]),
    (
        "comm",
        &[
            "bootstrap",
            "clock",
            "cuda",
            "debug",
            "env",
            "error",
            "graph",
            "net",
            "profiler",
            "proxy",
            "ras",
            "topo",
            "transport",
            "tune",
        ],
    ),
    ("cuda", &["debug", "env", "error", "sockets", "test_aids"]),
    ("debug", &["env"]),
    (
        "enqueue",
        &[
            "comm",
            "cuda",
            "env",
            "error",
            "profiler",
            "proxy",
            "transport",
        ],
    ),
    ("env", &[]),
    ("error", &[]),
    ("graph", &["debug", "env", "error", "topo"]),
    (
        "net",
        &[
            "cuda",
            "debug",
            "env",
            "error",
            "plugin_log",
            "sockets",
            "test_aids",
            "topo",
        ],
    ),
    ("plugin_log", &["debug"]),
    ("profiler", &["env", "plugin_log"]),
    (
        "proxy",
        &["clock", "cuda", "debug", "env", "error", "net", "profiler"],
    ),
    (
        "ras",
        &["bootstrap", "clock", "env", "sockets", "test_aids"],
    ),
    ("sockets", &["env"]),
    ("test_aids", &[]),
    ("topo", &["env", "error"]),
    (
        "transport",
        &[
            "bootstrap",
            "cuda",
            "debug",
            "env",
            "error",
            "graph",
            "net",
            "proxy",
            "test_aids",
        ],
    ),
    (
        "tune",
        &["env", "error", "graph", "net", "plugin_log", "topo"],
    ),
];

/// Circles the table may hold, each as the set of rooms that reach one another: none. A circle
/// outside all of them fails; keep it empty.
const KNOWN_CIRCLES: &[&[&str]] = &[];

/// Every `.rs` file under `dir`, recursively, in a stable order.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()))
        .map(|e| e.expect("a directory entry").path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The room of a file at `rel` (relative to `host/`), None for the crate root, the binaries and
/// this test.
fn room_of(rel: &Path) -> Option<String> {
    let first = rel.components().next()?.as_os_str().to_str()?;
    match first {
        "lib.rs" | "bin" | "layering.rs" => None,
        f => Some(f.trim_end_matches(".rs").to_string()),
    }
}

/// The first identifier of `s` (after blanks), if it starts with one.
fn leading_ident(s: &str) -> Option<&str> {
    let s = s.trim_start();
    let end = s
        .find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    (end > 0).then(|| &s[..end])
}

/// The rooms `code` names through `crate::` paths, with the line of each (1-based). `code` has
/// its comments cut off already, line by line.
fn imports(code: &str) -> Vec<(usize, String)> {
    let line_at = |i: usize| code[..i].matches('\n').count() + 1;
    let mut out = Vec::new();
    for (i, _) in code.match_indices("crate::") {
        let rest = &code[i + "crate::".len()..];
        if let Some(inner) = rest.strip_prefix('{') {
            // A grouped import: the identifiers at the top level of the braces.
            let (mut depth, mut start) = (0usize, 0usize);
            for (j, c) in inner.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => {
                        if let Some(n) = leading_ident(&inner[start..j]) {
                            out.push((line_at(i), n.to_string()));
                        }
                        break;
                    }
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        if let Some(n) = leading_ident(&inner[start..j]) {
                            out.push((line_at(i), n.to_string()));
                        }
                        start = j + 1;
                    }
                    _ => {}
                }
            }
        } else if let Some(n) = leading_ident(rest) {
            out.push((line_at(i), n.to_string()));
        }
    }
    out
}

/// The circles of a graph: its strongly connected components of more than one room.
fn circles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<BTreeSet<String>> {
    let reach = |from: &str| {
        let mut seen = BTreeSet::new();
        let mut todo = vec![from.to_string()];
        while let Some(r) = todo.pop() {
            for n in graph.get(&r).into_iter().flatten() {
                if seen.insert(n.clone()) {
                    todo.push(n.clone());
                }
            }
        }
        seen
    };
    let all: BTreeMap<String, BTreeSet<String>> =
        graph.keys().map(|r| (r.clone(), reach(r))).collect();
    let mut out: Vec<BTreeSet<String>> = Vec::new();
    for (r, from_r) in &all {
        let scc: BTreeSet<String> = from_r
            .iter()
            .filter(|o| all.get(*o).is_some_and(|s| s.contains(r)))
            .cloned()
            .collect();
        if scc.len() > 1 && !out.contains(&scc) {
            out.push(scc);
        }
    }
    out
}

fn table() -> BTreeMap<String, BTreeSet<String>> {
    ALLOWED
        .iter()
        .map(|(r, to)| (r.to_string(), to.iter().map(|t| t.to_string()).collect()))
        .collect()
}

#[test]
fn rooms_import_only_what_the_table_allows() {
    let host = Path::new(env!("CARGO_MANIFEST_DIR")).join("host");
    let mut files = Vec::new();
    rust_files(&host, &mut files);
    let allowed = table();
    let rooms: BTreeSet<&String> = allowed.keys().collect();
    let (mut unknown, mut used) = (Vec::new(), BTreeSet::new());
    for f in &files {
        let rel = f.strip_prefix(&host).unwrap_or(f);
        let Some(room) = room_of(rel) else {
            continue;
        };
        if !allowed.contains_key(&room) {
            unknown.push(format!(
                "host/{}: room {room} is not in the table",
                rel.display()
            ));
            continue;
        }
        let text = std::fs::read_to_string(f)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", f.display()));
        // Comments cut off line by line (doc links name paths without importing them).
        let code: String = text
            .lines()
            .map(|l| l.split("//").next().unwrap_or(""))
            .collect::<Vec<_>>()
            .join("\n");
        for (line, to) in imports(&code) {
            if to == room || !rooms.contains(&to) {
                continue;
            }
            if allowed[&room].contains(&to) {
                used.insert((room.clone(), to));
            } else {
                unknown.push(format!(
                    "host/{}:{line}: {room} imports {to}, which the table does not allow",
                    rel.display()
                ));
            }
        }
    }
    let unused: Vec<String> = allowed
        .iter()
        .flat_map(|(r, to)| to.iter().map(move |t| (r.clone(), t.clone())))
        .filter(|e| !used.contains(e))
        .map(|(r, t)| format!("{r} -> {t}: in the table, imported nowhere (take it out)"))
        .collect();
    assert!(
        unknown.is_empty() && unused.is_empty(),
        "host/layering.rs's table and the code disagree:\n{}",
        unknown
            .iter()
            .chain(&unused)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
}

#[test]
fn the_table_closes_no_new_circle() {
    let known: Vec<BTreeSet<String>> = KNOWN_CIRCLES
        .iter()
        .map(|c| c.iter().map(|r| r.to_string()).collect())
        .collect();
    let new: Vec<String> = circles(&table())
        .into_iter()
        .filter(|c| !known.iter().any(|k| c.is_subset(k)))
        .map(|c| format!("{c:?}"))
        .collect();
    assert!(
        new.is_empty(),
        "the table closes circles outside KNOWN_CIRCLES: {}",
        new.join(", ")
    );
}

#[test]
fn the_scanner_reads_grouped_imports_and_finds_circles() {
    let code = "use crate::{comm::Comm, cuda::{self, Device},\n    error::Result};\nlet x = crate::env::BUFFSIZE;";
    let got: Vec<(usize, String)> = imports(code);
    let names: Vec<&str> = got.iter().map(|(_, n)| n.as_str()).collect();
    assert_eq!(names, ["comm", "cuda", "error", "env"]);
    assert_eq!(got[3].0, 3);
    let g: BTreeMap<String, BTreeSet<String>> = [("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")]
        .iter()
        .fold(BTreeMap::new(), |mut g, (f, t)| {
            g.entry(f.to_string())
                .or_insert_with(BTreeSet::new)
                .insert(t.to_string());
            g.entry(t.to_string()).or_default();
            g
        });
    let c = circles(&g);
    assert_eq!(c.len(), 1);
    assert_eq!(
        c[0],
        ["a", "b", "c"].iter().map(|s| s.to_string()).collect()
    );
}
