//! `docs/OPERATIONS.md` lists every metric Slate records (`slate_core::metrics::METRICS`)
//! with its kind, and no metric that does not exist.

#[test]
fn the_operations_table_lists_every_metric_and_no_other() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/OPERATIONS.md");
    let doc = std::fs::read_to_string(path).expect("docs/OPERATIONS.md");
    for m in slate_core::metrics::METRICS {
        let row = doc
            .lines()
            .find(|l| l.starts_with(&format!("| `{}` |", m.name)))
            .unwrap_or_else(|| panic!("docs/OPERATIONS.md has no row for {}", m.name));
        assert!(
            row.contains(&format!("| {} |", m.kind)),
            "the row of {} does not say it is a {}: {row}",
            m.name,
            m.kind
        );
    }
    let documented = doc
        .lines()
        .filter(|l| l.starts_with("| `slate_"))
        .filter_map(|l| l.split('`').nth(1))
        .collect::<Vec<_>>();
    for name in &documented {
        assert!(
            slate_core::metrics::METRICS.iter().any(|m| m.name == *name),
            "docs/OPERATIONS.md documents {name}, which Slate does not record"
        );
    }
    assert_eq!(documented.len(), slate_core::metrics::METRICS.len());
}
