//! The FIFO of parked waiters: a doubly linked list threaded through a slab, plus a binary
//! min-heap of the deadlines of timed waiters (the shared deadline timer's schedule).
//!
//! Keys are slab indices. A key is owned by exactly one acquire future (the one that pushed
//! it), and only that future removes it, so a key is never stale and needs no generation.
//! Push, removal (from any position) and waking the head are O(1), plus O(log n) for a waiter
//! with a deadline; vacant slots are reused through a free list, and the slab gives its memory
//! back when the queue drains.
//!
//! Links and heap positions are `u32`: a waiter costs hundreds of bytes, so 2^32 of them
//! would need a terabyte; the narrow links keep a slot at 32 bytes.

use std::task::Waker;

/// "No node" in a link.
const NIL: u32 = u32::MAX;
/// `prev` of a vacant slot.
const VACANT: u32 = u32::MAX - 1;
/// `timer` of a waiter without a deadline (or whose deadline left the heap by expiring, see
/// [`EXPIRED`]).
const NO_TIMER: u32 = u32::MAX;
/// `timer` of a waiter whose deadline passed: the shared timer took it off the heap and
/// woke the waiter, which must time out.
const EXPIRED: u32 = u32::MAX - 1;

/// One slab slot: a queued waiter, or a vacant slot on the free list.
#[derive(Debug)]
pub(crate) struct Node {
    /// Previous waiter (`NIL` at the head); `VACANT` while the slot is vacant.
    prev: u32,
    /// Next waiter (`NIL` at the tail), or the next free slot while vacant.
    next: u32,
    /// This waiter's index in the deadline heap, `NO_TIMER` or `EXPIRED`.
    timer: u32,
    /// The waker of the last poll that found this waiter's condition false.
    pub(crate) waker: Option<Waker>,
    /// This waiter (necessarily the head) has a remote attempt in flight.
    pub(crate) in_flight: bool,
    /// This waiter may be passed the remote hold of a local holder (lock cohorting).
    pub(crate) passable: bool,
    /// This waiter (necessarily the head) was passed the hold and has not taken it yet.
    pub(crate) passed: bool,
}

impl Node {
    fn vacant(next: u32) -> Node {
        Node {
            prev: VACANT,
            next,
            timer: NO_TIMER,
            waker: None,
            in_flight: false,
            passable: false,
            passed: false,
        }
    }

    fn is_vacant(&self) -> bool {
        self.prev == VACANT
    }
}

/// One entry of the deadline heap: the deadline (nanoseconds after the shared timer's base
/// instant) and the waiter's key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Deadline {
    at: u64,
    key: u32,
}

// A parked waiter's share of the queue stays small (the budget is 256 bytes per waiter,
// future included, deadline included).
const _: () = assert!(Queue::SLOT_BYTES <= 32);
const _: () = assert!(Queue::TIMER_BYTES <= 16);

/// Capacity kept when the queue drains; larger slabs are given back.
const KEEP_SLOTS: usize = 16;

/// The wait queue. See the invariants table on [`Synchronizer`](crate::Synchronizer).
#[derive(Debug)]
pub(crate) struct Queue {
    slots: Vec<Node>,
    /// Min-heap of the deadlines of queued waiters that have one (by `at`, then key); each
    /// such node's `timer` is its index here, so a waiter that leaves takes its entry out in
    /// O(log n). Written here rather than taken from a crate: `std`'s `BinaryHeap` cannot
    /// remove an entry by position, and indexed priority queues (`priority-queue`) keep a hash
    /// map entry per item, which would break the 256-byte budget of a parked waiter.
    deadlines: Vec<Deadline>,
    free: u32,
    head: u32,
    tail: u32,
    len: usize,
}

impl Default for Queue {
    fn default() -> Self {
        Queue {
            slots: Vec::new(),
            deadlines: Vec::new(),
            free: NIL,
            head: NIL,
            tail: NIL,
            len: 0,
        }
    }
}

fn link(key: u32) -> Option<usize> {
    (key != NIL).then_some(key as usize)
}

/// A slab index as a link. The slab never reaches `u32::MAX - 1` slots (see the module docs).
fn narrow(key: usize) -> u32 {
    match u32::try_from(key) {
        Ok(k) if k < VACANT => k,
        _ => panic!("more than 2^32 - 2 waiters on one lock"),
    }
}

impl Queue {
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub(crate) fn head(&self) -> Option<usize> {
        link(self.head)
    }

    pub(crate) fn is_head(&self, key: usize) -> bool {
        link(self.head) == Some(key)
    }

