//! The module graph of a crate's sources, read from its `crate::` and `super::` paths
//! (doc links included), and its cycles: a crate whose modules import each other in a
//! loop cannot be read from one end. A module's edges to its own ancestors and
//! descendants are left out (a child may use its parent); each other loop is a cycle,
//! between files and between top-level modules.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

type Module = Vec<String>;

/// Every cycle among the modules under `src` (a crate's `src` folder), each as its
/// modules joined by ` <-> `; none when the graph is acyclic.
pub fn cycles(src: &Path) -> Vec<String> {
    let mut files = BTreeMap::new();
    collect(src, src, &mut files);
    let modules: BTreeSet<Module> = files.keys().cloned().collect();
    let mut edges: BTreeMap<Module, BTreeSet<Module>> = BTreeMap::new();
    for (module, text) in &files {
        // Unit tests may reach anywhere.
        let text = text.split("mod tests {").next().unwrap_or_default();
        let targets = edges.entry(module.clone()).or_default();
        for path in paths(module, text) {
            if let Some(target) = resolve(&modules, &path)
                && target != *module
            {
                targets.insert(target);
            }
        }
    }
    let related = |a: &Module, b: &Module| a.starts_with(b) || b.starts_with(a);
    let file_graph: BTreeMap<String, BTreeSet<String>> = edges
        .iter()
        .map(|(m, ts)| {
            let ts = ts.iter().filter(|t| !related(m, t)).map(name);
            (name(m), ts.collect())
        })
        .collect();
    let mut top_graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (m, ts) in &edges {
        for t in ts {
            if let (Some(a), Some(b)) = (m.first(), t.first())
                && a != b
            {
                top_graph.entry(a.clone()).or_default().insert(b.clone());
            }
        }
    }
    let mut found = Vec::new();
    for graph in [file_graph, top_graph] {
        for component in components(&graph) {
            found.push(component.join(" <-> "));
        }
    }
    found
}

fn name(module: &Module) -> String {
    if module.is_empty() {
        "crate".into()
    } else {
        module.join("::")
    }
}

/// Each `.rs` file under `dir`, by its module path (`mod.rs`, `lib.rs` and `main.rs`
/// name their folder's module).
fn collect(root: &Path, dir: &Path, files: &mut BTreeMap<Module, String>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            collect(root, &path, files);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let relative = path.strip_prefix(root).unwrap().with_extension("");
            let mut module: Module = relative
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            if matches!(
                module.last().map(String::as_str),
                Some("mod" | "lib" | "main")
            ) {
                module.pop();
            }
            files.insert(module, std::fs::read_to_string(&path).unwrap());
        }
    }
}

/// The absolute module paths `text` (of `module`) names through `crate::` or `super::`,
/// `use` groups (`crate::{a, b}`) counted name by name.
fn paths(module: &Module, text: &str) -> Vec<Module> {
    let bytes = text.as_bytes();
    let ident = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let mut found = Vec::new();
    for start in [text.match_indices("crate::"), text.match_indices("super::")]
        .into_iter()
        .flatten()
        .map(|(i, _)| i)
    {
        if start > 0 && ident(bytes[start - 1]) {
            continue;
        }
        let mut base: Module = if text[start..].starts_with("crate") {
            Vec::new()
        } else {
            module[..module.len().saturating_sub(1)].to_vec()
        };
        let mut i = start + "crate::".len();
        let mut segments = Vec::new();
        loop {
            let from = i;
            while i < bytes.len() && ident(bytes[i]) {
                i += 1;
            }
            if from == i {
                break;
            }
            let segment = &text[from..i];
            if segment == "super" && segments.is_empty() {
                base.pop();
            } else {
                segments.push(segment.to_owned());
            }
            if !text[i..].starts_with("::") {
                break;
            }
            i += 2;
        }
        let prefix: Module = base.into_iter().chain(segments).collect();
        if text[i..].starts_with('{') {
            for member in group_members(&text[i + 1..]) {
                let mut path = prefix.clone();
                path.push(member);
                found.push(path);
            }
        } else {
            found.push(prefix);
        }
    }
    found
}

