//! No import cycles among the top-level modules of `cuda-core` and `cuda-async`, and none between
//! their files except inside one folder.
//!
//! Reads the sources of both crates and builds the graph "file F uses an item defined in file G":
//! every path in code that starts with `crate::` (also `$crate::`), `super::`, `self::` or the name
//! of a child module, and every leaf of a `use` tree, outside comments (a doc link is not an
//! import) and outside items under a test-only `#[cfg(..)]` (`test`, or `all(.., test, ..)`). A path
//! is resolved segment by segment: a child module goes one file down; a name that a module imports
//! (`use`, globs included) is followed to where it is defined; anything else must be an item the
//! module's file defines (`fn`, `struct`, `enum`, `trait`, `type`, `const`, `static`, `union`,
//! `mod`, `macro_rules!`; a `#[macro_export]` macro is found at the crate root), and the path ends
//! there. A name that resolves to nothing fails the test, so that the graph is never silently
//! incomplete.
//!
//! **Re-exports are aliases, not uses.** A `pub`/`pub(crate)`/`pub(super)` `use` makes a name
//! reachable at another path (a facade, such as `cuda_core::memory::Allocation` for the item
//! defined in `track/alloc.rs`); a path through it is resolved to the file that defines the item.
//! The re-export itself is an edge of its own file only if that file's code also uses the name.
//!
//! Two rules are checked:
//!
//! 1. **Top-level modules are acyclic**: the file graph, with each file collapsed to its top-level
//!    module (`lib.rs`, the root, left out), has no cycle.
//! 2. **File cycles stay inside one folder**: every strongly connected component of the file graph
//!    with more than one file has all its files in one directory (a folder's `mod.rs` counts as in
//!    that folder). Such a cycle is the same concept split into files — e.g. `cuda-core/src/track/`,
//!    where a stream's state holds its capture's keep-alive set, which holds allocations, which
//!    hold their home stream: a type recursion, so the files that define those types name each
//!    other. A cycle between folders (or, by rule 1, top-level modules) is a layering error.
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

/// `src` with every comment blanked and the contents of every string and char literal blanked
/// (their quotes kept): a doc link to another module is not an import, and neither is text.
fn code_only(src: &str) -> String {
    let b = src.as_bytes();
    let mut out = b.to_vec();
    let mut i = 0;
    while i < b.len() {
        match skip_literal(b, i) {
            Some(end) => {
                let end = end.min(b.len());
                let (from, to) = if b[i] == b'/' { (i, end) } else { (i + 1, end.saturating_sub(1)) };
                for c in &mut out[from..to.max(from)] {
                    if *c != b'\n' {
                        *c = b' ';
                    }
                }
                i = end.max(i + 1);
            }
            None => i += 1,
        }
    }
    String::from_utf8(out).unwrap_or_default()
}

/// A module's path from the crate root (empty: the root).
type ModPath = Vec<String>;

/// One leaf of a `use` tree: the path it names, and whether it is a glob (`path::*`).
#[derive(Debug, PartialEq)]
struct UseLeaf {
    path: Vec<String>,
    /// The name it binds in the importing module (`None` for a glob or `as _`).
    binding: Option<String>,
    glob: bool,
}