    /// Appends a waiter at the tail and returns its key; `deadline` (nanoseconds after the
    /// shared timer's base) puts it on the deadline heap.
    pub(crate) fn push_back(&mut self, passable: bool, deadline: Option<u64>) -> usize {
        let node = Node {
            prev: self.tail,
            passable,
            ..Node::vacant(NIL)
        };
        let key = if self.free == NIL {
            self.slots.push(node);
            narrow(self.slots.len() - 1)
        } else {
            let key = self.free;
            let slot = &mut self.slots[key as usize];
            debug_assert!(slot.is_vacant(), "free list points at a queued slot");
            self.free = slot.next;
            *slot = node;
            key
        };
        if self.tail == NIL {
            self.head = key;
        } else {
            self.slots[self.tail as usize].next = key;
        }
        self.tail = key;
        self.len += 1;
        if let Some(at) = deadline {
            let pos = self.deadlines.len();
            self.deadlines.push(Deadline { at, key });
            self.slots[key as usize].timer = narrow(pos);
            self.sift_up(pos);
        }
        self.debug_check_ends();
        key as usize
    }

    /// Unlinks `key` (any position) and returns whether it was the head.
    pub(crate) fn remove(&mut self, key: usize) -> bool {
        let was_head = self.is_head(key);
        if self.on_timer(key) {
            self.remove_deadline(self.slots[key].timer as usize);
        }
        let node = &mut self.slots[key];
        assert!(
            !node.is_vacant(),
            "a waiter's key is removed only once, by its own future"
        );
        let (prev, next) = (node.prev, node.next);
        *node = Node::vacant(self.free);
        self.free = narrow(key);
        if prev == NIL {
            self.head = next;
        } else {
            self.slots[prev as usize].next = next;
        }
        if next == NIL {
            self.tail = prev;
        } else {
            self.slots[next as usize].prev = prev;
        }
        self.len -= 1;
        if self.len == 0 {
            // Every slot is vacant: forget the free list and give big slabs back, so a burst
            // of 10,000 waiters does not pin its memory for the life of the lock.
            self.slots.clear();
            self.slots.shrink_to(KEEP_SLOTS);
            self.deadlines.shrink_to(KEEP_SLOTS);
            self.free = NIL;
        }
        self.debug_check_ends();
        was_head
    }

    #[cfg(any(test, feature = "test-util"))]
    pub(crate) fn node(&self, key: usize) -> &Node {
        &self.slots[key]
    }

    pub(crate) fn node_mut(&mut self, key: usize) -> &mut Node {
        let node = &mut self.slots[key];
        debug_assert!(!node.is_vacant(), "key {key} is not in the queue");
        node
    }

    /// Takes the head's waker, if the head is parked.
    pub(crate) fn take_head_waker(&mut self) -> Option<Waker> {
        let head = link(self.head)?;
        self.slots[head].waker.take()
    }

    /// Whether `key`'s deadline is on the heap, watched by the shared timer.
    pub(crate) fn on_timer(&self, key: usize) -> bool {
        self.slots[key].timer < EXPIRED
    }

    /// `key`'s deadline, while it is on the heap.
    pub(crate) fn deadline_of(&self, key: usize) -> Option<u64> {
        let i = self.slots[key].timer;
        (i < EXPIRED).then(|| self.deadlines[i as usize].at)
    }

    /// Whether the shared timer found `key`'s deadline passed.
    pub(crate) fn is_expired(&self, key: usize) -> bool {
        self.slots[key].timer == EXPIRED
    }

    /// The earliest deadline on the heap.
    #[cfg_attr(slate_loom, allow(dead_code))] // the timer task is left out of loom builds
    pub(crate) fn next_deadline(&self) -> Option<u64> {
        self.deadlines.first().map(|d| d.at)
    }

    /// Whether no waiter has a deadline on the heap.
    pub(crate) fn no_deadlines(&self) -> bool {
        self.deadlines.is_empty()
    }

    /// Takes every deadline at or before `now` off the heap, marks its waiter expired and
    /// collects the waiter's waker.
    #[cfg_attr(slate_loom, allow(dead_code))] // the timer task is left out of loom builds
    pub(crate) fn expire(&mut self, now: u64, wakers: &mut Vec<Waker>) {
        while let Some(&Deadline { at, key }) = self.deadlines.first() {
            if at > now {
                break;
            }
            self.remove_deadline(0);
            let node = &mut self.slots[key as usize];
            node.timer = EXPIRED;
            wakers.extend(node.waker.take());
        }
    }

    /// Collects the wakers of every waiter with a deadline on the heap.
    pub(crate) fn timed_wakers(&mut self, wakers: &mut Vec<Waker>) {
        for d in &self.deadlines {
            wakers.extend(self.slots[d.key as usize].waker.take());
        }
    }

