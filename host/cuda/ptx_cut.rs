//! Cutting one kernel's module out of the whole PTX text: the header, the shared items, the
//! entry points asked for and only the functions they reach. Plain text work with no crate
//! dependency: build.rs includes this file too, to give ptxas one kernel at a time.

/// A module holding the header and shared items of `ptx`, the entry points whose name starts
/// with `prefix`, and only the functions those entries call (directly or through each other):
/// the driver compiles every function a module holds, visible ones included, so the others
/// would only cost JIT time. Items end at the first `}` in column 0 (definitions) or at the
/// first line ending in `;` before a `{` (declarations).
pub fn family(ptx: &str, prefix: &str) -> String {
    Cutter::new(ptx).module(prefix)
}

/// A PTX text read once, to cut many modules from (build.rs cuts one per kernel).
pub struct Cutter<'a> {
    lines: Vec<&'a str>,
    items: Vec<Item<'a>>,
    /// Which item each line belongs to.
    owner: Vec<Option<usize>>,
    /// The functions (not entries) by name: a declaration and its definition share one.
    by_name: std::collections::HashMap<&'a str, Vec<usize>>,
}

impl<'a> Cutter<'a> {
    pub fn new(ptx: &'a str) -> Self {
        let lines: Vec<&str> = ptx.lines().collect();
        let items = items(&lines);
        let mut owner = vec![None; lines.len()];
        for (k, it) in items.iter().enumerate() {
            owner[it.lines.clone()].fill(Some(k));
        }
        let by_name = items.iter().enumerate().filter(|(_, it)| !it.entry).fold(
            std::collections::HashMap::<&str, Vec<usize>>::new(),
            |mut m, (k, it)| {
                m.entry(it.name).or_default().push(k);
                m
            },
        );
        Cutter {
            lines,
            items,
            owner,
            by_name,
        }
    }

    /// [`family`]'s module for `prefix`.
    pub fn module(&self, prefix: &str) -> String {
        let mut keep: Vec<bool> = self
            .items
            .iter()
            .map(|it| it.entry && it.name.starts_with(prefix))
            .collect();
        // Functions reachable from the kept entries, by name.
        let mut todo: Vec<usize> = (0..self.items.len()).filter(|&k| keep[k]).collect();
        while let Some(k) = todo.pop() {
            for line in &self.lines[self.items[k].lines.clone()] {
                let words =
                    line.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '$'));
                for word in words {
                    for &f in self.by_name.get(word).into_iter().flatten() {
                        if !keep[f] {
                            keep[f] = true;
                            todo.push(f);
                        }
                    }
                }
            }
        }
        let mut out = String::new();
        for (line, owner) in self.lines.iter().zip(&self.owner) {
            let kept = match owner {
                Some(k) => keep[*k],
                None => !line.starts_with("\t// .globl"),
            };
            if kept {
                out.push_str(line);
                out.push('\n');
            }
        }
        out
    }
}

/// An entry point or function of a PTX text: a definition or a declaration.
pub struct Item<'a> {
    pub name: &'a str,
    pub entry: bool,
    pub lines: std::ops::Range<usize>,
}

/// The entries and functions of `lines`, in order.
pub fn items<'a>(lines: &[&'a str]) -> Vec<Item<'a>> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        let head = [
            ".visible .entry ",
            ".entry ",
            ".visible .func ",
            ".func ",
            ".weak .func ",
        ]
        .iter()
        .find_map(|k| line.strip_prefix(k).map(|rest| (k.contains("entry"), rest)));
        let Some((entry, rest)) = head else {
            i += 1;
            continue;
        };
        // `.func (.param .b64 ret) name(`: the name follows the return parameters.
        let rest = match rest.strip_prefix('(') {
            Some(r) => r
                .split_once(')')
                .map_or("", |(_, after)| after.trim_start()),
            None => rest,
        };
        let name = rest
            .split(|c: char| c == '(' || c == ';' || c.is_whitespace())
            .next()
            .unwrap_or("");
        let start = i;
        let mut body = false;
        while i < lines.len() {
            let l = lines[i];
            i += 1;
            if l.starts_with('{') {
                body = true;
            }
            if (body && l == "}") || (!body && l.trim_end().ends_with(';')) {
                break;
            }
        }
        out.push(Item {
            name,
            entry,
            lines: start..i,
        });
    }
    out
}