/// The leaves of the `use` tree `tree` (the text between `use` and `;`).
fn expand_use(tree: &str) -> Vec<UseLeaf> {
    let mut tokens = Vec::new();
    let b = tree.as_bytes();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c == b'$' || is_ident(c) {
            let start = if c == b'$' { i + 1 } else { i };
            let len = b[start..].iter().take_while(|&&c| is_ident(c)).count();
            tokens.push(tree[start..start + len].to_string());
            i = start + len.max(1);
        } else if c == b':' && b.get(i + 1) == Some(&b':') {
            tokens.push("::".into());
            i += 2;
        } else if matches!(c, b'{' | b'}' | b',' | b'*') {
            tokens.push((c as char).to_string());
            i += 1;
        } else {
            i += 1;
        }
    }
    fn tree_at(t: &[String], mut pos: usize, prefix: &[String], out: &mut Vec<UseLeaf>) -> usize {
        let mut path = prefix.to_vec();
        while pos < t.len() {
            match t[pos].as_str() {
                "::" => pos += 1,
                "{" => {
                    pos += 1;
                    while pos < t.len() && t[pos] != "}" {
                        if t[pos] == "," {
                            pos += 1;
                            continue;
                        }
                        pos = tree_at(t, pos, &path, out);
                    }
                    return pos + 1;
                }
                "*" => {
                    out.push(UseLeaf { path, binding: None, glob: true });
                    return pos + 1;
                }
                "}" | "," => break,
                name => {
                    path.push(name.to_string());
                    pos += 1;
                    if t.get(pos).map(String::as_str) == Some("::") {
                        continue;
                    }
                    let mut binding = Some(name.to_string());
                    if t.get(pos).map(String::as_str) == Some("as") {
                        binding = t.get(pos + 1).filter(|a| *a != "_").cloned();
                        pos += 2;
                    }
                    if path.last().map(String::as_str) == Some("self") {
                        path.pop();
                        if binding.as_deref() == Some("self") {
                            binding = path.last().cloned();
                        }
                    }
                    out.push(UseLeaf { path, binding, glob: false });
                    return pos;
                }
            }
        }
        pos
    }
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < tokens.len() {
        pos = tree_at(&tokens, pos, &[], &mut out).max(pos + 1);
    }
    out
}

/// The `use` declarations of `code` (comments and literals blanked): each tree's text, whether it
/// is a re-export (`pub`, `pub(..)`), and its byte range.
fn use_decls(code: &str) -> Vec<(String, bool, std::ops::Range<usize>)> {
    let b = code.as_bytes();
    let mut out = Vec::new();
    for (k, _) in code.match_indices("use") {
        if (k > 0 && is_ident(b[k - 1])) || b.get(k + 3).is_none_or(|c| !c.is_ascii_whitespace()) {
            continue;
        }
        // The token before: a statement boundary, or a visibility.
        let before = code[..k].trim_end();
        let is_pub = before.ends_with("pub")
            || (before.ends_with(')') && {
                let open = before.rfind('(').unwrap_or(0);
                before[..open].trim_end().ends_with("pub")
            });
        let boundary = before.is_empty() || is_pub || before.ends_with([';', '{', '}', ']']);
        if !boundary {
            continue;
        }
        let Some(end) = code[k..].find(';').map(|e| k + e) else { continue };
        let start = if is_pub { before.rfind("pub").unwrap_or(k) } else { k };
        out.push((code[k + 3..end].to_string(), is_pub, start..end + 1));
    }
    out
}

/// The paths in `code` (use declarations blanked) that start with `crate`, `$crate`, `super`,
/// `self` or one of `children` and go on with `::`: their segments up to the first `{`, `<`, `*`
/// or the end of the path.
fn code_paths(code: &str, children: &BTreeSet<String>) -> Vec<Vec<String>> {
    let b = code.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if !is_ident(b[i]) {
            i += 1;
            continue;
        }
        let name = ident_at(code, i).unwrap_or_default();
        let prev = if i > 0 { b[i - 1] } else { b' ' };
        let starts = prev != b':' && (prev != b'$' || name == "crate");
        if starts
            && code[i + name.len()..].starts_with("::")
            && (["crate", "super", "self"].contains(&name) || children.contains(name))
        {
            let mut segs = vec![name.to_string()];
            let mut k = i + name.len();
            while code[k..].starts_with("::") {
                match ident_at(code, k + 2) {
                    Some(seg) if !seg.is_empty() => {
                        segs.push(seg.to_string());
                        k += 2 + seg.len();
                    }
                    _ => break,
                }
            }
            if segs.len() > 1 {
                out.push(segs);
            }
            i = k;
        } else {
            i += name.len().max(1);
        }
    }
    out
}

/// The source of one crate, by module: each module's file and code (test items, comments and
/// literals blanked; inside inline modules, `super::` rewritten to `self::` so that every path is
/// relative to the file's module), what each module imports, and the crate's exported macros.
struct Crate {
    files: BTreeMap<ModPath, String>,
    code: BTreeMap<ModPath, String>,
    /// Name -> the absolute path it imports (`None`: an item of another crate, which ends a path
    /// in the importing module).
    imports: BTreeMap<ModPath, BTreeMap<String, Option<Vec<String>>>>,
    globs: BTreeMap<ModPath, Vec<Vec<String>>>,
    macros: BTreeMap<String, ModPath>,
}

