//! The module graph of the crate (issue #25, docs/architecture.md): no import circle between
//! the top-level modules of `src/`. Every `crate::<module>` path in `src/<top>/**/*.rs` is an
//! edge `<top> -> <module>`; a cycle among those edges fails the test with the file:line of
//! each edge on it. Karpenter reaches the SSH pool only through `provider`, and the actor core
//! never imports the karpenter layer.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// One `crate::` reference: where it is and which top-level module it names.
#[derive(Debug, Clone)]
struct Edge {
    from: String,
    to: String,
    file: String,
    line: usize,
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The code of a line without its `//` comment (a `//` inside a string literal is rare enough
/// in `use` lines that it is not handled; string contents are skipped below instead).
fn strip_comment(line: &str) -> &str {
    let mut in_str = false;
    let bytes = line.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' if in_str => i += 1,
            b'"' => in_str = !in_str,
            b'/' if !in_str && bytes.get(i + 1) == Some(&b'/') => return &line[..i],
            _ => {}
        }
        i += 1;
    }
    line
}

fn ident_at(s: &str) -> &str {
    let end = s
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    &s[..end]
}

/// The top-level modules named by `crate::` paths on one line, including grouped
/// `crate::{a::X, b}` imports (one level of braces on the same line).
fn targets(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(pos) = rest.find("crate::") {
        let before = &rest[..pos];
        let boundary = before
            .chars()
            .last()
            .is_none_or(|c| !(c.is_ascii_alphanumeric() || c == '_' || c == '$'));
        let after = &rest[pos + "crate::".len()..];
        if boundary {
            if let Some(group) = after.strip_prefix('{') {
                let end = group.find('}').unwrap_or(group.len());
                for part in group[..end].split(',') {
                    let name = ident_at(part.trim());
                    if !name.is_empty() {
                        out.push(name.to_string());
                    }
                }
            } else {
                let name = ident_at(after);
                if !name.is_empty() {
                    out.push(name.to_string());
                }
            }
        }
        rest = after;
    }
    out
}

/// Per line of `text`: whether it is test-only code, i.e. inside an item under `#[cfg(test)]`
/// (a `mod tests { ... }` block, counted by braces outside strings, chars and comments). Also
/// the files such an attribute declares (`#[cfg(test)] mod tests;`, with or without `#[path]`),
/// relative to `dir` (the directory of the declaring module's children).
fn test_lines(text: &str, dir: &Path) -> (Vec<bool>, Vec<PathBuf>) {
    let lines: Vec<&str> = text.lines().collect();
    let mut mask = vec![false; lines.len()];
    let mut files = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        if lines[i].trim() != "#[cfg(test)]" {
            i += 1;
            continue;
        }
        // Attributes between `#[cfg(test)]` and the item.
        let mut j = i + 1;
        let mut path_attr = None;
        while j < lines.len() && lines[j].trim_start().starts_with("#[") {
            let t = lines[j].trim();
            if let Some(p) = t.strip_prefix("#[path = \"") {
                path_attr = p.strip_suffix("\"]").map(str::to_string);
            }
            j += 1;
        }
        let Some(item) = lines.get(j) else { break };
        let item = item.trim();
        if item.ends_with(';') && item.contains("mod ") {
            let name = item
                .trim_end_matches(';')
                .rsplit(' ')
                .next()
                .unwrap_or_default();
            match path_attr {
                Some(p) => files.push(dir.join(p)),
                None => {
                    files.push(dir.join(format!("{name}.rs")));
                    files.push(dir.join(name).join("mod.rs"));
                }
            }
            for m in mask.iter_mut().take(j + 1).skip(i) {
                *m = true;
            }
            i = j + 1;
            continue;
        }
        // A block item: mark every line up to its closing brace.
        let end = block_end(&lines, j);
        for m in mask.iter_mut().take(end + 1).skip(i) {
            *m = true;
        }
        i = end + 1;
    }
    (mask, files)
}

