//! No import cycles among the top-level modules of `cuda-core` and `cuda-async`.
//!
//! Reads the sources of both crates and builds the graph "top-level module A refers to top-level
//! module B": every `crate::name` (also `$crate::name`) and every name at the top of a
//! `use crate::{...}` tree in code, outside comments (a doc link is not an import) and outside
//! items under a test-only `#[cfg(..)]` (`test`, or `all(.., test, ..)`). `super::` paths stay
//! inside their top-level module (neither crate nests inline non-test modules deeper than a
//! file's own module) and are not edges.
//!
//! A `crate::` name that is not a top-level module is a name of the crate root: a `use` re-export
//! of `lib.rs`, a `#[macro_export]` macro, or an item defined in `lib.rs`. Both crates are checked
//! strictly: a re-exported name counts as the module it is re-exported
//! from (a macro as the module defining it), so that going through the root cannot hide an edge.
//! A name that is none of these fails the test, so that the graph is never silently incomplete.
//!
//! Needs no GPU.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

type Graph = BTreeMap<String, BTreeSet<String>>;

/// Every `.rs` file under `dir`, sorted.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in fs::read_dir(&d).unwrap_or_else(|e| panic!("reading {}: {e}", d.display())) {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

fn is_ident(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// The end (exclusive) of the string, char or comment starting at `i`, or `None` if none starts
/// there. Lifetimes (`'a`) are not chars.
fn skip_literal(b: &[u8], i: usize) -> Option<usize> {
    let at = |k: usize| b.get(k).copied().unwrap_or(0);
    match at(i) {
        b'/' if at(i + 1) == b'/' => Some(b[i..].iter().position(|&c| c == b'\n').map_or(b.len(), |n| i + n)),
        b'/' if at(i + 1) == b'*' => {
            let (mut k, mut depth) = (i + 2, 1);
            while k < b.len() && depth > 0 {
                if at(k) == b'/' && at(k + 1) == b'*' {
                    depth += 1;
                    k += 2;
                } else if at(k) == b'*' && at(k + 1) == b'/' {
                    depth -= 1;
                    k += 2;
                } else {
                    k += 1;
                }
            }
            Some(k)
        }
        b'r' if (at(i + 1) == b'"' || at(i + 1) == b'#') && (i == 0 || !is_ident(at(i - 1))) => {
            // A raw string r"..." / r#"..."# (not an identifier ending in `r`).
            let hashes = b[i + 1..].iter().take_while(|&&c| c == b'#').count();
            if at(i + 1 + hashes) != b'"' {
                return None;
            }
            let mut k = i + 2 + hashes;
            while k < b.len() {
                if at(k) == b'"' && b[k + 1..].iter().take(hashes).filter(|&&c| c == b'#').count() == hashes {
                    return Some(k + 1 + hashes);
                }
                k += 1;
            }
            Some(b.len())
        }
        b'"' => {
            let mut k = i + 1;
            while k < b.len() && at(k) != b'"' {
                k += if at(k) == b'\\' { 2 } else { 1 };
            }
            Some(k + 1)
        }
        b'\'' if at(i + 1) == b'\\' => {
            let mut k = i + 2;
            while k < b.len() && at(k) != b'\'' {
                k += 1;
            }
            Some(k + 1)
        }
        b'\'' if at(i + 2) == b'\'' => Some(i + 3),
        _ => None,
    }
}

/// The end (exclusive) of the item starting at `i`: its first `;` at depth 0, or the `}` closing
/// its first `{`.
fn item_end(b: &[u8], mut i: usize) -> usize {
    let mut depth = 0usize;
    while i < b.len() {
        if let Some(next) = skip_literal(b, i) {
            i = next;
            continue;
        }
        match b[i] {
            b';' if depth == 0 => return i + 1,
            b'{' => depth += 1,
            b'}' => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    return i + 1;
                }
            }
            _ => {}
        }
        i += 1;
    }
    b.len()
}