/// The module path of the file at `rel` (relative to `src`, `/`-separated).
fn mod_path(rel: &str) -> ModPath {
    let stem = rel.strip_suffix(".rs").unwrap_or(rel);
    let mut segs: Vec<String> = stem.split('/').map(str::to_string).collect();
    if matches!(segs.last().map(String::as_str), Some("mod" | "lib")) {
        segs.pop();
    }
    segs
}

/// `code` with `super::` inside every inline (non-test) `mod name { .. }` rewritten to ` self::`.
fn flatten_inline_mods(code: &str) -> String {
    let b = code.as_bytes();
    let mut out = code.to_string();
    for (k, _) in code.match_indices("mod ") {
        if k > 0 && is_ident(b[k - 1]) {
            continue;
        }
        let Some(name) = ident_at(code, k + 4) else { continue };
        let after = code[k + 4 + name.len()..].trim_start();
        if !after.starts_with('{') {
            continue;
        }
        let end = item_end(b, k);
        let inner = code[k..end].replace("super::", " self::");
        out.replace_range(k..end, &inner);
    }
    out
}

impl Crate {
    /// From `(path relative to src, source)` pairs.
    fn new(sources: &[(String, String)]) -> Crate {
        let mut c = Crate {
            files: BTreeMap::new(),
            code: BTreeMap::new(),
            imports: BTreeMap::new(),
            globs: BTreeMap::new(),
            macros: BTreeMap::new(),
        };
        for (rel, src) in sources {
            let m = mod_path(rel);
            let code = flatten_inline_mods(&code_only(&strip_test_items(src)));
            for (k, _) in code.match_indices("#[macro_export]") {
                if let Some(at) = code[k..].find("macro_rules!").map(|a| k + a + "macro_rules!".len()) {
                    let start = at + code[at..].len() - code[at..].trim_start().len();
                    if let Some(name) = ident_at(&code, start) {
                        c.macros.insert(name.to_string(), m.clone());
                    }
                }
            }
            c.files.insert(m.clone(), rel.clone());
            c.code.insert(m, code);
        }
        let modules: Vec<ModPath> = c.files.keys().cloned().collect();
        for m in modules {
            let code = c.code[&m].clone();
            for (tree, _, _) in use_decls(&code) {
                for leaf in expand_use(&tree) {
                    let abs = c.absolute(&m, &leaf.path);
                    match (leaf.glob, abs, leaf.binding) {
                        (true, Some(abs), _) => c.globs.entry(m.clone()).or_default().push(abs),
                        (false, abs, Some(name)) => {
                            c.imports.entry(m.clone()).or_default().insert(name, abs);
                        }
                        _ => {}
                    }
                }
            }
        }
        c
    }

    fn children(&self, m: &ModPath) -> BTreeSet<String> {
        self.files
            .keys()
            .filter(|k| k.len() == m.len() + 1 && k.starts_with(m))
            .filter_map(|k| k.last().cloned())
            .collect()
    }

    /// `path` as written in module `m`, from the crate root; `None` for a path into another crate.
    fn absolute(&self, m: &ModPath, path: &[String]) -> Option<Vec<String>> {
        let first = path.first()?;
        let (mut base, mut rest) = match first.as_str() {
            "crate" => (Vec::new(), &path[1..]),
            "self" => (m.clone(), &path[1..]),
            "super" => (m.clone(), path),
            _ if self.files.contains_key(&[m.as_slice(), std::slice::from_ref(first)].concat()) => {
                (m.clone(), path)
            }
            _ => return None,
        };
        while rest.first().map(String::as_str) == Some("super") {
            base.pop();
            rest = &rest[1..];
        }
        Some([base, rest.to_vec()].concat())
    }

