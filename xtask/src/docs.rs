//! The user's manual (mdBook, `docs/`) and the checks that keep it true:
//! the option reference is what the binary renders from its clap
//! definitions, the book builds without a warning, and no internal link or
//! anchor in the built book points nowhere.
use std::{
    collections::{HashMap, HashSet},
    fs,
    path::{Component, Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, bail};
use xtask::{
    cargo,
    paths::{tools_dir, workspace_root},
};

/// What `./x docs` does with the generated parts.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Rewrite the option reference from the binary, then build.
    Write,
    /// Fail when the committed reference differs from the binary's.
    Check,
}

pub fn mdbook() -> PathBuf {
    tools_dir().join("bin/mdbook")
}

/// The book's reference folder: `sqlbee reference` writes `cli/*.md`,
/// `limits.md` and `figures.md` there.
fn reference_dir() -> PathBuf {
    workspace_root().join("docs/src/reference")
}

/// The generated files under a reference folder, by their path in it.
fn generated(dir: &Path) -> HashSet<String> {
    let mut out: HashSet<String> = fs::read_dir(dir.join("cli"))
        .map(|d| d.flatten().map(|e| format!("cli/{}", e.file_name().to_string_lossy())).collect())
        .unwrap_or_default();
    for page in ["limits.md", "figures.md", "http-api.md", "openapi.json"] {
        if dir.join(page).exists() {
            out.insert(page.to_string());
        }
    }
    out
}

/// Builds `sqlbee` (debug, the default features) and returns its path.
fn sqlbee_binary() -> anyhow::Result<PathBuf> {
    let status =
        cargo().args(["build", "-q", "-p", "sqlbee", "--bin", "sqlbee"]).status().context("running cargo build")?;
    if !status.success() {
        bail!("cargo build -p sqlbee failed");
    }
    Ok(workspace_root().join("target/debug/sqlbee"))
}

pub fn run(mode: Mode, screenshots: bool) -> anyhow::Result<()> {
    let binary = sqlbee_binary()?;
    match mode {
        Mode::Write => {
            render_reference(&binary, &reference_dir())?;
            println!("ok  option reference written to {}", reference_dir().display());
        }
        Mode::Check => check_reference(&binary)?,
    }
    if screenshots {
        copy_screenshots()?;
    }
    let book = build_book()?;
    let broken = broken_links(&book)?;
    if !broken.is_empty() {
        bail!("{} broken links in the book:\n  {}", broken.len(), broken.join("\n  "));
    }
    println!("ok  the book in {} (no warning, every internal link resolves)", book.display());
    Ok(())
}

fn render_reference(binary: &Path, dir: &Path) -> anyhow::Result<()> {
    let out = Command::new(binary).arg("reference").arg(dir).output().context("running sqlbee reference")?;
    if !out.status.success() {
        bail!("sqlbee reference failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(())
}

fn check_reference(binary: &Path) -> anyhow::Result<()> {
    let fresh = std::env::temp_dir().join(format!("sqlbee-reference-{}", std::process::id()));
    let _ = fs::remove_dir_all(&fresh);
    render_reference(binary, &fresh)?;
    let committed = reference_dir();
    let mut differ = Vec::new();
    for name in generated(&fresh).union(&generated(&committed)) {
        let a = fs::read_to_string(fresh.join(name)).ok();
        let b = fs::read_to_string(committed.join(name)).ok();
        if a != b {
            differ.push(name.clone());
        }
    }
    let _ = fs::remove_dir_all(&fresh);
    if !differ.is_empty() {
        differ.sort();
        bail!(
            "the option reference in {} differs from what the binary's --help says ({}): run `./x docs` and commit the result",
            committed.display(),
            differ.join(", ")
        );
    }
    println!("ok  the option reference matches the binary");
    Ok(())
}

/// The pictures the web UI's browser test takes, for the manual.
fn copy_screenshots() -> anyhow::Result<()> {
    let from = workspace_root().join("target/ui-screenshots");
    let to = workspace_root().join("docs/src/images");
    fs::create_dir_all(&to)?;
    let mut copied = 0;
    for entry in fs::read_dir(&from).with_context(|| {
        format!("{} is missing: run the web UI test first (./x test, or cargo test --test web_ui)", from.display())
    })? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "png") {
            fs::copy(&path, to.join(path.file_name().unwrap()))?;
            copied += 1;
        }
    }
    println!("ok  {copied} screenshots copied into {}", to.display());
    Ok(())
}

