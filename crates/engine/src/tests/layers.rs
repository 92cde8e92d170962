//! The engine's lower layers never reach into higher ones: what the state holds
//! (`state/`), who calls (`caller`), tenancy and records sit below the
//! operations, so no module cycle runs through them. Checked on the source
//! (`crate::<module>` paths outside comments and test modules), so a new
//! upward reference fails here with the file and the module it names.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// Modules by layer, lowest first. A module may use modules of its own layer
/// or lower ones; the operations (every module not listed) may use anything.
const LAYERS: &[&[&str]] = &[
    // Leaves: no engine state.
    &[
        "error",
        "clock",
        "caller",
        "audit",
        "chunks",
        "transfer",
        "initbin",
        "advisor",
        "admission",
        "sandboxfs",
        "privileges",
    ],
    // What the daemon holds: `AppState` and its components.
    &["state"],
    // Reading it for a caller.
    &["tenancy", "process_image"],
    &["record"],
];

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|l| l.contains(&module))
}

/// The engine's source files of `module` (a file, or a folder of files).
fn files_of(src: &Path, module: &str) -> Vec<PathBuf> {
    let dir = src.join(module);
    if dir.is_dir() {
        let mut v: Vec<PathBuf> = std::fs::read_dir(&dir)
            .expect("read module folder")
            .map(|e| e.expect("entry").path())
            .filter(|p| p.extension().is_some_and(|x| x == "rs"))
            .collect();
        v.sort();
        v
    } else {
        vec![src.join(format!("{module}.rs"))]
    }
}

/// The engine modules `file` names as `crate::<module>`, outside comments and its test module.
fn references(file: &Path) -> BTreeSet<String> {
    let text = std::fs::read_to_string(file).expect("read source");
    let code = text.split("#[cfg(test)]").next().unwrap_or("");
    let mut out = BTreeSet::new();
    for line in code.lines() {
        let line = line.split("//").next().unwrap_or("");
        let mut rest = line;
        while let Some(i) = rest.find("crate::") {
            rest = &rest[i + "crate::".len()..];
            let name: String = rest.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
            if !name.is_empty() {
                out.insert(name);
            }
        }
        // `use crate::{a, b::c}` names several.
        if let Some(list) = line.split("crate::{").nth(1) {
            for item in list.split(['}', ',']) {
                let name: String = item.trim().chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
                if !name.is_empty() {
                    out.insert(name);
                }
            }
        }
    }
    out
}

#[test]
fn lower_layers_never_name_the_operations() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut wrong = Vec::new();
    for (level, modules) in LAYERS.iter().enumerate() {
        for module in *modules {
            for file in files_of(&src, module) {
                for used in references(&file) {
                    let is_module = src.join(format!("{used}.rs")).exists() || src.join(&used).is_dir();
                    if !is_module || used == *module {
                        continue;
                    }
                    if layer_of(&used).is_none_or(|l| l > level) {
                        wrong.push(format!("{} (layer {level}) names crate::{used}", file.display()));
                    }
                }
            }
        }
    }
    assert!(wrong.is_empty(), "references up the layers:\n{}", wrong.join("\n"));
}

/// Every top-level module of the engine (a file or a folder) with the engine
/// modules it names.
fn module_graph(src: &Path) -> std::collections::BTreeMap<String, BTreeSet<String>> {
    let mut graph = std::collections::BTreeMap::new();
    for entry in std::fs::read_dir(src).expect("read src") {
        let path = entry.expect("entry").path();
        let name = path.file_stem().and_then(|s| s.to_str()).unwrap_or_default().to_string();
        let is_module = path.is_dir() || path.extension().is_some_and(|x| x == "rs");
        if !is_module || name == "lib" || name == "tests" {
            continue;
        }
        graph.insert(name, BTreeSet::new());
    }
    let names: BTreeSet<String> = graph.keys().cloned().collect();
    for (name, uses) in graph.iter_mut() {
        for file in files_of(src, name) {
            uses.extend(references(&file).into_iter().filter(|u| u != name && names.contains(u)));
        }
    }
    graph
}

#[test]
fn no_module_cycle_spans_the_engine() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let graph = module_graph(&src);
    assert!(graph.len() > 20 && graph.contains_key("lifecycle"), "the source was read: {:?}", graph.keys());
    // A depth-first search; a module met again on the current path closes a cycle.
    fn visit<'a>(
        m: &'a str,
        graph: &'a std::collections::BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<&'a str>,
        done: &mut BTreeSet<&'a str>,
    ) -> Option<Vec<String>> {
        if let Some(i) = path.iter().position(|p| *p == m) {
            let mut cycle: Vec<String> = path[i..].iter().map(|s| s.to_string()).collect();
            cycle.push(m.to_string());
            return Some(cycle);
        }
        if done.contains(m) {
            return None;
        }
        path.push(m);
        for next in graph.get(m).into_iter().flatten() {
            if let Some(c) = visit(next, graph, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(m);
        None
    }
    let mut done = BTreeSet::new();
    for m in graph.keys() {
        let cycle = visit(m, &graph, &mut Vec::new(), &mut done);
        assert!(cycle.is_none(), "engine modules in a cycle: {}", cycle.unwrap_or_default().join(" -> "));
    }
}