    /// Whether module `m`'s file defines an item `name`.
    fn defines(&self, m: &ModPath, name: &str) -> bool {
        let code = &self.code[m];
        let b = code.as_bytes();
        ["fn", "struct", "enum", "trait", "type", "const", "static", "union", "mod", "macro_rules!"]
            .iter()
            .any(|kw| {
                code.match_indices(kw).any(|(k, _)| {
                    let after = k + kw.len();
                    (k == 0 || !is_ident(b[k - 1]))
                        && b.get(after).is_some_and(|c| c.is_ascii_whitespace())
                        && ident_at(code, after + code[after..].len() - code[after..].trim_start().len())
                            == Some(name)
                })
            })
    }

    /// The module whose file defines what the absolute path `abs` names (the module itself for a
    /// path that names a module), following imports and re-exports.
    fn resolve(&self, abs: &[String], depth: usize) -> Result<ModPath, String> {
        if depth > 32 {
            return Err(format!("re-exports too deep resolving {}", abs.join("::")));
        }
        let mut cur: ModPath = Vec::new();
        for (i, seg) in abs.iter().enumerate() {
            let child = [cur.as_slice(), std::slice::from_ref(seg)].concat();
            if self.files.contains_key(&child) {
                cur = child;
                continue;
            }
            // A definition first: an inline module's `use super::name` of its file's own item
            // reads as an import of `name` into the file's module itself.
            if self.defines(&cur, seg) {
                return Ok(cur);
            }
            match self.imports.get(&cur).and_then(|im| im.get(seg)) {
                Some(Some(target)) => {
                    return self.resolve(&[target.as_slice(), &abs[i + 1..]].concat(), depth + 1);
                }
                Some(None) => return Ok(cur),
                None => {}
            }
            for g in self.globs.get(&cur).into_iter().flatten() {
                if let Ok(found) = self.resolve(&[g.as_slice(), &abs[i..]].concat(), depth + 1) {
                    return Ok(found);
                }
            }
            if cur.is_empty() {
                if let Some(m) = self.macros.get(seg) {
                    return Ok(m.clone());
                }
            }
            return Err(format!(
                "crate::{} ({seg} is not defined in {:?})",
                abs.join("::"),
                self.files[&cur]
            ));
        }
        Ok(cur)
    }

    /// The file graph: file -> the files whose items it uses. Panics on a path it cannot resolve.
    fn file_graph(&self) -> Graph {
        let mut graph: Graph = self.files.values().map(|f| (f.clone(), BTreeSet::new())).collect();
        let mut unresolved = Vec::new();
        for (m, file) in &self.files {
            let code = &self.code[m];
            let decls = use_decls(code);
            let mut rest = code.clone();
            for (_, _, range) in &decls {
                rest.replace_range(range.clone(), &" ".repeat(range.len()));
            }
            let used_in_code = |name: &str| {
                rest.match_indices(name).any(|(k, _)| {
                    ident_at(&rest, k) == Some(name) && (k == 0 || !is_ident(rest.as_bytes()[k - 1]))
                })
            };
            let mut targets = Vec::new();
            for (tree, is_pub, _) in &decls {
                for leaf in expand_use(tree) {
                    let Some(abs) = self.absolute(m, &leaf.path) else { continue };
                    // A re-export is an alias for other files: an edge of this file only if its
                    // code uses the name too (a private import is always a use).
                    let counts = !is_pub || leaf.binding.as_deref().is_some_and(used_in_code);
                    if counts && !(leaf.glob && *is_pub) {
                        targets.push(abs);
                    }
                }
            }
            for path in code_paths(&rest, &self.children(m)) {
                if let Some(abs) = self.absolute(m, &path) {
                    targets.push(abs);
                }
            }
            for abs in targets {
                match self.resolve(&abs, 0) {
                    Ok(to) => {
                        let to = self.files[&to].clone();
                        if to != *file {
                            graph.entry(file.clone()).or_default().insert(to);
                        }
                    }
                    Err(e) => unresolved.push(format!("{file}: {e}")),
                }
            }
        }
        assert!(
            unresolved.is_empty(),
            "paths that resolve to no item (teach this test about them):\n{}",
            unresolved.join("\n")
        );
        graph
    }
}