/// The first name of each member of a `use` group (the text after its `{`).
fn group_members(text: &str) -> Vec<String> {
    let mut members = Vec::new();
    let mut depth = 0;
    let mut expecting = true;
    for (i, c) in text.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => break,
            '}' => depth -= 1,
            ',' if depth == 0 => expecting = true,
            c if expecting && depth == 0 && (c.is_alphanumeric() || c == '_') => {
                let end = text[i..]
                    .find(|c: char| !(c.is_alphanumeric() || c == '_'))
                    .map_or(text.len(), |n| i + n);
                members.push(text[i..end].to_owned());
                expecting = false;
            }
            _ => {}
        }
    }
    members
}

/// The longest prefix of `path` that is a module.
fn resolve(modules: &BTreeSet<Module>, path: &Module) -> Option<Module> {
    (1..=path.len())
        .rev()
        .map(|n| path[..n].to_vec())
        .find(|prefix| modules.contains(prefix))
}

/// The strongly connected components of more than one node (Tarjan's algorithm).
fn components(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct Walk<'g> {
        graph: &'g BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'g str, usize>,
        low: BTreeMap<&'g str, usize>,
        stack: Vec<&'g str>,
        on_stack: BTreeSet<&'g str>,
        found: Vec<Vec<String>>,
    }
    impl<'g> Walk<'g> {
        fn visit(&mut self, v: &'g str) {
            let n = self.index.len();
            self.index.insert(v, n);
            self.low.insert(v, n);
            self.stack.push(v);
            self.on_stack.insert(v);
            for w in self.graph.get(v).into_iter().flatten() {
                let w = w.as_str();
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let low = self.low[v].min(self.low[w]);
                    self.low.insert(v, low);
                } else if self.on_stack.contains(w) {
                    let low = self.low[v].min(self.index[w]);
                    self.low.insert(v, low);
                }
            }
            if self.low[v] == self.index[v] {
                let mut component = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on_stack.remove(w);
                    component.push(w.to_owned());
                    if w == v {
                        break;
                    }
                }
                if component.len() > 1 {
                    component.sort();
                    self.found.push(component);
                }
            }
        }
    }
    let mut walk = Walk {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for v in graph.keys() {
        if !walk.index.contains_key(v.as_str()) {
            walk.visit(v);
        }
    }
    walk.found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, files: &[(&str, &str)]) {
        for (path, text) in files {
            let path = dir.join(path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        }
    }

    #[test]
    fn a_loop_between_siblings_is_a_cycle_and_a_child_using_its_parent_is_not() {
        let dir = tempfile::tempdir().unwrap();
        write(
            dir.path(),
            &[
                ("lib.rs", "mod a; mod b;"),
                ("a/mod.rs", "use crate::b::Thing; mod inner;"),
                ("a/inner.rs", "use super::Parent;"),
                ("b.rs", "//! See [`crate::a`]."),
            ],
        );
        assert_eq!(cycles(dir.path()), ["a <-> b", "a <-> b"]);
        write(dir.path(), &[("b.rs", "//! Nothing back.")]);
        assert!(cycles(dir.path()).is_empty());
    }

    #[test]
    fn use_groups_count_each_member_and_unit_tests_are_left_out() {
        let dir = tempfile::tempdir().unwrap();
        write(
            dir.path(),
            &[
                ("lib.rs", "mod a; mod b; mod c;"),
                ("a.rs", "use crate::{b::X, c};"),
                ("b.rs", "fn f() {}\nmod tests {\n use crate::a;\n}"),
                ("c.rs", "use super::a::Y;"),
            ],
        );
        assert_eq!(cycles(dir.path()), ["a <-> c", "a <-> c"]);
    }
}
