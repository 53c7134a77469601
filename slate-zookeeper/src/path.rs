//! The znode layout of a lock: the root namespace, the lock's directory and its contenders.

use slate_core::{Error, LockName, Result};

/// The root a lock's directory lives under when the builder names none.
pub const DEFAULT_ROOT: &str = "/slate";

/// The longest root path accepted, in bytes.
pub const MAX_ROOT_LEN: usize = 1024;

/// Checks a root path (the lock namespace, like a Redis key prefix) and names the fix when it
/// is not usable.
///
/// A root is an absolute ZooKeeper path: it starts with `/`, has at least one component,
/// no empty, `.` or `..` component, no trailing `/`, no control or non-character code points
/// (ZooKeeper refuses them), and does not live under the server's own `/zookeeper` tree.
///
/// # Examples
///
/// ```
/// use slate_zookeeper::path::validate_root;
///
/// assert!(validate_root("/slate/locks").is_ok());
/// assert!(validate_root("slate").is_err());
/// assert!(validate_root("/slate/").is_err());
/// assert!(validate_root("/zookeeper/x").is_err());
/// ```
///
/// # Errors
///
/// [`Error::InvalidInput`] naming the problem and the fix.
pub fn validate_root(root: &str) -> Result<()> {
    let bad = |problem: String, fix: &str| Err(Error::invalid_input("lock root", problem, fix));
    if root.len() > MAX_ROOT_LEN {
        return bad(
            format!("the root is {} bytes long", root.len()),
            "use a root path of at most 1024 bytes, such as \"/slate\"",
        );
    }
    if !root.starts_with('/') {
        return bad(
            format!("{root:?} is not an absolute path"),
            "start the root with '/', as in \"/slate\"",
        );
    }
    if root == "/" {
        return bad(
            "the root \"/\" would put every lock beside ZooKeeper's own /zookeeper node".into(),
            "give the locks a directory of their own, such as \"/slate\"",
        );
    }
    if root.ends_with('/') {
        return bad(
            format!("{root:?} ends with '/'"),
            "drop the trailing '/' (ZooKeeper paths never end with one)",
        );
    }
    for (i, part) in root[1..].split('/').enumerate() {
        match part {
            "" => {
                return bad(
                    format!("{root:?} has an empty component (\"//\")"),
                    "separate components with a single '/'",
                );
            }
            "." | ".." => {
                return bad(
                    format!("{root:?} has a {part:?} component, which ZooKeeper refuses"),
                    "name every directory of the root explicitly",
                );
            }
            "zookeeper" if i == 0 => {
                return bad(
                    format!("{root:?} is inside ZooKeeper's reserved /zookeeper tree"),
                    "choose a root outside /zookeeper, such as \"/slate\"",
                );
            }
            _ => {}
        }
    }
    if let Some(c) = root.chars().find(|&c| forbidden(c)) {
        return bad(
            format!(
                "{root:?} contains the character U+{:04X}, which ZooKeeper refuses",
                c as u32
            ),
            "use printable characters in the root",
        );
    }
    Ok(())
}

/// The code points ZooKeeper refuses in a path (`PathUtils.validatePath`).
fn forbidden(c: char) -> bool {
    matches!(c, '\u{0}'..='\u{1f}' | '\u{7f}'..='\u{9f}' | '\u{e000}'..='\u{f8ff}' | '\u{fff0}'..='\u{ffff}')
}

/// The znode name of a lock name: the bytes `A-Z a-z 0-9 - _ . : @` verbatim, every other
/// byte (and `%`) as `%XX`, and a name made only of dots with its dots encoded too (`.` and
/// `..` are not valid znode names). One-to-one, so two names never share a directory.
///
/// # Examples
///
/// ```
/// use slate_zookeeper::LockName;
/// use slate_zookeeper::path::encode_name;
///
/// assert_eq!(encode_name(&LockName::new("orders:42")?), "orders:42");
/// assert_eq!(encode_name(&LockName::new("a/b c%")?), "a%2Fb%20c%25");
/// assert_eq!(encode_name(&LockName::new("..")?), "%2E%2E");
/// # Ok::<(), slate_zookeeper::Error>(())
/// ```
#[must_use]
pub fn encode_name(name: &LockName) -> String {
    let bytes = name.as_bytes();
    let all_dots = bytes.iter().all(|&b| b == b'.');
    let mut out = String::with_capacity(bytes.len());
    for &b in bytes {
        let keep = b.is_ascii_alphanumeric()
            || matches!(b, b'-' | b'_' | b':' | b'@')
            || (b == b'.' && !all_dots);
        if keep {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A contender's znode name: `<attempt id, 16 hex digits>-<sequence>`. The attempt id lets a
/// create whose reply was lost be found again (and never left behind in a live session).
pub(crate) fn contender_prefix(attempt: u64) -> String {
    format!("{attempt:016x}-")
}

/// Parses a contender's znode name into (sequence, attempt id); `None` for anything else
/// found in the directory.
pub(crate) fn parse_contender(child: &str) -> Option<(i64, u64)> {
    let (id, seq) = child.split_once('-')?;
    if id.len() != 16 || seq.len() < 10 {
        return None;
    }
    Some((seq.parse().ok()?, u64::from_str_radix(id, 16).ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roots() {
        for ok in [
            "/slate",
            "/a/b/c",
            "/zk-locks",
            "/zookeeperish",
            "/a/zookeeper",
        ] {
            assert!(validate_root(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "slate",
            "/",
            "/a/",
            "//a",
            "/a//b",
            "/.",
            "/a/..",
            "/zookeeper",
            "/a\u{1}",
        ] {
            let e = validate_root(bad).expect_err(bad);
            assert!(e.is_invalid_input(), "{bad}: {e}");
        }
        assert!(validate_root(&format!("/{}", "x".repeat(2000))).is_err());
    }

    #[test]
    fn names_are_one_to_one() {
        let names: Vec<&[u8]> = vec![
            b"a", b"A", b"%41", b".", b"..", b"...", b"a.b", b"a/b", b"\xff", b"%FF", b"a b",
        ];
        let encoded: std::collections::HashSet<String> = names
            .iter()
            .map(|n| encode_name(&LockName::new(n).unwrap()))
            .collect();
        assert_eq!(encoded.len(), names.len());
        for e in &encoded {
            assert!(!e.contains('/') && e != "." && e != "..", "{e}");
        }
    }

    #[test]
    fn contenders() {
        let name = format!("{}{:010}", contender_prefix(0xabc), 42);
        assert_eq!(parse_contender(&name), Some((42, 0xabc)));
        assert_eq!(parse_contender("lock-0000000001"), None);
        assert_eq!(parse_contender("x"), None);
    }
}