/// The sources of the crate at `src_dir`, as `(path relative to src, text)`.
fn read_crate(src_dir: &Path) -> Vec<(String, String)> {
    rust_files(src_dir)
        .into_iter()
        .map(|f| {
            let rel = f.strip_prefix(src_dir).expect("a file under src");
            let rel = rel.components().map(|c| c.as_os_str().to_string_lossy()).collect::<Vec<_>>().join("/");
            (rel, fs::read_to_string(&f).expect("a source file"))
        })
        .collect()
}

/// The top-level module of a file (`None` for `lib.rs`).
fn top_module(file: &str) -> Option<String> {
    mod_path(file).first().cloned()
}

/// Rule 1: the file graph collapsed to top-level modules.
fn module_graph(files: &Graph) -> Graph {
    let mut graph = Graph::new();
    for (from, tos) in files {
        let Some(from) = top_module(from) else { continue };
        let entry = graph.entry(from.clone()).or_default();
        for to in tos.iter().filter_map(|t| top_module(t)) {
            if to != from {
                entry.insert(to);
            }
        }
    }
    graph
}

/// The strongly connected components of `graph` with more than one node (Tarjan).
fn cyclic_components(graph: &Graph) -> Vec<BTreeSet<String>> {
    struct State<'g> {
        index: BTreeMap<&'g str, usize>,
        low: BTreeMap<&'g str, usize>,
        stack: Vec<&'g str>,
        on_stack: BTreeSet<&'g str>,
        out: Vec<BTreeSet<String>>,
    }
    fn visit<'g>(graph: &'g Graph, v: &'g str, st: &mut State<'g>) {
        let i = st.index.len();
        st.index.insert(v, i);
        st.low.insert(v, i);
        st.stack.push(v);
        st.on_stack.insert(v);
        for w in graph.get(v).into_iter().flatten() {
            if !st.index.contains_key(w.as_str()) {
                visit(graph, w, st);
                let lw = st.low[w.as_str()];
                let lv = st.low[v].min(lw);
                st.low.insert(v, lv);
            } else if st.on_stack.contains(w.as_str()) {
                let lv = st.low[v].min(st.index[w.as_str()]);
                st.low.insert(v, lv);
            }
        }
        if st.low[v] == st.index[v] {
            let mut comp = BTreeSet::new();
            while let Some(w) = st.stack.pop() {
                st.on_stack.remove(w);
                comp.insert(w.to_string());
                if w == v {
                    break;
                }
            }
            if comp.len() > 1 {
                st.out.push(comp);
            }
        }
    }
    let mut st = State {
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in graph.keys() {
        if !st.index.contains_key(v.as_str()) {
            visit(graph, v, &mut st);
        }
    }
    st.out
}

/// Rule 2: the cyclic components whose files are not all in one folder below `src/`.
fn cross_folder_cycles(files: &Graph) -> Vec<BTreeSet<String>> {
    let folder = |f: &str| f.rsplit_once('/').map(|(dir, _)| dir.to_string());
    cyclic_components(files)
        .into_iter()
        .filter(|comp| {
            let first = folder(comp.iter().next().map(String::as_str).unwrap_or_default());
            first.is_none() || comp.iter().any(|f| folder(f) != first)
        })
        .collect()
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

fn check(crate_dir: &str) {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(crate_dir).join("src");
    let files = Crate::new(&read_crate(&src)).file_graph();
    let modules = module_graph(&files);
    if let Some(cycle) = find_cycle(&modules) {
        panic!(
            "{crate_dir}: import cycle among top-level modules: {}\nthe module graph:\n{}",
            cycle.join(" -> "),
            describe(&modules)
        );
    }
    let crossing = cross_folder_cycles(&files);
    assert!(
        crossing.is_empty(),
        "{crate_dir}: import cycles between files of different folders: {crossing:?}\nthe file graph:\n{}",
        describe(&files)
    );
}

#[test]
fn cuda_core_modules_are_acyclic() {
    check("cuda-core");
}

#[test]
fn cuda_async_modules_are_acyclic() {
    check("cuda-async");
}

fn sources(files: &[(&str, &str)]) -> Vec<(String, String)> {
    files.iter().map(|(p, s)| (p.to_string(), s.to_string())).collect()
}

/// The checker itself: `use` trees, code paths, comments, strings and test-only items.
#[test]
fn the_checker_reads_paths() {
    let leaves = expand_use("crate::{a::X, b::{self, Y as Z}, c::*, T as _}");
    let paths: Vec<(String, Option<&str>, bool)> =
        leaves.iter().map(|l| (l.path.join("::"), l.binding.as_deref(), l.glob)).collect();
    assert_eq!(
        paths,
        vec![
            ("crate::a::X".into(), Some("X"), false),
            ("crate::b".into(), Some("b"), false),
            ("crate::b::Y".into(), Some("Z"), false),
            ("crate::c".into(), None, true),
            ("crate::T".into(), None, false),
        ]
    );
    let src = r#"
        use crate::{a::X, b};
        /// [`crate::c::Y`]
        fn f() { let _ = "crate::d::Z"; let _ = '{'; }
        #[cfg(test)]
        mod tests { use crate::d; fn g() { let _ = '}'; } }
        #[cfg(all(test, not(loom)))]
        use crate::e;
        fn h<'a>(x: &'a str) -> &'a str { crate::g::h(x) + kid::k() + $crate::m::M }
    "#;
    let code = code_only(&strip_test_items(src));
    let decls = use_decls(&code);
    assert_eq!(decls.len(), 1);
    assert_eq!(decls[0].0.trim(), "crate::{a::X, b}");
    let mut rest = code.clone();
    rest.replace_range(decls[0].2.clone(), &" ".repeat(decls[0].2.len()));
    let kids: BTreeSet<String> = ["kid".to_string()].into();
    let found: Vec<String> = code_paths(&rest, &kids).iter().map(|p| p.join("::")).collect();
    // `c` is only in a doc comment and `d` only in a string or a test: not imports.
    assert_eq!(found, vec!["crate::g::h", "kid::k", "crate::m::M"]);
}