/// Whether a `cfg` predicate holds only in test builds: `test`, or `all(..)` with a `test` among
/// its top-level arguments.
fn test_only(pred: &str) -> bool {
    let pred = pred.trim();
    if pred == "test" {
        return true;
    }
    let Some(inner) = pred.strip_prefix("all(").and_then(|p| p.strip_suffix(')')) else {
        return false;
    };
    let (mut depth, mut start, mut args) = (0, 0, Vec::new());
    for (k, c) in inner.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                args.push(&inner[start..k]);
                start = k + 1;
            }
            _ => {}
        }
    }
    args.push(&inner[start..]);
    args.iter().any(|a| a.trim() == "test")
}

/// `src` with every item under a test-only `#[cfg(..)]` blanked out (attributes, comments and
/// strings are skipped when looking for the item's end).
fn strip_test_items(src: &str) -> String {
    let b = src.as_bytes();
    let mut out = String::with_capacity(src.len());
    let mut i = 0;
    while let Some(k) = src[i..].find("#[cfg(").map(|k| i + k) {
        let pred_start = k + "#[cfg(".len();
        let pred_end = item_end_of_parens(b, pred_start - 1);
        let pred = &src[pred_start..pred_end.saturating_sub(1)];
        if !test_only(pred) || !src[pred_end..].starts_with(']') {
            out.push_str(&src[i..pred_start]);
            i = pred_start;
            continue;
        }
        out.push_str(&src[i..k]);
        i = item_end(b, pred_end + 1);
    }
    out.push_str(&src[i..]);
    out
}

/// The end (exclusive) of the parenthesised group opening at `open`.
fn item_end_of_parens(b: &[u8], open: usize) -> usize {
    let mut depth = 0usize;
    let mut i = open;
    while i < b.len() {
        match b[i] {
            b'(' => depth += 1,
            b')' => {
                depth -= 1;
                if depth == 0 {
                    return i + 1;
                }
            }
            _ => {}
        }
        i += 1;
    }
    b.len()
}

/// The identifier starting at `i`, if any.
fn ident_at(s: &str, i: usize) -> Option<&str> {
    let len = s.as_bytes()[i..].iter().take_while(|&&c| is_ident(c)).count();
    (len > 0).then(|| &s[i..i + len])
}

/// `src` with every comment (doc comments included) blanked: a doc link to another module is
/// not an import, only code paths are.
fn strip_comments(src: &str) -> String {
    let b = src.as_bytes();
    let mut out = b.to_vec();
    let mut i = 0;
    while i < b.len() {
        match skip_literal(b, i) {
            Some(end) => {
                if b[i] == b'/' {
                    for c in &mut out[i..end.min(b.len())] {
                        if *c != b'\n' {
                            *c = b' ';
                        }
                    }
                }
                i = end.max(i + 1);
            }
            None => i += 1,
        }
    }
    String::from_utf8(out).unwrap_or_default()
}

/// The names a file refers to through the crate root: `crate::name` and the top-level names of
/// `crate::{...}` trees.
fn crate_refs(src: &str) -> BTreeSet<String> {
    let b = src.as_bytes();
    let mut refs = BTreeSet::new();
    for (k, _) in src.match_indices("crate::") {
        if k > 0 && is_ident(b[k - 1]) {
            continue; // e.g. `my_crate::`
        }
        let after = k + "crate::".len();
        if let Some(name) = ident_at(src, after) {
            refs.insert(name.to_string());
        } else if b.get(after) == Some(&b'{') {
            // The first segment of each tree at depth 1 of the group.
            let (mut depth, mut i, mut expect_name) = (0usize, after, true);
            while i < b.len() {
                match b[i] {
                    b'{' => {
                        depth += 1;
                        expect_name = depth == 1;
                    }
                    b'}' => {
                        depth -= 1;
                        if depth == 0 {
                            break;
                        }
                    }
                    b',' if depth == 1 => expect_name = true,
                    c if expect_name && depth == 1 && is_ident(c) => {
                        let name = ident_at(src, i).unwrap_or_default();
                        if name != "self" {
                            refs.insert(name.to_string());
                        }
                        expect_name = false;
                        i += name.len();
                        continue;
                    }
                    _ => {}
                }
                i += 1;
            }
        }
    }
    refs
}