/// The line on which the braces opened at or after line `start` close again (or the last line).
fn block_end(lines: &[&str], start: usize) -> usize {
    let mut depth = 0i64;
    let mut opened = false;
    let mut in_block_comment = false;
    for (n, line) in lines.iter().enumerate().skip(start) {
        let b = line.as_bytes();
        let mut k = 0;
        let mut in_str = false;
        while k < b.len() {
            let c = b[k];
            let next = b.get(k + 1).copied();
            if in_block_comment {
                if c == b'*' && next == Some(b'/') {
                    in_block_comment = false;
                    k += 1;
                }
            } else if in_str {
                match c {
                    b'\\' => k += 1,
                    b'"' => in_str = false,
                    _ => {}
                }
            } else {
                match c {
                    b'/' if next == Some(b'/') => break,
                    b'/' if next == Some(b'*') => {
                        in_block_comment = true;
                        k += 1;
                    }
                    b'"' => in_str = true,
                    // A char literal ('{', '\'', '\\'); a lifetime has no closing quote.
                    b'\'' if next == Some(b'\\') => {
                        k += 2;
                        while k < b.len() && b[k] != b'\'' {
                            k += 1;
                        }
                    }
                    b'\'' if b.get(k + 2) == Some(&b'\'') => k += 2,
                    b'{' => {
                        depth += 1;
                        opened = true;
                    }
                    b'}' => depth -= 1,
                    _ => {}
                }
            }
            k += 1;
        }
        if opened && depth <= 0 {
            return n;
        }
    }
    lines.len().saturating_sub(1)
}

/// Every `crate::` edge of product code in `src/`; code under `#[cfg(test)]` is left out (unit
/// tests may use the simulation's fixtures; that is no dependency of the product).
fn edges(src: &Path) -> Vec<Edge> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    files.sort();
    let mut texts = Vec::new();
    let mut test_files = BTreeSet::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap_or_default();
        let parent = file.parent().unwrap_or(src);
        let stem = file
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or_default();
        let is_mod_root = matches!(stem, "mod" | "lib" | "main");
        let dir = if is_mod_root {
            parent.to_path_buf()
        } else {
            parent.join(stem)
        };
        let (mask, declared) = test_lines(&text, &dir);
        // `#[path]` is relative to the declaring file's directory.
        for d in declared {
            test_files.insert(d.clone());
            if let Ok(rel) = d.strip_prefix(&dir) {
                test_files.insert(parent.join(rel));
            }
        }
        texts.push((file.clone(), text, mask));
    }
    let mut out = Vec::new();
    for (file, text, mask) in texts {
        if test_files.contains(&file) {
            continue;
        }
        let rel = file.strip_prefix(src).unwrap_or(&file);
        let first = rel
            .components()
            .next()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .unwrap_or_default();
        // `src/lib.rs` and `src/main.rs` are the roots, not modules of the graph.
        if first == "lib.rs" || first == "main.rs" {
            continue;
        }
        let from = first.trim_end_matches(".rs").to_string();
        for (n, line) in text.lines().enumerate() {
            if mask.get(n).copied().unwrap_or(false) {
                continue;
            }
            let code = strip_comment(line);
            if code.trim_start().starts_with("//") {
                continue;
            }
            for to in targets(code) {
                if to != from {
                    out.push(Edge {
                        from: from.clone(),
                        to,
                        file: format!("src/{}", rel.display()),
                        line: n + 1,
                    });
                }
            }
        }
    }
    out
}

/// Strongly connected components with more than one module (Tarjan, iterative enough for a
/// graph of a dozen nodes: plain recursion).
fn cycles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<BTreeSet<String>> {
    struct T<'a> {
        graph: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on: BTreeSet<&'a str>,
        next: usize,
        out: Vec<BTreeSet<String>>,
    }
    fn visit<'a>(t: &mut T<'a>, v: &'a str) {
        t.index.insert(v, t.next);
        t.low.insert(v, t.next);
        t.next += 1;
        t.stack.push(v);
        t.on.insert(v);
        if let Some(succ) = t.graph.get(v) {
            for w in succ {
                let w = w.as_str();
                if !t.index.contains_key(w) {
                    visit(t, w);
                    let lw = t.low[w];
                    let lv = t.low[v];
                    t.low.insert(v, lv.min(lw));
                } else if t.on.contains(w) {
                    let iw = t.index[w];
                    let lv = t.low[v];
                    t.low.insert(v, lv.min(iw));
                }
            }
        }
        if t.low[v] == t.index[v] {
            let mut comp = BTreeSet::new();
            while let Some(w) = t.stack.pop() {
                t.on.remove(w);
                comp.insert(w.to_string());
                if w == v {
                    break;
                }
            }
            if comp.len() > 1 {
                t.out.push(comp);
            }
        }
    }
    let mut t = T {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        next: 0,
        out: Vec::new(),
    };
    let nodes: Vec<&String> = graph.keys().collect();
    for v in nodes {
        if !t.index.contains_key(v.as_str()) {
            visit(&mut t, v.as_str());
        }
    }
    t.out
}

