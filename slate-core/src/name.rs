//! Lock names.

use std::fmt;
use std::sync::Arc;

use crate::error::{Error, Result};

/// The longest lock name accepted, in bytes.
pub const MAX_NAME_LEN: usize = 1024;

/// A validated lock name: non-empty, at most [`MAX_NAME_LEN`] bytes, any bytes otherwise.
///
/// Names only ever travel to Redis as script keys and arguments, never inside script text, so
/// quotes, newlines, Lua metacharacters, braces and non-UTF-8 bytes are all safe. Cloning is
/// cheap (reference counted).
///
/// # Examples
///
/// ```
/// use slate_core::LockName;
///
/// let name = LockName::new("orders")?;
/// assert_eq!(name.as_bytes(), b"orders");
/// assert!(LockName::new("").is_err());
/// assert!(LockName::new(vec![b'x'; 1025]).is_err());
/// # Ok::<(), slate_core::Error>(())
/// ```
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LockName(Arc<[u8]>);

impl LockName {
    /// Validates and wraps a name.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] when the name is empty or longer than [`MAX_NAME_LEN`] bytes.
    ///
    /// # Examples
    ///
    /// ```
    /// let name = slate_core::LockName::new(b"caf\xe9 {x}\r\n".as_slice())?;
    /// assert_eq!(name.as_bytes().len(), 10);
    /// # Ok::<(), slate_core::Error>(())
    /// ```
    pub fn new(name: impl AsRef<[u8]>) -> Result<Self> {
        let bytes = name.as_ref();
        if bytes.is_empty() {
            return Err(Error::invalid_input(
                "lock name",
                "the name is empty",
                "give the lock a non-empty name such as \"orders\"",
            ));
        }
        if bytes.len() > MAX_NAME_LEN {
            return Err(Error::invalid_input(
                "lock name",
                format!(
                    "the name is {} bytes long, more than the {MAX_NAME_LEN} allowed",
                    bytes.len()
                ),
                format!("use a name of at most {MAX_NAME_LEN} bytes (hash long identifiers first)"),
            ));
        }
        Ok(LockName(Arc::from(bytes)))
    }

    /// The name's bytes.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(slate_core::LockName::new("a")?.as_bytes(), b"a");
    /// # Ok::<(), slate_core::Error>(())
    /// ```
    #[must_use]
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

/// Printable form for messages and logs: lossy UTF-8, control characters escaped, cut to 100
/// characters.
impl fmt::Display for LockName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = String::from_utf8_lossy(&self.0);
        for (shown, c) in text.chars().enumerate() {
            if shown == 100 {
                return write!(f, "…({} bytes)", self.0.len());
            }
            if c.is_control() {
                write!(f, "{}", c.escape_default())?;
            } else {
                write!(f, "{c}")?;
            }
        }
        Ok(())
    }
}

impl fmt::Debug for LockName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LockName(\"{self}\")")
    }
}

impl TryFrom<&str> for LockName {
    type Error = Error;
    fn try_from(s: &str) -> Result<Self> {
        LockName::new(s)
    }
}

impl TryFrom<String> for LockName {
    type Error = Error;
    fn try_from(s: String) -> Result<Self> {
        LockName::new(s)
    }
}

impl TryFrom<&[u8]> for LockName {
    type Error = Error;
    fn try_from(s: &[u8]) -> Result<Self> {
        LockName::new(s)
    }
}

impl TryFrom<Vec<u8>> for LockName {
    type Error = Error;
    fn try_from(s: Vec<u8>) -> Result<Self> {
        LockName::new(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_escapes_and_truncates() {
        let n = LockName::new("a\r\nb").unwrap();
        assert_eq!(n.to_string(), "a\\r\\nb");
        let long = LockName::new("x".repeat(1024)).unwrap();
        assert!(long.to_string().ends_with("…(1024 bytes)"));
        let exact = LockName::new("y".repeat(1024)).unwrap();
        assert_eq!(exact.as_bytes().len(), MAX_NAME_LEN);
    }

    #[test]
    fn oversize_error_names_the_fix() {
        let err = LockName::new(vec![0u8; 1 << 20]).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("1048576 bytes"), "{text}");
        assert!(text.contains("at most 1024"), "{text}");
    }
}
