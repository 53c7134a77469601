//! Key layout of one lock.

use std::sync::Arc;

use slate_core::LockName;

/// The keys and channel of one lock, built once from the prefix and the name.
///
/// | what | key | lifetime |
/// | --- | --- | --- |
/// | lock hash | `<prefix>{<name>}` | field = holder id, value = reentry count; TTL = lease |
/// | fencing counter | `<prefix>{<name>}:fence` | persistent: it must never expire or be deleted, or tokens would repeat |
/// | release channel | `<prefix>{<name>}:released` | pub/sub channel the release script publishes on |
/// | waiting processes | `<prefix>{<name>}:queue` | sorted set of the processes waiting, FIFO; TTL = lease |
/// | turn | `<prefix>{<name>}:turn` | which process a free lock is reserved for; TTL = lease |
/// | request record | `<prefix>{<name>}:req:<holder>` | the holder's last acquire or release request and its answer, so that a retry does not apply twice; TTL = the retry window (2 × command timeout) |
///
/// The name's bytes go in verbatim (between braces, so that the three share a cluster hash
/// slot); they only ever travel as KEYS, ARGV or the channel name, never inside script text.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Keys {
    pub(crate) lock: Arc<[u8]>,
    pub(crate) fence: Arc<[u8]>,
    pub(crate) channel: Arc<[u8]>,
    pub(crate) queue: Arc<[u8]>,
    pub(crate) turn: Arc<[u8]>,
}

impl Keys {
    /// The request record of `holder` (see `scripts/acquire.lua`).
    pub(crate) fn record(&self, holder: &str) -> Vec<u8> {
        let mut k = Vec::with_capacity(self.lock.len() + 5 + holder.len());
        k.extend_from_slice(&self.lock);
        k.extend_from_slice(b":req:");
        k.extend_from_slice(holder.as_bytes());
        k
    }

    pub(crate) fn new(prefix: &str, name: &LockName) -> Self {
        let mut lock = Vec::with_capacity(prefix.len() + name.as_bytes().len() + 2);
        lock.extend_from_slice(prefix.as_bytes());
        lock.push(b'{');
        lock.extend_from_slice(name.as_bytes());
        lock.push(b'}');
        let with = |suffix: &[u8]| -> Arc<[u8]> {
            let mut k = lock.clone();
            k.extend_from_slice(suffix);
            Arc::from(k)
        };
        Keys {
            fence: with(b":fence"),
            channel: with(b":released"),
            queue: with(b":queue"),
            turn: with(b":turn"),
            lock: Arc::from(lock),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_is_prefix_braced_name_and_suffixes() {
        let name = LockName::new(b"a}b\"\r\n\xff".as_slice()).unwrap();
        let k = Keys::new("p:", &name);
        assert_eq!(&*k.lock, b"p:{a}b\"\r\n\xff}".as_slice());
        assert_eq!(&*k.fence, b"p:{a}b\"\r\n\xff}:fence".as_slice());
        assert_eq!(&*k.channel, b"p:{a}b\"\r\n\xff}:released".as_slice());
        assert_eq!(k.record("h:1"), b"p:{a}b\"\r\n\xff}:req:h:1".as_slice());
    }
}
