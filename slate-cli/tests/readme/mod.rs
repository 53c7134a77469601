//! What every README quickstart test checks: the code between its file's `// README:BEGIN`
//! and `// README:END` markers is in README.md verbatim, as a `rust` block.

/// Fails unless README.md shows the snippet of `source` (the test file's own text, from
/// `include_str!`); `file` and `what` name it in the message.
pub fn assert_shown(source: &str, file: &str, what: &str) {
    let begin = source.find("// README:BEGIN\n").expect("begin marker") + 16;
    let end = source.find("// README:END").expect("end marker");
    let code = &source[begin..end];
    let readme = include_str!("../../../README.md");
    assert!(
        readme.contains(&format!("```rust\n{code}```")),
        "README.md's {what} differs from slate-cli/tests/{file}:\n{code}"
    );
}
