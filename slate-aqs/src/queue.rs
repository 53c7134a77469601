//! The FIFO of parked waiters: a doubly linked list threaded through a slab.
//!
//! Keys are slab indices. A key is owned by exactly one acquire future (the one that pushed
//! it), and only that future removes it, so a key is never stale and needs no generation.
//! Push, removal (from any position) and waking the head are O(1); vacant slots are reused
//! through a free list, and the slab gives its memory back when the queue drains.

use std::task::Waker;

/// "No node" in a link.
const NIL: usize = usize::MAX;

/// One slab slot: a queued waiter, or a vacant slot on the free list.
#[derive(Debug)]
pub(crate) struct Node {
    /// Previous waiter (`NIL` at the head). Unused while vacant.
    prev: usize,
    /// Next waiter (`NIL` at the tail), or the next free slot while vacant.
    next: usize,
    /// The waker of the last poll that found this waiter's condition false.
    pub(crate) waker: Option<Waker>,
    vacant: bool,
    /// This waiter (necessarily the head) has a remote attempt in flight.
    pub(crate) in_flight: bool,
    /// This waiter may be passed the remote hold of a local holder (lock cohorting).
    pub(crate) passable: bool,
    /// This waiter (necessarily the head) was passed the hold and has not taken it yet.
    pub(crate) passed: bool,
}

// A parked waiter's share of the queue stays small (the budget is 256 bytes per waiter,
// future included).
const _: () = assert!(Queue::SLOT_BYTES <= 40);

/// Capacity kept when the queue drains; larger slabs are given back.
const KEEP_SLOTS: usize = 16;

/// The wait queue. See the invariants table on [`Synchronizer`](crate::Synchronizer).
#[derive(Debug)]
pub(crate) struct Queue {
    slots: Vec<Node>,
    free: usize,
    head: usize,
    tail: usize,
    len: usize,
}

impl Default for Queue {
    fn default() -> Self {
        Queue {
            slots: Vec::new(),
            free: NIL,
            head: NIL,
            tail: NIL,
            len: 0,
        }
    }
}

fn link(key: usize) -> Option<usize> {
    (key != NIL).then_some(key)
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
        self.head == key
    }

    /// Appends a waiter at the tail and returns its key.
    pub(crate) fn push_back(&mut self, passable: bool) -> usize {
        let node = Node {
            prev: self.tail,
            next: NIL,
            waker: None,
            vacant: false,
            in_flight: false,
            passable,
            passed: false,
        };
        let key = if self.free == NIL {
            self.slots.push(node);
            self.slots.len() - 1
        } else {
            let key = self.free;
            debug_assert!(self.slots[key].vacant, "free list points at a queued slot");
            self.free = self.slots[key].next;
            self.slots[key] = node;
            key
        };
        if self.tail == NIL {
            self.head = key;
        } else {
            self.slots[self.tail].next = key;
        }
        self.tail = key;
        self.len += 1;
        self.debug_check_ends();
        key
    }

    /// Unlinks `key` (any position) and returns whether it was the head.
    pub(crate) fn remove(&mut self, key: usize) -> bool {
        let was_head = self.head == key;
        let node = &mut self.slots[key];
        assert!(
            !node.vacant,
            "a waiter's key is removed only once, by its own future"
        );
        let (prev, next) = (node.prev, node.next);
        *node = Node {
            prev: NIL,
            next: self.free,
            waker: None,
            vacant: true,
            in_flight: false,
            passable: false,
            passed: false,
        };
        self.free = key;
        if prev == NIL {
            self.head = next;
        } else {
            self.slots[prev].next = next;
        }
        if next == NIL {
            self.tail = prev;
        } else {
            self.slots[next].prev = prev;
        }
        self.len -= 1;
        if self.len == 0 {
            // Every slot is vacant: forget the free list and give big slabs back, so a burst
            // of 10,000 waiters does not pin its memory for the life of the lock.
            self.slots.clear();
            self.slots.shrink_to(KEEP_SLOTS);
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
        debug_assert!(!node.vacant, "key {key} is not in the queue");
        node
    }

    /// Takes the head's waker, if the head is parked.
    pub(crate) fn take_head_waker(&mut self) -> Option<Waker> {
        let head = link(self.head)?;
        self.slots[head].waker.take()
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
            let key = cursor;
            let Some(node) = self.slots.get(key).filter(|n| !n.vacant) else {
                return Err(format!("linked key {key} is not a queued slot"));
            };
            if node.prev != prev {
                return Err(format!("key {key}: prev {}, expected {prev}", node.prev));
            }
            if node.in_flight && key != self.head {
                return Err(format!(
                    "key {key} has an attempt in flight but is not the head"
                ));
            }
            if node.passed && key != self.head {
                return Err(format!("key {key} was passed the hold but is not the head"));
            }
            if node.passed && (node.in_flight || !node.passable) {
                return Err(format!(
                    "key {key} was passed the hold with an attempt in flight or while not passable"
                ));
            }
            seen += 1;
            if seen > self.len {
                return Err("cycle, or more linked nodes than len".to_owned());
            }
            prev = key;
            cursor = node.next;
        }
        if seen != self.len {
            return Err(format!("{seen} linked nodes, len {}", self.len));
        }
        if prev != self.tail {
            return Err(format!("last linked {prev}, tail {}", self.tail));
        }
        let queued = self.slots.iter().filter(|n| !n.vacant).count();
        if queued != self.len {
            return Err(format!("{queued} queued slots, len {}", self.len));
        }
        let mut free = 0;
        let mut cursor = self.free;
        while cursor != NIL {
            let Some(node) = self.slots.get(cursor).filter(|n| n.vacant) else {
                return Err(format!("free list key {cursor} is not a vacant slot"));
            };
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
        Ok(())
    }

    /// Bytes one queued waiter costs in the slab.
    pub(crate) const SLOT_BYTES: usize = std::mem::size_of::<Node>();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fifo_and_removal_anywhere() {
        let mut q = Queue::default();
        let keys: Vec<_> = (0..5).map(|_| q.push_back(false)).collect();
        assert_eq!(q.head(), Some(keys[0]));
        assert!(!q.remove(keys[2]), "middle is not head");
        assert!(!q.remove(keys[4]), "tail is not head");
        q.check().unwrap();
        assert!(q.remove(keys[0]));
        assert_eq!(q.head(), Some(keys[1]));
        let reused = q.push_back(false);
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
        let keys: Vec<_> = (0..1000).map(|_| q.push_back(false)).collect();
        for k in keys {
            q.remove(k);
        }
        assert!(q.slots.capacity() <= KEEP_SLOTS);
        q.check().unwrap();
    }

    #[test]
    fn check_detects_broken_links() {
        let mut q = Queue::default();
        let a = q.push_back(false);
        let b = q.push_back(false);
        q.node_mut(b).prev = NIL;
        assert!(q.check().is_err());
        q.node_mut(b).prev = a;
        q.node_mut(b).in_flight = true;
        assert!(q.check().unwrap_err().contains("in flight"));
    }
}
