//! Layering check: the enqueue layer sits on top of the communicator layer and may use it,
//! but `host/comm` must never reach back up into `enqueue` (the two once imported each other
//! in a circle). This test reads the sources and fails, naming file and line, on any
//! `enqueue::` path in host/comm (code or doc link), and on `enqueue` named as a module in
//! its code (a grouped import such as `use crate::{enqueue, …}`).

use std::path::{Path, PathBuf};

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

/// Whether `code` (a line with its `//` comment cut off) names `enqueue` as a path segment.
fn names_enqueue(code: &str) -> bool {
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    code.match_indices("enqueue").any(|(i, w)| {
        let before = code[..i].chars().next_back();
        let after = code[i + w.len()..].chars().next();
        !before.is_some_and(ident) && !after.is_some_and(ident) && before != Some('"')
    })
}

/// The offending lines of one source text, as `line: text`.
fn upward_references(text: &str) -> Vec<String> {
    text.lines()
        .enumerate()
        .filter(|(_, line)| {
            let code = line.split("//").next().unwrap_or("");
            line.contains("enqueue::") || names_enqueue(code)
        })
        .map(|(i, line)| format!("{}: {}", i + 1, line.trim()))
        .collect()
}

#[test]
fn comm_does_not_depend_on_enqueue() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    rust_files(&root.join("host/comm"), &mut files);
    assert!(!files.is_empty(), "no sources found under host/comm");
    let mut bad = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", f.display()));
        let rel = f.strip_prefix(root).unwrap_or(f).display().to_string();
        bad.extend(
            upward_references(&text)
                .into_iter()
                .map(|l| format!("{rel}:{l}")),
        );
    }
    assert!(
        bad.is_empty(),
        "host/comm must not depend on the enqueue layer (enqueue uses comm, never the \
         reverse); move the piece down into comm or have enqueue call it instead:\n{}",
        bad.join("\n")
    );
}

#[test]
fn the_check_sees_upward_references() {
    assert_eq!(
        upward_references("use crate::comm::order;\n"),
        Vec::<String>::new()
    );
    // Prose in comments may name the layer; paths may not.
    assert!(upward_references("// the enqueue layer launches\n").is_empty());
    assert!(upward_references("let s = \"enqueue\";\n").is_empty());
    assert_eq!(
        upward_references("fn a() {}\nuse crate::enqueue::group;\n"),
        ["2: use crate::enqueue::group;"]
    );
    assert_eq!(
        upward_references("use crate::{\n    enqueue,\n};\n"),
        ["2: enqueue,"]
    );
    assert_eq!(
        upward_references("/// See [`crate::enqueue::group`].\n").len(),
        1,
        "doc links count"
    );
}
