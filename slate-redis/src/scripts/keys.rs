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
/// | current holder | `<prefix>{<name>}:holder` | `<remote holder> <holder>`: the local holder a hold was passed to inside its process (lock cohorting), written by the hold's renewals, read by `slate status`; TTL = lease |
///
/// The name's bytes go in verbatim, between braces, so that every key and the channel of one
/// lock share one cluster hash slot: Redis hashes the bytes between the first `{` of a key
/// and the first `}` after it, when there are any. They only ever travel as KEYS, ARGV or the
/// channel name, never inside script text.
///
/// **One exception keeps that tag non-empty**: a name that begins with
/// `}`, after any number of `{`, would give an empty tag (`p:{}x}`), and Redis then hashes
/// each key whole, scattering the lock over several slots. Such a name gets one more `{` in
/// front (`p:{{}x}`, tag `{`). The map stays one-to-one: a name gains the `{` exactly when it
/// matches `^\{*\}`, and a name with the `{` added matches it too, so no other name can
/// produce the same key. Every other name keeps the key it always had. The key prefix never
/// contains a brace (the options refuse it), so the tag is always the first brace pair after
/// the prefix, and it is never empty.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Keys {
    pub(crate) lock: Arc<[u8]>,
    pub(crate) fence: Arc<[u8]>,
    pub(crate) channel: Arc<[u8]>,
    pub(crate) queue: Arc<[u8]>,
    pub(crate) turn: Arc<[u8]>,
    pub(crate) holder: Arc<[u8]>,
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
        let name = name.as_bytes();
        let mut lock = Vec::with_capacity(prefix.len() + name.len() + 3);
        lock.extend_from_slice(prefix.as_bytes());
        lock.push(b'{');
        if empty_tag(name) {
            lock.push(b'{');
        }
        lock.extend_from_slice(name);
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
            holder: with(b":holder"),
            lock: Arc::from(lock),
        }
    }
}

/// Whether `{<name>}` would be an empty hash tag: the name is `{`* then `}`.
fn empty_tag(name: &[u8]) -> bool {
    let braces = name.iter().take_while(|&&b| b == b'{').count();
    name.get(braces) == Some(&b'}')
}

/// The hash tag Redis Cluster hashes for `key`: the bytes between the first `{` and the
/// first `}` after it when that is non-empty, else the whole key.
pub(crate) fn hash_tag(key: &[u8]) -> &[u8] {
    if let Some(open) = key.iter().position(|&b| b == b'{')
        && let Some(len) = key[open + 1..].iter().position(|&b| b == b'}')
        && len > 0
    {
        return &key[open + 1..open + 1 + len];
    }
    key
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn all(k: &Keys) -> Vec<Vec<u8>> {
        vec![
            k.lock.to_vec(),
            k.fence.to_vec(),
            k.channel.to_vec(),
            k.queue.to_vec(),
            k.turn.to_vec(),
            k.record("h:1"),
        ]
    }

    /// `}x` gave `p:{}x}`, an empty tag, so each key hashed whole.
    #[test]
    fn names_beginning_with_a_closing_brace_get_one_tag() {
        for name in ["}", "}x", "}}", "{}", "{{}x}", "}{", "{}{}"] {
            let k = Keys::new("p:", &LockName::new(name).unwrap());
            let keys = all(&k);
            let tag = hash_tag(&keys[0]);
            assert!(
                !tag.is_empty() && tag != &keys[0][..],
                "{name}: no tag in {:?}",
                keys[0]
            );
            for key in &keys {
                assert_eq!(hash_tag(key), tag, "{name}: {key:?}");
            }
        }
        assert_eq!(
            &*Keys::new("p:", &LockName::new("}x").unwrap()).lock,
            b"p:{{}x}"
        );
        // Other names keep their key.
        assert_eq!(
            &*Keys::new("p:", &LockName::new("a}b").unwrap()).lock,
            b"p:{a}b}"
        );
        assert_eq!(
            &*Keys::new("p:", &LockName::new("{a").unwrap()).lock,
            b"p:{{a}"
        );
    }

    proptest! {
        /// Every accepted name yields one non-empty tag shared by all of its keys, and two
        /// names never share a lock key.
        #[test]
        fn every_name_has_one_slot_and_its_own_key(
            a in prop::collection::vec(prop::sample::select(b"{}ab:".to_vec()), 1..8),
            b in prop::collection::vec(prop::sample::select(b"{}ab:".to_vec()), 1..8),
        ) {
            let ka = Keys::new("p:", &LockName::new(&a).unwrap());
            let kb = Keys::new("p:", &LockName::new(&b).unwrap());
            let keys = all(&ka);
            let tag = hash_tag(&keys[0]);
            prop_assert!(!tag.is_empty() && tag != &keys[0][..]);
            for key in &keys {
                prop_assert_eq!(hash_tag(key), tag);
            }
            prop_assert_eq!(a == b, ka.lock == kb.lock);
        }
    }

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
