//! The rooms of ARCHITECTURE.md inside each crate, checked on the source.
//! Between the roles Cargo keeps the boundaries (the collector and the
//! query tools do not depend on the agent's crate, nor the query tools on
//! the collector's); inside a crate this test does: no module imports
//! another that imports it back (directly or around a circle), the agent's
//! rooms import only rooms on floors below theirs, and the web UI reaches
//! the stores only through the query API. Reads `use crate::` /
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

/// The source folder of the workspace crate in folder `name`.
fn crate_src(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(name).join("src")
}

fn graph(root: &Path) -> Graph {
    let mut files = Vec::new();
    source_files(root, &mut files);
    let modules: BTreeSet<String> = files.iter().map(|f| module_of(root, f)).collect();
    let mut graph = Graph::new();
    for file in &files {
        let module = module_of(root, file);
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

/// Crates whose modules must not import each other in a circle.
const CRATES: [&str; 6] = ["agent", "collector", "query-tools", "proto", "vocabulary", "sqlbee"];

#[test]
fn no_module_imports_its_importers() {
    for name in CRATES {
        let graph = graph(&crate_src(name));
        assert!(!graph.is_empty(), "no modules found in {name}");
        let circles: Vec<Vec<String>> = graph.keys().filter_map(|m| circle_from(&graph, m)).collect();
        assert!(circles.is_empty(), "import circles in {name}: {circles:#?}");
    }
    let agent = graph(&crate_src("agent"));
    assert!(agent.len() > 40, "too few modules found: {agent:#?}");
    assert!(agent["pipeline"].contains("probe"), "the checker no longer sees imports: {:?}", agent["pipeline"]);
}

/// The agent's rooms from the bottom floor up, in the order statements
/// flow through them, with the rooms beside the flow on the floor of what
/// they read. A room imports only rooms on floors below its own (and
/// itself); only `pipeline`, on the top floor, wires them.
const AGENT_FLOORS: [&[&str]; 11] = [
    // What every floor reads: /proc, and SQL text made digests (pure).
    &["procfs", "normalize"],
    // The optional login to a server, and where to reach it.
    &["server_login"],
    // The servers, their binaries and what this kernel offers; then the
    // privileges the agent keeps for it.
    &["discover"],
    &["privileges"],
    // What watching may cost; the probes, which call into budget.
    &["budget"],
    &["probe"],
    // Statements into windows; the host's own figures.
    &["aggregate", "host"],
    // Beside the flow: plans of closed windows, what runs now.
    &["plans", "activity"],
    // Closed windows out: stdout, collectors; then the agent's /metrics,
    // which counts what the ship stage did too.
    &["output", "ship"],
    &["metrics"],
    &["config", "pipeline"],
];

fn floor_of(room: &str) -> Option<usize> {
    AGENT_FLOORS.iter().position(|floor| floor.contains(&room))
}

#[test]
fn the_agents_rooms_import_only_the_floors_below_them() {
    let graph = graph(&crate_src("agent"));
    let mut upward = Vec::new();
    for (module, targets) in graph.iter().filter(|(m, _)| !m.is_empty()) {
        let Some(own) = floor_of(room(module)) else {
            panic!("the agent's room {} is on no floor of AGENT_FLOORS; add it where it belongs", room(module));
        };
        for target in targets.iter().filter(|t| room(t) != room(module)) {
            let theirs = floor_of(room(target)).unwrap_or(usize::MAX);
            // `config` and `pipeline` share the top floor: the options
            // name what the pipeline builds, and only the pipeline wires.
            if theirs >= own && !(room(module) == "pipeline" && room(target) == "config") {
                upward.push(format!("{module} -> {target}"));
            }
        }
    }
    assert!(upward.is_empty(), "imports that run up the agent's floors: {upward:#?}");
}

#[test]
fn the_web_ui_and_the_budget_stay_in_their_rooms() {
    let collector = graph(&crate_src("collector"));
    // A page sits behind the query API: the UI never reaches into a store
    // or into ingest (markers it takes go through the Annotate service).
    for (module, targets) in collector.iter().filter(|(m, _)| m.starts_with("http")) {
        let foreign: Vec<&String> = targets
            .iter()
            .filter(|t| !["http", "query_api", "auth", "annotate"].iter().any(|ok| t.starts_with(ok)))
            .collect();
        assert!(foreign.is_empty(), "{module} reaches past the query API: {foreign:?}");
    }
    let agent = graph(&crate_src("agent"));
    let budget_imports: BTreeSet<&str> =
        agent.iter().filter(|(m, _)| room(m) == "budget").flat_map(|(_, t)| t.iter().map(|t| room(t))).collect();
    assert!(!budget_imports.contains("probe"), "budget must not import probe (probe calls budget): {budget_imports:?}");
}

/// What Cargo keeps between the roles, read from the crates' manifests:
/// the collector and the query tools build with no aya and no agent, and
/// the wire crate knows the figures without the kernel's types.
#[test]
fn the_roles_depend_on_each_other_only_through_the_shared_crates() {
    let manifest = |name: &str| std::fs::read_to_string(crate_src(name).with_file_name("Cargo.toml")).unwrap();
    let dependencies = |name: &str| -> Vec<String> {
        let text = manifest(name);
        let mut deps = Vec::new();
        let mut section = String::new();
        for line in text.lines() {
            if line.starts_with('[') {
                section = line.to_string();
            } else if (section == "[dependencies]" || section == "[build-dependencies]")
                && !line.starts_with('#')
                && let Some((key, _)) = line.split_once('=')
            {
                deps.push(key.trim().to_string());
            }
        }
        deps
    };
    for (name, forbidden) in [
        ("collector", &["aya", "aya-build", "sqlbee-agent", "sqlbee-kernel-abi", "sqlbee-query-tools"][..]),
        ("query-tools", &["aya", "sqlbee-agent", "sqlbee-kernel-abi", "sqlbee-collector"][..]),
        ("proto", &["aya", "sqlbee-kernel-abi", "sqlbee-agent", "sqlbee-collector"][..]),
        ("vocabulary", &["aya", "sqlbee-kernel-abi", "sqlbee-proto"][..]),
        ("figures", &["aya", "sqlbee-kernel-abi"][..]),
        ("agent", &["sqlbee-collector", "sqlbee-query-tools"][..]),
    ] {
        let deps = dependencies(name);
        assert!(!deps.is_empty() || name == "figures", "no dependencies read from {name}/Cargo.toml");
        let wrong: Vec<&&str> = forbidden.iter().filter(|f| deps.iter().any(|d| d == *f)).collect();
        assert!(wrong.is_empty(), "{name} depends on {wrong:?}");
    }
}