/// The top-level module a source file belongs to (`None` for `lib.rs`, the root).
fn module_of(src_dir: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src_dir).expect("a file under src");
    let first = rel.components().next()?.as_os_str().to_str()?.to_string();
    match first.strip_suffix(".rs") {
        Some("lib") => None,
        Some(stem) => Some(stem.to_string()),
        None => Some(first), // a directory module
    }
}

/// Where each crate-root name that is not a module comes from: `pub use` re-exports of `lib.rs`
/// (name or alias -> the top-level module it is re-exported from), exported macros (name -> the
/// defining module), and items defined in `lib.rs` itself (-> `None`, the root).
fn root_names(src_dir: &Path, modules: &BTreeSet<String>) -> BTreeMap<String, Option<String>> {
    let lib = strip_test_items(&fs::read_to_string(src_dir.join("lib.rs")).expect("lib.rs"));
    let mut names = BTreeMap::new();
    // `use` declarations of lib.rs (re-exports and private imports alike bring a name into the
    // root namespace).
    for (k, _) in lib.match_indices("use ") {
        if k > 0 && is_ident(lib.as_bytes()[k - 1]) {
            continue;
        }
        let end = lib[k..].find(';').map_or(lib.len(), |e| k + e);
        let tree = lib[k + "use ".len()..end].trim();
        let tree = tree.strip_prefix("crate::").unwrap_or(tree);
        let Some(module) = ident_at(tree, 0) else { continue };
        if !modules.contains(module) {
            continue; // an external crate
        }
        // Every leaf of the tree: the last identifier of each comma-separated path, or its alias.
        let leaves = tree.replace(['{', '}'], ",");
        for leaf in leaves.split(',').map(str::trim).filter(|l| !l.is_empty()) {
            let name = match leaf.split_once(" as ") {
                Some((_, alias)) => alias.trim(),
                None => leaf.rsplit("::").next().unwrap_or(leaf).trim(),
            };
            if !name.is_empty() && name != "*" && name != module {
                names.insert(name.to_string(), Some(module.to_string()));
            }
        }
    }
    // Items defined in lib.rs itself.
    for kw in ["fn ", "struct ", "enum ", "trait ", "type ", "const ", "static ", "macro_rules! "] {
        for (k, _) in lib.match_indices(kw) {
            if k > 0 && is_ident(lib.as_bytes()[k - 1]) {
                continue;
            }
            if let Some(name) = ident_at(&lib, k + kw.len()) {
                names.entry(name.to_string()).or_insert(None);
            }
        }
    }
    // `#[macro_export]` macros live at the crate root.
    for file in rust_files(src_dir) {
        let src = strip_test_items(&fs::read_to_string(&file).expect("a source file"));
        for (k, _) in src.match_indices("#[macro_export]") {
            let Some(m) = src[k..].find("macro_rules!").map(|m| k + m + "macro_rules!".len()) else {
                continue;
            };
            let start = m + src[m..].len() - src[m..].trim_start().len();
            if let Some(name) = ident_at(&src, start) {
                names.insert(name.to_string(), module_of(src_dir, &file));
            }
        }
    }
    names
}

/// The top-level module graph of the crate whose sources are in `src_dir`.
fn module_graph(src_dir: &Path) -> Graph {
    let mut modules = BTreeSet::new();
    for entry in fs::read_dir(src_dir).expect("the src folder") {
        let path = entry.expect("a directory entry").path();
        let name = path.file_name().and_then(|n| n.to_str()).expect("a UTF-8 name").to_string();
        if path.is_dir() && path.join("mod.rs").exists() {
            modules.insert(name);
        } else if let Some(stem) = name.strip_suffix(".rs") {
            if stem != "lib" {
                modules.insert(stem.to_string());
            }
        }
    }
    let root = root_names(src_dir, &modules);
    let mut graph: Graph = modules.iter().map(|m| (m.clone(), BTreeSet::new())).collect();
    let mut unresolved = Vec::new();
    for file in rust_files(src_dir) {
        let Some(from) = module_of(src_dir, &file) else { continue };
        let src = strip_comments(&strip_test_items(&fs::read_to_string(&file).expect("a source file")));
        for name in crate_refs(&src) {
            let to = if modules.contains(&name) {
                Some(name.clone())
            } else {
                match root.get(&name) {
                    Some(to) => to.clone(),
                    None => {
                        unresolved.push(format!("{}: crate::{name}", file.display()));
                        continue;
                    }
                }
            };
            if let Some(to) = to.filter(|to| *to != from) {
                graph.entry(from.clone()).or_default().insert(to);
            }
        }
    }
    assert!(
        unresolved.is_empty(),
        "names referred to through the crate root that are neither modules, re-exports, exported \
         macros nor items of lib.rs (teach this test about them):\n{}",
        unresolved.join("\n")
    );
    graph
}

