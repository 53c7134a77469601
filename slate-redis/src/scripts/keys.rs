//! Key layout of one lock.

use std::sync::Arc;

use slate_core::LockName;

/// The keys and channel of one lock, built once from the prefix and the name.
///
/// | what | key | lifetime |
/// | --- | --- | --- |
/// | lock hash | `<prefix>{<name>}` | field = holder id, value = reentry count; TTL = lease |
/// | fencing counter | `<prefix>fence:{<slot tag>}` | one per cluster hash slot, shared by every lock whose key is in that slot (see [`slot_tag`]); persistent; a single lock seeds a missing one from the server clock |
/// | release channel | `<prefix>{<name>}:released` | pub/sub channel the release script publishes on |
/// | waiting processes | `<prefix>{<name>}:queue` | sorted set of the processes waiting, FIFO; TTL = lease |
/// | turn | `<prefix>{<name>}:turn` | which process a free lock is reserved for; TTL = lease |
/// | request record | `<prefix>{<name>}:req:<holder>` | written only by a request sent again (or an undo): the holder's last request and its answer, so that a stale copy does nothing; TTL = the retry window (2 × command timeout). The first send of a request keeps its record inside the lock hash instead (`scripts/acquire.lua`) |
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
    /// The lock key's hash slot.
    pub(crate) slot: u16,
    /// The fencing counter of the lock key's hash slot.
    pub(crate) slot_fence: Arc<[u8]>,
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
        let slot = crate::client::conn::slot_of(&lock);
        let mut slot_fence = prefix.as_bytes().to_vec();
        slot_fence.extend_from_slice(b"fence:{");
        slot_fence.extend_from_slice(slot_tag(slot).as_bytes());
        slot_fence.push(b'}');
        Keys {
            slot,
            slot_fence: Arc::from(slot_fence),
            channel: with(b":released"),
            queue: with(b":queue"),
            turn: with(b":turn"),
            holder: with(b":holder"),
            lock: Arc::from(lock),
        }
    }
}

/// The hash tag of slot `slot`'s fencing counter: the first string, in the order of
/// [`tag_candidate`] (`0`..`9`, `a`..`z`, then two characters, and so on), whose CRC16 lands in
/// that slot. Every Slate client derives the same table, so that all of them count one lock's
/// tokens on one key.
///
/// Why one counter per slot and not per name: a per-name counter must never be deleted (its
/// tokens would repeat), so every name ever locked leaves a key behind for ever (about 70 bytes
/// each: a million per-entity names kept 70 MB). A slot's counter is shared by the names that
/// hash there, which keeps each lock's tokens strictly increasing (the counter only grows)
/// with at most 16,384 keys in all. It lives in the lock's slot, so a cluster's script can
/// touch both, and moves with the slot when a cluster reshards.
pub(crate) fn slot_tag(slot: u16) -> &'static str {
    static TAGS: std::sync::OnceLock<Vec<Box<str>>> = std::sync::OnceLock::new();
    let tags = TAGS.get_or_init(|| {
        let mut tags: Vec<Option<Box<str>>> = vec![None; SLOTS];
        let mut left = SLOTS;
        let mut i = 0u64;
        while left > 0 {
            let tag = tag_candidate(i);
            let s = usize::from(crate::client::conn::slot_of(tag.as_bytes()));
            if tags[s].is_none() {
                tags[s] = Some(tag.into_boxed_str());
                left -= 1;
            }
            i += 1;
        }
        tags.into_iter().map(Option::unwrap_or_default).collect()
    });
    &tags[usize::from(slot) % SLOTS]
}

/// Cluster hash slots.
pub(crate) const SLOTS: usize = 16_384;