fn src_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn graph_of(edges: &[Edge]) -> BTreeMap<String, BTreeSet<String>> {
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for e in edges {
        graph
            .entry(e.from.clone())
            .or_default()
            .insert(e.to.clone());
        graph.entry(e.to.clone()).or_default();
    }
    graph
}

#[test]
fn no_import_cycle_between_top_level_modules() {
    let edges = edges(&src_dir());
    assert!(
        edges.len() > 20,
        "the scan found only {} crate:: edges in src/: the parser is broken",
        edges.len()
    );
    let graph = graph_of(&edges);
    // The graph with edge counts (`cargo test --test module_graph -- --nocapture`).
    let mut counts: BTreeMap<(&str, &str), usize> = BTreeMap::new();
    for e in &edges {
        *counts.entry((e.from.as_str(), e.to.as_str())).or_default() += 1;
    }
    for ((from, to), n) in &counts {
        println!("{n:4} {from} -> {to}");
    }
    let comps = cycles(&graph);
    let mut report = String::new();
    for comp in &comps {
        report.push_str(&format!(
            "import cycle among {:?}; edges inside it:\n",
            comp
        ));
        for e in edges
            .iter()
            .filter(|e| comp.contains(&e.from) && comp.contains(&e.to))
        {
            report.push_str(&format!(
                "  {} -> {}  ({}:{})\n",
                e.from, e.to, e.file, e.line
            ));
        }
    }
    assert!(comps.is_empty(), "{report}");
}

/// The seam itself: the karpenter layer reaches the pool through `provider`, never the actor
/// core; the actor core never imports the karpenter layer.
#[test]
fn karpenter_and_actors_meet_only_at_the_provider() {
    let edges = edges(&src_dir());
    let bad: Vec<String> = edges
        .iter()
        .filter(|e| {
            (e.from == "karpenter" && e.to == "actors")
                || (e.from == "actors" && e.to == "karpenter")
        })
        .map(|e| format!("  {} -> {}  ({}:{})", e.from, e.to, e.file, e.line))
        .collect();
    assert!(bad.is_empty(), "edges across the seam:\n{}", bad.join("\n"));
}

#[test]
fn the_parser_sees_grouped_and_inline_paths() {
    assert_eq!(targets("use crate::{a::X, b};"), vec!["a", "b"]);
    assert_eq!(
        targets("let x = crate::k8s::f(crate::api::Y);"),
        vec!["k8s", "api"]
    );
    assert_eq!(targets("use kpssh::crate_x::y;"), Vec::<String>::new());
    assert_eq!(
        targets(strip_comment("f(); // crate::sim")),
        Vec::<String>::new()
    );
    let g = graph_of(&[
        Edge {
            from: "a".into(),
            to: "b".into(),
            file: String::new(),
            line: 1,
        },
        Edge {
            from: "b".into(),
            to: "a".into(),
            file: String::new(),
            line: 2,
        },
    ]);
    assert_eq!(cycles(&g).len(), 1);
    let text = "use crate::a::X;\n#[cfg(test)]\nmod tests {\n    fn f() { let c = '}'; \"}\"; }\n    use crate::b::Y;\n}\nuse crate::c::Z;\n#[cfg(test)]\n#[path = \"t.rs\"]\nmod tests2;\n";
    let (mask, files) = test_lines(text, Path::new("d"));
    assert_eq!(
        mask,
        vec![false, true, true, true, true, true, false, true, true, true]
    );
    assert_eq!(files, vec![PathBuf::from("d/t.rs")]);
}
