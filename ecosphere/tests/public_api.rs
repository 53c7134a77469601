//! The public API's example rules (`docs/API.md`, "Checked by"): the code a user reads for each
//! published crate (its doc examples, its `examples/` programs, the README's Rust blocks)
//! compiles against that crate and its re-exports alone, and the common path needs no trait
//! import. The doc tests compile the examples; this test checks what they name.

use std::fs;
use std::path::{Path, PathBuf};

/// The workspace crates a user could depend on, by their Rust name.
const WORKSPACE: [&str; 5] = [
    "slate_core",
    "slate_aqs",
    "slate_redis",
    "slate_combination",
    "slate_zookeeper",
];

/// A code block a user reads: where it is, and its text.
struct Block {
    place: String,
    text: String,
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

/// The fenced code blocks of `lines` (numbered text) whose info string `is_code` accepts.
fn fenced<'a>(
    place: &str,
    lines: impl Iterator<Item = (usize, &'a str)>,
    is_code: fn(&str) -> bool,
) -> Vec<Block> {
    let mut blocks = Vec::new();
    let mut open: Option<(usize, String, bool)> = None;
    for (n, line) in lines {
        if let Some(info) = line.trim_start().strip_prefix("```") {
            match open.take() {
                Some((start, text, true)) => blocks.push(Block {
                    place: format!("{place}:{}", start + 1),
                    text,
                }),
                Some(_) => {}
                None => open = Some((n, String::new(), is_code(info))),
            }
            continue;
        }
        if let Some((_, text, _)) = open.as_mut() {
            text.push_str(line);
            text.push('\n');
        }
    }
    blocks
}

/// The fenced code blocks of doc comments (`///`, `//!`) in Rust source, hidden lines included
/// (they are compiled too); blocks marked `text` and the like are not Rust and are skipped.
fn doc_blocks(place: &str, src: &str) -> Vec<Block> {
    let docs = src.lines().enumerate().filter_map(|(n, line)| {
        let t = line.trim_start();
        let doc = t.strip_prefix("///").or_else(|| t.strip_prefix("//!"))?;
        let doc = doc.strip_prefix(' ').unwrap_or(doc);
        Some((n, doc.strip_prefix("# ").unwrap_or(doc)))
    });
    fenced(place, docs, is_rust)
}

/// The ```rust blocks of a Markdown file.
fn markdown_blocks(place: &str, md: &str) -> Vec<Block> {
    fenced(place, md.lines().enumerate(), |info| {
        info.trim().starts_with("rust")
    })
}

/// Doc-test info strings that are Rust code.
fn is_rust(info: &str) -> bool {
    let info = info.trim();
    info.is_empty()
        || info
            .split(',')
            .all(|a| ["rust", "no_run", "should_panic", "compile_fail"].contains(&a.trim()))
}

/// Whether the block uses a trait in a way only generic code needs (a bound, an impl, `dyn`).
fn is_generic(text: &str) -> bool {
    [
        ": DistributedLock",
        ": LockGuard",
        ": slate_redis::DistributedLock",
        ": slate_combination::DistributedLock",
        ": slate_core::DistributedLock",
        ": slate_core::LockGuard",
        "impl DistributedLock",
        "impl LockGuard",
        "LockGuard::",
        "DistributedLock::",
        "dyn ",
    ]
    .iter()
    .any(|p| text.contains(p))
}

/// What is wrong with `block` as an example of the crate `own` (`None`: the README, which may
/// use any lock crate but not the contract or synchronizer crates directly).
fn violations(own: Option<&str>, block: &Block) -> Vec<String> {
    let mut found = Vec::new();
    for other in WORKSPACE {
        let allowed = match own {
            Some(own) => own == other,
            None => matches!(
                other,
                "slate_redis" | "slate_combination" | "slate_zookeeper"
            ),
        };
        if !allowed
            && (block.text.contains(&format!("{other}::"))
                || block.text.contains(&format!("use {other}")))
        {
            found.push(format!(
                "{}: names `{other}`; use what {} re-exports",
                block.place,
                own.unwrap_or("the lock crates")
            ));
        }
    }
    if own != Some("slate_core") && own != Some("slate_aqs") {
        let imports_trait = block.text.lines().any(|l| {
            let l = l.trim_start();
            l.starts_with("use ") && (l.contains("DistributedLock") || l.contains("LockGuard"))
        });
        if imports_trait && !is_generic(&block.text) {
            found.push(format!(
                "{}: imports DistributedLock/LockGuard for the common path; the inherent \
                 methods need no import (keep the traits for generic code)",
                block.place
            ));
        }
    }
    found
}

/// Every Rust source file under `dir`.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(entries) = fs::read_dir(dir) else {
        return out;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(rust_files(&p));
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
    out.sort();
    out
}