/// The `i`-th candidate tag: the strings over `0-9a-z`, shortest first, then in base-36 order.
fn tag_candidate(mut i: u64) -> String {
    const DIGITS: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyz";
    let mut len = 1;
    let mut count = 36u64;
    while i >= count {
        i -= count;
        len += 1;
        count *= 36;
    }
    let mut out = vec![b'0'; len];
    for c in out.iter_mut().rev() {
        *c = DIGITS[usize::try_from(i % 36).unwrap_or(0)];
        i /= 36;
    }
    String::from_utf8(out).unwrap_or_default()
}

/// The name of the lock whose hash is `key` (exactly `<prefix>{<name>}`, see [`Keys`]), or
/// `None` when `key` is not a lock hash under `prefix`: the inverse of [`Keys::new`]'s lock
/// key, the `{` added in front of a name that begins with `}` taken off again.
pub(crate) fn name_of_lock_key<'k>(prefix: &str, key: &'k [u8]) -> Option<&'k [u8]> {
    let part = key
        .strip_prefix(prefix.as_bytes())?
        .strip_prefix(b"{")?
        .strip_suffix(b"}")?;
    // A part that is `{`+ then `}`... came from a name that gained a `{` (such a name matches
    // `^\{*\}`, and only such names do).
    match part.strip_prefix(b"{") {
        Some(name) if empty_tag(name) => Some(name),
        _ => Some(part),
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

    proptest! {
        /// Every lock key names its lock again, whatever the name's braces.
        #[test]
        fn a_lock_key_names_its_lock(name in proptest::collection::vec(
            prop_oneof![Just(b'{'), Just(b'}'), Just(b'a'), Just(b':')], 1..8)) {
            let lock = LockName::new(&name).unwrap();
            let keys = Keys::new("p:", &lock);
            prop_assert_eq!(name_of_lock_key("p:", &keys.lock), Some(&name[..]));
            prop_assert_eq!(name_of_lock_key("q:", &keys.lock), None);
            prop_assert_eq!(name_of_lock_key("p:", &keys.queue), None);
        }
    }

    fn all(k: &Keys) -> Vec<Vec<u8>> {
        vec![
            k.lock.to_vec(),
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
            let slot = crate::client::conn::slot_of(&ka.lock);
            prop_assert_eq!(crate::client::conn::slot_of(&ka.slot_fence), slot);
        }
    }

    #[test]
    fn layout_is_prefix_braced_name_and_suffixes() {
        let name = LockName::new(b"a}b\"\r\n\xff".as_slice()).unwrap();
        let k = Keys::new("p:", &name);
        assert_eq!(&*k.lock, b"p:{a}b\"\r\n\xff}".as_slice());
        assert_eq!(&*k.channel, b"p:{a}b\"\r\n\xff}:released".as_slice());
        assert_eq!(k.record("h:1"), b"p:{a}b\"\r\n\xff}:req:h:1".as_slice());
        let tag = slot_tag(crate::client::conn::slot_of(&k.lock));
        assert_eq!(&*k.slot_fence, format!("p:fence:{{{tag}}}").as_bytes());
    }

    /// The table is a function of the slot alone (every client computes the same keys), covers
    /// every slot, and each tag lands in its slot.
    #[test]
    fn every_slot_has_its_own_short_tag() {
        assert_eq!(tag_candidate(0), "0");
        assert_eq!(tag_candidate(35), "z");
        assert_eq!(tag_candidate(36), "00");
        assert_eq!(tag_candidate(36 + 36 * 36), "000");
        let mut seen = std::collections::HashSet::new();
        for slot in 0..16_384u16 {
            let tag = slot_tag(slot);
            assert!(!tag.is_empty() && tag.len() <= 4, "{slot}: {tag:?}");
            assert_eq!(crate::client::conn::slot_of(tag.as_bytes()), slot);
            assert!(seen.insert(tag));
        }
        // Pinned: a change of the table would split one lock's tokens over two counters.
        assert_eq!(slot_tag(0), "1bz");
        assert_eq!(
            slot_tag(12_182),
            slot_tag(crate::client::conn::slot_of(b"foo"))
        );
    }
}
