//! The docs ship with the repository: every relative link of the README
//! and of `docs/` resolves to a file in it, and no file points at documents
//! a user does not have.

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every text file of the repository (no build output, no git internals).
fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if path.is_dir() {
            if name != "target" && !name.starts_with('.') {
                files(&path, out);
            }
        } else if [
            ".rs", ".md", ".toml", ".yml", ".yaml", ".json", ".lua", ".sh",
        ]
        .iter()
        .any(|ext| name.ends_with(ext))
            || name == "run"
            || name == "test"
        {
            out.push(path);
        }
    }
}

#[test]
fn no_file_points_at_documents_outside_the_repository() {
    let mut all = Vec::new();
    files(&root(), &mut all);
    assert!(all.len() > 100, "walked {} files", all.len());
    // Spelled in pieces, so this file does not match itself.
    let outside = [
        ["../", "shared"].concat(),
        ["ARCHI", "TECTURE §"].concat(),
        ["ARCHI", "TECTURE.md"].concat(),
        ["anchors", "-"].concat(),
        ["seed 0", "0"].concat(),
        ["Seed 0", "0"].concat(),
        // The project's own tracker is not the user's either.
        ["(iss", "ue "].concat(),
    ];
    let mut found = Vec::new();
    for path in &all {
        let Ok(text) = std::fs::read_to_string(path) else {
            continue;
        };
        for (n, line) in text.lines().enumerate() {
            if outside.iter().any(|p| line.contains(p.as_str())) {
                found.push(format!("{}:{}: {line}", path.display(), n + 1));
            }
        }
    }
    assert!(found.is_empty(), "{}", found.join("\n"));
}

#[test]
fn relative_links_of_the_docs_resolve() {
    let mut docs = vec![root().join("README.md"), root().join("CHANGELOG.md")];
    for entry in std::fs::read_dir(root().join("docs")).unwrap() {
        docs.push(entry.unwrap().path());
    }
    let mut broken = Vec::new();
    for doc in &docs {
        let text = std::fs::read_to_string(doc).unwrap();
        for (_, rest) in text.match_indices("](").map(|(i, _)| ((), &text[i + 2..])) {
            let Some(end) = rest.find(')') else { continue };
            let target = &rest[..end];
            if target.starts_with("http") || target.starts_with('#') {
                continue;
            }
            let target = target.split('#').next().unwrap();
            if !doc.parent().unwrap().join(target).exists() {
                broken.push(format!("{}: {target}", doc.display()));
            }
        }
    }
    assert!(broken.is_empty(), "{}", broken.join("\n"));
}
