//! A network namespace joined to this one by a veth pair: one client (a worker process) on
//! its own link to the servers, so a scenario can partition exactly that client (reliability.md
//! S11 (a)/(b)).
//!
//! ## Behaviour
//!
//! - [`NetNs::create`] adds a uniquely named namespace (`eco<pid>n<k>`), a veth pair (host end
//!   `ve<pid>h<k>`, namespace end `ve<pid>n<k>`) and a private link-local `/30`
//!   (`169.254.a.b`): the host end gets `.1`-style [`NetNs::host_addr`], the namespace end
//!   [`NetNs::ns_addr`]. Nothing else is routed: the namespace reaches only the host end's
//!   address, on this machine.
//! - A server the client must reach listens on [`NetNs::host_addr`] too (for `redis-server`:
//!   `bind 127.0.0.1 <host_addr>`); the client runs inside through [`NetNs::exec_args`]
//!   (`ip netns exec <name> <program> ...`, which execs the program: the PID is the
//!   program's).
//! - Faults: [`NetNs::cut`] takes the host end down (packets vanish: a silent partition),
//!   [`NetNs::prohibit`] installs a `prohibit` route in the namespace (sends fail at once);
//!   [`NetNs::heal`] undoes either.
//! - `Drop` deletes the namespace and the host end of the pair (which removes the pair), also
//!   while a test panics; errors there are printed, never raised. Processes still inside keep
//!   the namespace alive until they exit, so drop the worker set first (declare the
//!   [`NetNs`] before it).
//! - Needs root and `ip` (iproute2); [`NetNs::create`] reports anything missing as
//!   [`NetNsError::Unavailable`] so that a scenario can skip with the reason.
//!
//! # Examples
//!
//! ```no_run
//! use slate_harness::netns::NetNs;
//!
//! let ns = NetNs::create()?;
//! let mut argv = ns.exec_args();
//! argv.extend(["ping".to_owned(), "-c1".to_owned(), ns.host_addr().to_string()]);
//! let status = std::process::Command::new("ip").args(&argv).status()?;
//! assert!(status.success());
//! ns.cut()?; // now nothing gets through
//! ns.heal()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::net::Ipv4Addr;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

static NEXT: AtomicU32 = AtomicU32::new(0);

/// Errors of this module.
///
/// # Examples
///
/// ```
/// let e = slate_harness::netns::NetNsError::Unavailable("no ip".into());
/// assert!(e.to_string().contains("no ip"));
/// ```
///
/// # Errors
///
/// Not applicable.
#[derive(Debug, thiserror::Error)]
pub enum NetNsError {
    /// Namespaces cannot be made here (no `ip`, not root, no free address): scenarios that
    /// need one skip with this reason.
    #[error("network namespaces unavailable: {0}")]
    Unavailable(String),
    /// An `ip` command failed.
    #[error("`ip {args}` failed: {message}")]
    Command {
        /// The arguments.
        args: String,
        /// Exit status and stderr, or the spawn error.
        message: String,
    },
}

/// One namespace with its veth link; removed on drop.
///
/// # Examples
///
/// ```no_run
/// let ns = slate_harness::netns::NetNs::create()?;
/// println!("{} reaches {}", ns.name(), ns.host_addr());
/// # Ok::<(), slate_harness::netns::NetNsError>(())
/// ```
#[derive(Debug)]
pub struct NetNs {
    name: String,
    host_if: String,
    host_addr: Ipv4Addr,
    ns_addr: Ipv4Addr,
}