fn build_book() -> anyhow::Result<PathBuf> {
    let root = workspace_root();
    let out = Command::new(mdbook())
        .args(["build", "docs"])
        .current_dir(&root)
        .output()
        .with_context(|| format!("running {} (./x setup installs it)", mdbook().display()))?;
    let log = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    if !out.status.success() {
        bail!("mdbook build failed:\n{log}");
    }
    let warnings: Vec<&str> = log.lines().filter(|l| l.contains("WARN") || l.contains("ERROR")).collect();
    if !warnings.is_empty() {
        bail!("mdbook build warned:\n{}", warnings.join("\n"));
    }
    Ok(root.join("target/book"))
}

/// Every `href` and `src` in the built pages that stays inside the book
/// must name a file that exists, and an `#anchor` an id on that page.
pub fn broken_links(book: &Path) -> anyhow::Result<Vec<String>> {
    let mut pages = Vec::new();
    collect_html(book, &mut pages)?;
    let mut ids: HashMap<PathBuf, HashSet<String>> = HashMap::new();
    let mut broken = Vec::new();
    for page in &pages {
        // 404.html is served from the site's root, its links are absolute.
        if page.file_name().is_some_and(|n| n == "404.html") {
            continue;
        }
        let html = fs::read_to_string(page)?;
        for link in attribute_values(&html, "href").into_iter().chain(attribute_values(&html, "src")) {
            if link.is_empty() || link.contains("://") || link.starts_with("mailto:") || link.starts_with("javascript:")
            {
                continue;
            }
            let (path, anchor) = link.split_once('#').unwrap_or((link.as_str(), ""));
            let path = path.split('?').next().unwrap_or("");
            let target = if path.is_empty() { page.clone() } else { normalize(&page.parent().unwrap().join(path)) };
            let shown = || format!("{} -> {link}", page.strip_prefix(book).unwrap_or(page).display());
            if !target.starts_with(book) || !target.exists() {
                broken.push(shown());
                continue;
            }
            if anchor.is_empty() || target.extension().is_none_or(|e| e != "html") {
                continue;
            }
            let known = match ids.get(&target) {
                Some(known) => known,
                None => {
                    let text = fs::read_to_string(&target)?;
                    ids.entry(target.clone()).or_insert_with(|| attribute_values(&text, "id").into_iter().collect())
                }
            };
            if !known.contains(anchor) {
                broken.push(shown());
            }
        }
    }
    broken.sort();
    broken.dedup();
    Ok(broken)
}

fn collect_html(dir: &Path, out: &mut Vec<PathBuf>) -> anyhow::Result<()> {
    for entry in fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        if path.is_dir() {
            collect_html(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "html") {
            out.push(path);
        }
    }
    Ok(())
}

/// The values of `name="..."` in a page (mdBook writes attributes with
/// double quotes), with the entities mdBook writes in URLs decoded.
fn attribute_values(html: &str, name: &str) -> Vec<String> {
    let needle = format!(" {name}=\"");
    let mut out = Vec::new();
    let mut rest = html;
    while let Some(at) = rest.find(&needle) {
        rest = &rest[at + needle.len()..];
        let Some(end) = rest.find('"') else { break };
        out.push(rest[..end].replace("&amp;", "&").replace("%20", " "));
        rest = &rest[end..];
    }
    out
}

fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_page_and_a_missing_anchor_are_found() {
        let book = std::env::temp_dir().join(format!("sqlbee-linkcheck-{}", std::process::id()));
        let _ = fs::remove_dir_all(&book);
        fs::create_dir_all(book.join("guide")).unwrap();
        fs::write(book.join("index.html"), r#"<a href="guide/a.html#top">a</a> <a href="guide/gone.html">x</a>"#)
            .unwrap();
        fs::write(
            book.join("guide/a.html"),
            r##"<h1 id="top">A</h1><a href="../index.html">up</a><a href="#nowhere">n</a><a href="https://x.org/">x</a>"##,
        )
        .unwrap();
        let broken = broken_links(&book).unwrap();
        assert_eq!(broken, vec!["guide/a.html -> #nowhere".to_string(), "index.html -> guide/gone.html".to_string()]);
        let _ = fs::remove_dir_all(&book);
    }
}