    fn remove_deadline(&mut self, pos: usize) {
        let last = self.deadlines.len() - 1;
        self.swap_deadlines(pos, last);
        let Some(gone) = self.deadlines.pop() else {
            unreachable!("the heap held the entry at {pos}")
        };
        self.slots[gone.key as usize].timer = NO_TIMER;
        if pos < self.deadlines.len() {
            self.sift_down(pos);
            self.sift_up(pos);
        }
    }

    fn swap_deadlines(&mut self, a: usize, b: usize) {
        self.deadlines.swap(a, b);
        for pos in [a, b] {
            let key = self.deadlines[pos].key as usize;
            self.slots[key].timer = narrow(pos);
        }
    }

    fn sift_up(&mut self, mut pos: usize) {
        while pos > 0 {
            let parent = (pos - 1) / 2;
            if self.deadlines[parent] <= self.deadlines[pos] {
                break;
            }
            self.swap_deadlines(parent, pos);
            pos = parent;
        }
    }

    fn sift_down(&mut self, mut pos: usize) {
        loop {
            let (left, right) = (2 * pos + 1, 2 * pos + 2);
            let mut least = pos;
            if left < self.deadlines.len() && self.deadlines[left] < self.deadlines[least] {
                least = left;
            }
            if right < self.deadlines.len() && self.deadlines[right] < self.deadlines[least] {
                least = right;
            }
            if least == pos {
                break;
            }
            self.swap_deadlines(pos, least);
            pos = least;
        }
    }

    /// The O(1) part of the invariants, checked at every transition in debug builds.
    fn debug_check_ends(&self) {
        debug_assert_eq!(self.head == NIL, self.len == 0, "head iff non-empty");
        debug_assert_eq!(self.tail == NIL, self.len == 0, "tail iff non-empty");
        if let Some(head) = link(self.head) {
            debug_assert_eq!(self.slots[head].prev, NIL, "head has no predecessor");
        }
        if let Some(tail) = link(self.tail) {
            debug_assert_eq!(self.slots[tail].next, NIL, "tail has no successor");
        }
        debug_assert!(
            self.deadlines.len() <= self.len,
            "a deadline per waiter at most"
        );
    }

    /// Walks the whole queue and checks every structural invariant; O(n), for tests.
    ///
    /// Returns a description of the first violation.
    #[cfg(any(test, feature = "test-util"))]
    pub(crate) fn check(&self) -> Result<(), String> {
        let mut seen = 0;
        let mut prev = NIL;
        let mut cursor = self.head;
        while cursor != NIL {
            let key = cursor as usize;
            let Some(node) = self.slots.get(key).filter(|n| !n.is_vacant()) else {
                return Err(format!("linked key {key} is not a queued slot"));
            };
            if node.prev != prev {
                return Err(format!("key {key}: prev {}, expected {prev}", node.prev));
            }
            if node.in_flight && !self.is_head(key) {
                return Err(format!(
                    "key {key} has an attempt in flight but is not the head"
                ));
            }
            if node.passed && !self.is_head(key) {
                return Err(format!("key {key} was passed the hold but is not the head"));
            }
            if node.passed && (node.in_flight || !node.passable) {
                return Err(format!(
                    "key {key} was passed the hold with an attempt in flight or while not passable"
                ));
            }
            if node.timer < EXPIRED
                && self.deadlines.get(node.timer as usize).map(|d| d.key) != Some(cursor)
            {
                return Err(format!(
                    "key {key} names deadline slot {}, which is not its own",
                    node.timer
                ));
            }
            seen += 1;
            if seen > self.len {
                return Err("cycle, or more linked nodes than len".to_owned());
            }
            prev = cursor;
            cursor = node.next;
        }
        if seen != self.len {
            return Err(format!("{seen} linked nodes, len {}", self.len));
        }
        if prev != self.tail {
            return Err(format!("last linked {prev}, tail {}", self.tail));
        }
        let queued = self.slots.iter().filter(|n| !n.is_vacant()).count();
        if queued != self.len {
            return Err(format!("{queued} queued slots, len {}", self.len));
        }
        let mut free = 0;
        let mut cursor = self.free;
        while cursor != NIL {
            let Some(node) = self.slots.get(cursor as usize).filter(|n| n.is_vacant()) else {
                return Err(format!("free list key {cursor} is not a vacant slot"));
            };
            if node.timer != NO_TIMER || node.waker.is_some() {
                return Err(format!("vacant slot {cursor} keeps a deadline or a waker"));
            }
            free += 1;
            if free > self.slots.len() {
                return Err("cycle in the free list".to_owned());
            }
            cursor = node.next;
        }
        if free + self.len != self.slots.len() {
            return Err(format!(
                "{free} free + {} queued != {} slots",
                self.len,
                self.slots.len()
            ));
        }
        for (pos, d) in self.deadlines.iter().enumerate() {
            let Some(node) = self.slots.get(d.key as usize).filter(|n| !n.is_vacant()) else {
                return Err(format!(
                    "deadline {pos} names key {}, not a queued slot",
                    d.key
                ));
            };
            if node.timer as usize != pos {
                return Err(format!(
                    "deadline {pos} names key {}, whose slot says {}",
                    d.key, node.timer
                ));
            }
            if pos > 0 && self.deadlines[(pos - 1) / 2] > *d {
                return Err(format!("deadline {pos} is earlier than its parent"));
            }
        }
        Ok(())
    }