/// Runs `ip <args>`; the error carries stderr.
fn ip(args: &[&str]) -> Result<String, NetNsError> {
    let err = |message: String| NetNsError::Command {
        args: args.join(" "),
        message,
    };
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| err(format!("cannot run ip: {e}")))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(err(format!(
            "{}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

impl NetNs {
    /// Creates the namespace, the veth pair and the addresses, and brings the links up.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let ns = slate_harness::netns::NetNs::create()?;
    /// # Ok::<(), slate_harness::netns::NetNsError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`NetNsError::Unavailable`] when the namespace or the link cannot be made (everything
    /// made so far is removed).
    pub fn create() -> Result<Self, NetNsError> {
        let pid = std::process::id();
        let k = NEXT.fetch_add(1, Ordering::Relaxed);
        let name = format!("eco{pid}n{k}");
        let host_if = format!("ve{pid}h{k}");
        let ns_if = format!("ve{pid}n{k}");
        if host_if.len() > 15 {
            return Err(NetNsError::Unavailable(format!(
                "interface name {host_if} is longer than 15 bytes"
            )));
        }
        let unavailable = |e: NetNsError| NetNsError::Unavailable(e.to_string());
        ip(&["netns", "add", &name]).map_err(unavailable)?;
        // From here on, Drop cleans up whatever exists.
        let mut ns = NetNs {
            name,
            host_if,
            host_addr: Ipv4Addr::UNSPECIFIED,
            ns_addr: Ipv4Addr::UNSPECIFIED,
        };
        ip(&[
            "link",
            "add",
            &ns.host_if,
            "type",
            "veth",
            "peer",
            "name",
            &ns_if,
            "netns",
            &ns.name,
        ])
        .map_err(unavailable)?;
        let (host_addr, ns_addr) = free_subnet(pid, k)?;
        ns.host_addr = host_addr;
        ns.ns_addr = ns_addr;
        let host_cidr = format!("{host_addr}/30");
        let ns_cidr = format!("{ns_addr}/30");
        ip(&["addr", "add", &host_cidr, "dev", &ns.host_if]).map_err(unavailable)?;
        ip(&["link", "set", &ns.host_if, "up"]).map_err(unavailable)?;
        ip(&["-n", &ns.name, "addr", "add", &ns_cidr, "dev", &ns_if]).map_err(unavailable)?;
        ip(&["-n", &ns.name, "link", "set", &ns_if, "up"]).map_err(unavailable)?;
        ip(&["-n", &ns.name, "link", "set", "lo", "up"]).map_err(unavailable)?;
        Ok(ns)
    }

    /// The namespace's name.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let ns = slate_harness::netns::NetNs::create()?;
    /// assert!(ns.name().starts_with("eco"));
    /// # Ok::<(), slate_harness::netns::NetNsError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// None.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The host end's address: what the namespace's client connects to.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let ns = slate_harness::netns::NetNs::create()?;
    /// assert!(ns.host_addr().is_link_local());
    /// # Ok::<(), slate_harness::netns::NetNsError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// None.
    pub fn host_addr(&self) -> Ipv4Addr {
        self.host_addr
    }

    /// The namespace end's address.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let ns = slate_harness::netns::NetNs::create()?;
    /// assert_ne!(ns.ns_addr(), ns.host_addr());
    /// # Ok::<(), slate_harness::netns::NetNsError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// None.
    pub fn ns_addr(&self) -> Ipv4Addr {
        self.ns_addr
    }

    /// The arguments of `ip` that run a program inside: `["netns", "exec", <name>]`; append
    /// the program and its arguments.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let ns = slate_harness::netns::NetNs::create()?;
    /// assert_eq!(ns.exec_args()[..2], ["netns".to_owned(), "exec".to_owned()]);
    /// # Ok::<(), slate_harness::netns::NetNsError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// None.
    pub fn exec_args(&self) -> Vec<String> {
        vec!["netns".into(), "exec".into(), self.name.clone()]
    }

    /// Takes the host end down: every packet between the namespace and the host is dropped
    /// silently (TCP retransmits into the void; a blackhole).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let ns = slate_harness::netns::NetNs::create()?;
    /// ns.cut()?;
    /// ns.heal()?;
    /// # Ok::<(), slate_harness::netns::NetNsError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`NetNsError::Command`] when `ip` fails.
    pub fn cut(&self) -> Result<(), NetNsError> {
        ip(&["link", "set", &self.host_if, "down"]).map(drop)
    }

    /// Adds a `prohibit` route to the host end's address inside the namespace: the client's
    /// sends fail at once (fast errors) while the link stays up.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let ns = slate_harness::netns::NetNs::create()?;
    /// ns.prohibit()?;
    /// ns.heal()?;
    /// # Ok::<(), slate_harness::netns::NetNsError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`NetNsError::Command`] when `ip` fails.
    pub fn prohibit(&self) -> Result<(), NetNsError> {
        let target = format!("{}/32", self.host_addr);
        ip(&["-n", &self.name, "route", "add", "prohibit", &target]).map(drop)
    }

    /// Undoes [`NetNs::cut`] and [`NetNs::prohibit`] (whichever is in force).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let ns = slate_harness::netns::NetNs::create()?;
    /// ns.heal()?; // nothing to undo: still fine
    /// # Ok::<(), slate_harness::netns::NetNsError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`NetNsError::Command`] when `ip` fails.
    pub fn heal(&self) -> Result<(), NetNsError> {
        let target = format!("{}/32", self.host_addr);
        let routes = ip(&["-n", &self.name, "route", "show", "type", "prohibit"])?;
        if routes.contains(&self.host_addr.to_string()) {
            ip(&["-n", &self.name, "route", "del", "prohibit", &target])?;
        }
        ip(&["link", "set", &self.host_if, "up"]).map(drop)
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        // Deleting the host end removes the pair; then the namespace.
        let links = ip(&["-o", "link", "show", "dev", &self.host_if]);
        if links.is_ok()
            && let Err(e) = ip(&["link", "del", &self.host_if])
        {
            eprintln!("slate_harness::netns: {e}");
        }
        if let Err(e) = ip(&["netns", "del", &self.name]) {
            eprintln!("slate_harness::netns: {e}");
        }
    }
}

/// A `/30` in 169.254.0.0/16 not in use on the host: (host end, namespace end). The first
/// candidate is derived from (pid, k); the next ones follow it.
fn free_subnet(pid: u32, k: u32) -> Result<(Ipv4Addr, Ipv4Addr), NetNsError> {
    let used =
        ip(&["-o", "-4", "addr", "show"]).map_err(|e| NetNsError::Unavailable(e.to_string()))?;
    // 169.254.1.0 .. 169.254.254.255: 254 × 64 subnets of four addresses.
    let slots: u32 = 254 * 64;
    let first = pid.wrapping_mul(64).wrapping_add(k.wrapping_mul(7919)) % slots;
    for i in 0..slots {
        let slot = (first + i) % slots;
        let third = u8::try_from(1 + slot / 64).unwrap_or(1);
        let base = u8::try_from((slot % 64) * 4).unwrap_or(0);
        let host = Ipv4Addr::new(169, 254, third, base + 1);
        let peer = Ipv4Addr::new(169, 254, third, base + 2);
        let net = format!("169.254.{third}.{base}/30");
        let taken = [host.to_string(), peer.to_string(), net]
            .iter()
            .any(|a| used.contains(&format!("inet {a}/")) || used.contains(a.as_str()));
        if !taken {
            return Ok((host, peer));
        }
    }
    Err(NetNsError::Unavailable(
        "no free /30 in 169.254.0.0/16".into(),
    ))
}