fn read(p: &Path) -> String {
    fs::read_to_string(p).unwrap_or_else(|e| panic!("reading {}: {e}", p.display()))
}

#[test]
fn examples_use_only_their_crate_and_need_no_trait_import() {
    let root = root();
    let mut found = Vec::new();
    let mut checked = 0;
    for (dir, own) in [
        ("slate-core", "slate_core"),
        ("slate-aqs", "slate_aqs"),
        ("slate-redis", "slate_redis"),
        ("slate-combination", "slate_combination"),
        ("slate-zookeeper", "slate_zookeeper"),
    ] {
        for file in rust_files(&root.join(dir).join("src")) {
            let place = file
                .strip_prefix(&root)
                .unwrap_or(&file)
                .display()
                .to_string();
            for b in doc_blocks(&place, &read(&file)) {
                checked += 1;
                found.extend(violations(Some(own), &b));
            }
        }
        for file in rust_files(&root.join(dir).join("examples")) {
            let place = file
                .strip_prefix(&root)
                .unwrap_or(&file)
                .display()
                .to_string();
            checked += 1;
            found.extend(violations(
                Some(own),
                &Block {
                    place,
                    text: read(&file),
                },
            ));
        }
    }
    for b in markdown_blocks("README.md", &read(&root.join("README.md"))) {
        checked += 1;
        found.extend(violations(None, &b));
    }
    assert!(
        checked > 200,
        "only {checked} examples found: is the scan broken?"
    );
    assert!(
        found.is_empty(),
        "{} problem(s):\n{}",
        found.len(),
        found.join("\n")
    );
}

/// The checker catches each rule it enforces (so that the test above can fail).
#[test]
fn the_checker_catches_each_rule() {
    let block = |text: &str| Block {
        place: "sample".to_owned(),
        text: text.to_owned(),
    };
    let other_crate = block("let c = slate_redis::RedisClient::open(url)?;\n");
    assert_eq!(violations(Some("slate_combination"), &other_crate).len(), 1);
    assert!(violations(Some("slate_redis"), &other_crate).is_empty());
    let core_in_readme = block("async fn main() -> slate_core::Result<()> { Ok(()) }\n");
    assert_eq!(violations(None, &core_in_readme).len(), 1);
    let trait_import =
        block("use slate_redis::{DistributedLock, SingleLock};\nlock.lock().await?;\n");
    assert_eq!(violations(Some("slate_redis"), &trait_import).len(), 1);
    let generic = block("use slate_redis::DistributedLock;\nfn f<L: DistributedLock>(l: &L) {}\n");
    assert!(violations(Some("slate_redis"), &generic).is_empty());

    let src = "/// ```no_run\n/// # use slate_core::Error;\n/// ```\n/// ```text\n/// slate_core::x\n/// ```\nfn f() {}\n";
    let blocks = doc_blocks("f.rs", src);
    assert_eq!(blocks.len(), 1, "the text block is skipped");
    assert_eq!(
        violations(Some("slate_redis"), &blocks[0]).len(),
        1,
        "hidden lines count"
    );
    let md = "```sh\nslate run\n```\n```rust\nuse slate_aqs::Synchronizer;\n```\n";
    let blocks = markdown_blocks("README.md", md);
    assert_eq!(blocks.len(), 1);
    assert_eq!(violations(None, &blocks[0]).len(), 1);
}