/// The checker itself: resolution through re-exports and globs, and both rules.
#[test]
fn the_checker_resolves_and_finds_cycles() {
    let krate = Crate::new(&sources(&[
        ("lib.rs", "mod a; pub mod b; mod c; pub use b::Facade;"),
        ("a/mod.rs", "mod x; mod y; pub use x::X; pub(crate) use y::*;"),
        ("a/x.rs", "pub struct X; fn f() { let _ = super::Y; }"),
        ("a/y.rs", "pub struct Y; fn g(_: super::X) {}"),
        // `b` re-exports `a`'s item: an alias, not an edge of `b`.
        ("b.rs", "pub use crate::a::X as Facade;"),
        ("c.rs", "use crate::Facade; fn h(_: Facade) {}"),
    ]));
    let files = krate.file_graph();
    let edges = |f: &str| files[f].iter().cloned().collect::<Vec<_>>();
    assert_eq!(edges("c.rs"), vec!["a/x.rs"]); // through two re-exports to the definition
    assert_eq!(edges("b.rs"), Vec::<String>::new());
    assert_eq!(edges("a/x.rs"), vec!["a/y.rs"]); // through the glob
    assert_eq!(find_cycle(&module_graph(&files)), None);
    // x <-> y is a cycle inside one folder: allowed.
    assert_eq!(cyclic_components(&files).len(), 1);
    assert!(cross_folder_cycles(&files).is_empty());
    // Between top-level modules, and between folders: refused.
    let krate = Crate::new(&sources(&[
        ("lib.rs", "mod a; mod b;"),
        ("a/mod.rs", "pub struct A; fn f(_: crate::b::B) {}"),
        ("b/mod.rs", "mod inner; pub struct B; fn g(_: inner::I) {}"),
        ("b/inner.rs", "pub struct I; fn h(_: crate::a::A) {}"),
    ]));
    let files = krate.file_graph();
    assert_eq!(find_cycle(&module_graph(&files)), Some(vec!["a".into(), "b".into(), "a".into()]));
    assert_eq!(cross_folder_cycles(&files).len(), 1);
    let mut graph = Graph::new();
    graph.entry("a".into()).or_default().insert("b".into());
    graph.entry("b".into()).or_default().insert("c".into());
    assert_eq!(find_cycle(&graph), None);
    graph.entry("c".into()).or_default().insert("a".into());
    assert_eq!(find_cycle(&graph), Some(vec!["a".into(), "b".into(), "c".into(), "a".into()]));
}