/// A cycle of `graph`, if it has one, as the list of its modules (the first repeated at the end).
fn find_cycle(graph: &Graph) -> Option<Vec<String>> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        New,
        OnPath,
        Done,
    }
    fn visit<'g>(
        graph: &'g Graph,
        node: &'g str,
        marks: &mut BTreeMap<&'g str, Mark>,
        path: &mut Vec<&'g str>,
    ) -> Option<Vec<String>> {
        marks.insert(node, Mark::OnPath);
        path.push(node);
        for next in graph.get(node).into_iter().flatten() {
            match marks.get(next.as_str()).copied().unwrap_or(Mark::New) {
                Mark::OnPath => {
                    let start = path.iter().position(|n| *n == next).unwrap_or(0);
                    let mut cycle: Vec<String> = path[start..].iter().map(|s| s.to_string()).collect();
                    cycle.push(next.clone());
                    return Some(cycle);
                }
                Mark::New => {
                    if let Some(c) = visit(graph, next, marks, path) {
                        return Some(c);
                    }
                }
                Mark::Done => {}
            }
        }
        path.pop();
        marks.insert(node, Mark::Done);
        None
    }
    let mut marks = BTreeMap::new();
    for node in graph.keys() {
        if marks.get(node.as_str()).copied().unwrap_or(Mark::New) == Mark::New {
            if let Some(c) = visit(graph, node, &mut marks, &mut Vec::new()) {
                return Some(c);
            }
        }
    }
    None
}

fn describe(graph: &Graph) -> String {
    graph.iter().map(|(m, to)| format!("  {m} -> {to:?}")).collect::<Vec<_>>().join("\n")
}

fn assert_acyclic(crate_dir: &str) {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(crate_dir).join("src");
    let graph = module_graph(&src);
    if let Some(cycle) = find_cycle(&graph) {
        panic!(
            "{crate_dir}: import cycle among top-level modules: {}\nthe module graph:\n{}",
            cycle.join(" -> "),
            describe(&graph)
        );
    }
}

#[test]
fn cuda_core_modules_are_acyclic() {
    assert_acyclic("cuda-core");
}

#[test]
fn cuda_async_modules_are_acyclic() {
    assert_acyclic("cuda-async");
}

/// The checker itself: it sees `crate::` paths, `use crate::{..}` trees and re-exported names,
/// ignores test-only items, and finds a cycle.
#[test]
fn the_checker_sees_references_and_cycles() {
    let src = r#"
        use crate::{a::X, b, Reexported as _};
        /// [`crate::c::Y`]
        fn f() { let _ = "}"; let _ = '{'; }
        #[cfg(test)]
        mod tests { use crate::d; fn g() { let _ = '}'; } }
        #[cfg(all(test, not(loom)))]
        use crate::e;
        #[cfg(not(test))]
        use crate::f;
        fn h<'a>(x: &'a str) -> &'a str { crate::g::h(x) }
    "#;
    let refs = crate_refs(&strip_comments(&strip_test_items(src)));
    // `c` is only named in a doc comment: not an import.
    let want: BTreeSet<String> = ["a", "b", "Reexported", "f", "g"].iter().map(|s| s.to_string()).collect();
    assert_eq!(refs, want);
    let mut graph = Graph::new();
    graph.entry("a".into()).or_default().insert("b".into());
    graph.entry("b".into()).or_default().insert("c".into());
    assert_eq!(find_cycle(&graph), None);
    graph.entry("c".into()).or_default().insert("a".into());
    assert_eq!(find_cycle(&graph), Some(vec!["a".into(), "b".into(), "c".into(), "a".into()]));
}
