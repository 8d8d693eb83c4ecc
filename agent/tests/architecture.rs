//! The rooms of ARCHITECTURE.md, checked on the source: no module imports
//! another that imports it back (directly or around a circle), the
//! collector imports no agent room, and the query tools reach the
//! collector only through the query API's client. Reads `use crate::` /
//! `use super::` paths and `crate::x` paths in the code (tests left out).
use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
};

/// Module path (`budget::cgroup`) -> the modules its code names.
type Graph = BTreeMap<String, BTreeSet<String>>;

fn source_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            source_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

fn module_of(root: &Path, file: &Path) -> String {
    let relative = file.strip_prefix(root).unwrap().with_extension("");
    let mut parts: Vec<String> = relative.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    if parts == ["lib"] || parts == ["main"] {
        parts.clear();
    }
    parts.join("::")
}

/// The code before `#[cfg(test)] mod tests` (whose imports are the
/// tests'), without comment lines (which may name any module).
fn code_of(source: &str) -> String {
    let end = source.find("#[cfg(test)]\nmod tests").unwrap_or(source.len());
    source[..end].lines().filter(|l| !l.trim_start().starts_with("//")).collect::<Vec<_>>().join("\n")
}

/// Every path a `use` tree or an expression names, flattened:
/// `use crate::{a::b, c}` gives `crate::a::b` and `crate::c`.
fn named_paths(source: &str) -> Vec<String> {
    fn expand(prefix: &str, tree: &str, out: &mut Vec<String>) {
        let Some(open) = tree.find('{') else {
            out.push(format!("{prefix}{tree}"));
            return;
        };
        let head = &tree[..open];
        let inner = &tree[open + 1..tree.rfind('}').unwrap()];
        let (mut depth, mut start) = (0, 0);
        for (i, c) in inner.char_indices() {
            match c {
                '{' => depth += 1,
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    expand(&format!("{prefix}{head}"), &inner[start..i], out);
                    start = i + 1;
                }
                _ => {}
            }
        }
        if start < inner.len() {
            expand(&format!("{prefix}{head}"), &inner[start..], out);
        }
    }
    let mut out = Vec::new();
    let mut rest = source;
    while let Some(at) = rest.find("use ") {
        rest = &rest[at + 4..];
        let end = rest.find(';').unwrap_or(rest.len());
        let tree: String = rest[..end].chars().filter(|c| !c.is_whitespace()).collect();
        if tree.starts_with("crate::") || tree.starts_with("super::") {
            expand("", &tree, &mut out);
        }
    }
    for start in ["crate::", "super::"] {
        let mut rest = source;
        while let Some(at) = rest.find(start) {
            let path: String =
                rest[at..].chars().take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':').collect();
            out.push(path.trim_end_matches(':').to_string());
            rest = &rest[at + start.len()..];
        }
    }
    out
}

/// The longest known module a path names, seen from module `from`.
fn resolve(modules: &BTreeSet<String>, from: &str, path: &str) -> Option<String> {
    let mut base: Vec<&str> = if from.is_empty() { vec![] } else { from.split("::").collect() };
    let mut segments: Vec<&str> = path.split("::").filter(|s| *s != "self").collect();
    match segments.first() {
        Some(&"crate") => {
            base.clear();
            segments.remove(0);
        }
        Some(&"super") => {
            while segments.first() == Some(&"super") {
                base.pop();
                segments.remove(0);
            }
        }
        _ => return None,
    }
    (0..=segments.len()).rev().find_map(|k| {
        let candidate = [&base[..], &segments[..k]].concat().join("::");
        modules.contains(&candidate).then_some(candidate)
    })
}

fn graph() -> Graph {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    source_files(&root, &mut files);
    let modules: BTreeSet<String> = files.iter().map(|f| module_of(&root, f)).collect();
    let mut graph = Graph::new();
    for file in &files {
        let module = module_of(&root, file);
        let source = std::fs::read_to_string(file).unwrap();
        let edges = graph.entry(module.clone()).or_default();
        for path in named_paths(&code_of(&source)) {
            if let Some(target) = resolve(&modules, &module, &path)
                && !target.is_empty()
                && target != module
                && !module.starts_with(&format!("{target}::"))
                && !target.starts_with(&format!("{module}::"))
            {
                edges.insert(target);
            }
        }
    }
    graph
}

/// A circle through `start`, if there is one.
fn circle_from(graph: &Graph, start: &str) -> Option<Vec<String>> {
    fn walk(graph: &Graph, node: &str, start: &str, path: &mut Vec<String>, seen: &mut BTreeSet<String>) -> bool {
        for next in graph.get(node).into_iter().flatten() {
            if next == start {
                return true;
            }
            if seen.insert(next.clone()) {
                path.push(next.clone());
                if walk(graph, next, start, path, seen) {
                    return true;
                }
                path.pop();
            }
        }
        false
    }
    let mut path = vec![start.to_string()];
    walk(graph, start, start, &mut path, &mut BTreeSet::new()).then_some(path)
}

fn room(module: &str) -> &str {
    module.split("::").next().unwrap()
}

#[test]
fn no_module_imports_its_importers() {
    let graph = graph();
    assert!(graph.len() > 40, "too few modules found: {graph:#?}");
    assert!(graph["pipeline"].contains("probe"), "the checker no longer sees imports: {:?}", graph["pipeline"]);
    let circles: Vec<Vec<String>> = graph.keys().filter_map(|m| circle_from(&graph, m)).collect();
    assert!(circles.is_empty(), "import circles: {circles:#?}");
}

/// The query API's client, and the JSON shape of its answers that the
/// web UI's `/api/` serves too.
const QUERY_TOOLS_MAY_IMPORT: [&str; 2] = ["collector::query_api::remote", "collector::query_api::json"];

#[test]
fn collector_and_query_tools_stay_in_their_rooms() {
    let graph = graph();
    // The client connection and the Prometheus page are shared by both roles.
    let allowed_for_collector = ["collector", "client", "prometheus"];
    for (module, targets) in graph.iter().filter(|(m, _)| room(m) == "collector") {
        let foreign: Vec<&String> = targets.iter().filter(|t| !allowed_for_collector.contains(&room(t))).collect();
        assert!(foreign.is_empty(), "{module} imports agent rooms: {foreign:?}");
    }
    for (module, targets) in graph.iter().filter(|(m, _)| room(m) == "query") {
        let foreign: Vec<&String> =
            targets.iter().filter(|t| room(t) != "query" && !QUERY_TOOLS_MAY_IMPORT.contains(&t.as_str())).collect();
        assert!(foreign.is_empty(), "{module} reaches past the query API's client: {foreign:?}");
    }
    // A page sits behind the query API: the UI never reaches into a store
    // or into ingest (markers it takes go through the Annotate service).
    for (module, targets) in graph.iter().filter(|(m, _)| m.starts_with("collector::http")) {
        let foreign: Vec<&String> = targets
            .iter()
            .filter(|t| {
                !["collector::http", "collector::query_api", "collector::auth", "collector::annotate"]
                    .iter()
                    .any(|ok| t.starts_with(ok))
            })
            .collect();
        assert!(foreign.is_empty(), "{module} reaches past the query API: {foreign:?}");
    }
    let budget_imports: BTreeSet<&str> =
        graph.iter().filter(|(m, _)| room(m) == "budget").flat_map(|(_, t)| t.iter().map(|t| room(t))).collect();
    assert!(!budget_imports.contains("probe"), "budget must not import probe (probe calls budget): {budget_imports:?}");
}