    /// Bytes one queued waiter costs in the slab.
    pub(crate) const SLOT_BYTES: usize = std::mem::size_of::<Node>();

    /// Bytes a deadline costs on the heap, on top of the slot.
    pub(crate) const TIMER_BYTES: usize = std::mem::size_of::<Deadline>();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fifo_and_removal_anywhere() {
        let mut q = Queue::default();
        let keys: Vec<_> = (0..5).map(|_| q.push_back(false, None)).collect();
        assert_eq!(q.head(), Some(keys[0]));
        assert!(!q.remove(keys[2]), "middle is not head");
        assert!(!q.remove(keys[4]), "tail is not head");
        q.check().unwrap();
        assert!(q.remove(keys[0]));
        assert_eq!(q.head(), Some(keys[1]));
        let reused = q.push_back(false, None);
        assert!(keys.contains(&reused), "vacant slot reused");
        q.check().unwrap();
        assert!(q.remove(keys[1]));
        assert!(q.remove(keys[3]));
        assert_eq!(q.head(), Some(reused));
        assert!(q.remove(reused));
        assert!(q.is_empty());
        q.check().unwrap();
    }

    #[test]
    fn drained_queue_gives_memory_back() {
        let mut q = Queue::default();
        let keys: Vec<_> = (0..1000).map(|i| q.push_back(false, Some(i))).collect();
        for k in keys {
            q.remove(k);
        }
        assert!(q.slots.capacity() <= KEEP_SLOTS);
        assert!(q.deadlines.capacity() <= KEEP_SLOTS);
        q.check().unwrap();
    }

    #[test]
    fn check_detects_broken_links() {
        let mut q = Queue::default();
        let a = q.push_back(false, None);
        let b = q.push_back(false, None);
        q.node_mut(b).prev = NIL;
        assert!(q.check().is_err());
        q.node_mut(b).prev = narrow(a);
        q.node_mut(b).in_flight = true;
        assert!(q.check().unwrap_err().contains("in flight"));
    }

    #[test]
    fn check_detects_a_broken_heap() {
        let mut q = Queue::default();
        q.push_back(false, Some(5));
        q.push_back(false, Some(7));
        q.check().unwrap();
        q.deadlines.swap(0, 1);
        assert!(q.check().is_err(), "positions no longer match");
        q.deadlines.swap(0, 1);
        q.deadlines[1].at = 1;
        assert!(q.check().unwrap_err().contains("parent"));
    }

    /// Deadlines expire in order whatever the order they were queued and removed in, and the
    /// heap stays consistent throughout (a deterministic shuffle of 200 waiters).
    #[test]
    fn deadlines_expire_in_order_through_removals() {
        let mut q = Queue::default();
        let mut rng = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let mut live: Vec<(usize, Option<u64>)> = Vec::new();
        for _ in 0..200 {
            let deadline = (next() % 4 != 0).then(|| next() % 1000);
            live.push((q.push_back(false, deadline), deadline));
            if next() % 3 == 0 {
                let victim = live.swap_remove((next() % live.len() as u64) as usize);
                q.remove(victim.0);
            }
            q.check().unwrap();
        }
        let mut expected: Vec<_> = live
            .iter()
            .filter_map(|&(k, d)| d.map(|d| (d, k)))
            .collect();
        expected.sort_unstable();
        let mut expired = Vec::new();
        for now in 0..1000 {
            let mut wakers = Vec::new();
            q.expire(now, &mut wakers);
            for &(d, k) in &expected {
                if d == now {
                    assert!(
                        q.is_expired(k),
                        "key {k} with deadline {d} expired at {now}"
                    );
                    expired.push(k);
                } else if d > now {
                    assert!(
                        q.on_timer(k) && !q.is_expired(k),
                        "key {k} ({d}) early at {now}"
                    );
                }
            }
            q.check().unwrap();
        }
        assert_eq!(expired.len(), expected.len());
        assert!(q.no_deadlines());
        for (k, d) in live {
            assert_eq!(q.is_expired(k), d.is_some());
            assert!(!q.on_timer(k));
            q.remove(k);
        }
        q.check().unwrap();
    }
}
