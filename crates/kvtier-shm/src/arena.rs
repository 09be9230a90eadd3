//! An arena: the segments that hold one namespace's blocks, and the slots
//! they are cut into.
//!
//! A slot is a page-aligned range of one segment. It is written once
//! ([`SlotMut`]), then frozen into a `Bytes` the store keeps like any other
//! block payload; the range goes back to the free list only when the last
//! `Bytes` of it is dropped. A lease (a client reading a slot through its
//! mapping) is such a `Bytes` held by the server for the client, so a slot
//! under lease is never reused, whatever the tier does meanwhile.
//!
//! A segment only ever holds its arena's bytes: it is never given to another
//! arena, so a mapping a client keeps can never come to show another
//! namespace's blocks. Empty segments stay, faulted in and mapped by the
//! clients that read them, for the next blocks, until the budget runs out:
//! then [`Arena::reclaim`] *retires* them (drops them: their budget given
//! back, their memory freed once no client maps them any more). Their total is bounded by a [`Budget`] shared
//! by every arena; past it, [`Arena::alloc`] says no and the caller
//! reclaims or moves the bytes another way (docs/local.md).
use crate::segment::{Segment, Sharing, page};
use bytes::Bytes;
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// The bytes every arena's segments may take together.
#[derive(Debug)]
pub struct Budget {
    limit: u64,
    used: AtomicU64,
}

impl Budget {
    /// A budget of `limit` bytes.
    pub fn new(limit: u64) -> Arc<Self> {
        Arc::new(Self {
            limit,
            used: AtomicU64::new(0),
        })
    }

    /// Bytes of segments created so far.
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    /// The limit.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// `n` bytes of the budget, given back when the charge is dropped;
    /// `None` when they do not fit.
    pub fn charge(self: &Arc<Self>, n: u64) -> Option<Charge> {
        self.take(n).then(|| Charge {
            budget: self.clone(),
            n,
        })
    }

    fn take(&self, n: u64) -> bool {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
                (u + n <= self.limit).then_some(u + n)
            })
            .is_ok()
    }

    fn give(&self, n: u64) {
        self.used.fetch_sub(n, Ordering::AcqRel);
    }
}

/// Bytes of a [`Budget`] held by something other than an arena (a segment
/// lent to a client for its saves).
#[derive(Debug)]
pub struct Charge {
    budget: Arc<Budget>,
    n: u64,
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.budget.give(self.n);
    }
}

/// The first segment of an arena; each next one doubles, up to the arena's
/// largest, so a namespace with a few small blocks holds little memory.
const FIRST_SEGMENT: usize = 4 << 20;

struct Part {
    seg: Arc<Segment>,
    /// Free ranges, offset → length, coalesced.
    free: BTreeMap<usize, usize>,
    free_bytes: usize,
}

struct Inner {
    label: String,
    largest: usize,
    budget: Arc<Budget>,
    parts: Mutex<Vec<Part>>,
}

/// One namespace's segments. Cloning shares it.
#[derive(Clone)]
pub struct Arena(Arc<Inner>);

impl Arena {
    /// An empty arena whose segments are named after `label` and are at
    /// most `largest` bytes (a block larger than that gets a segment of its
    /// own size).
    pub fn new(label: &str, largest: usize, budget: Arc<Budget>) -> Self {
        Self(Arc::new(Inner {
            label: label.to_owned(),
            largest: largest.max(FIRST_SEGMENT),
            budget,
            parts: Mutex::new(Vec::new()),
        }))
    }

    /// A slot of `len` bytes, or `None` when no segment has room and the
    /// budget allows no new one (or the kernel refused one: logged by the
    /// caller through the error-free `None`, see [`Arena::try_alloc`]).
    pub fn alloc(&self, len: usize) -> Option<SlotMut> {
        self.try_alloc(len).ok().flatten()
    }

    /// [`Arena::alloc`], with the kernel's error when creating a segment
    /// failed (`memfd_create` refused by a sandbox, no memory).
    pub fn try_alloc(&self, len: usize) -> std::io::Result<Option<SlotMut>> {
        let want = len.max(1).next_multiple_of(page());
        let mut parts = self.0.parts.lock();
        for p in parts.iter_mut() {
            if p.free_bytes < want {
                continue;
            }
            let hit = p
                .free
                .iter()
                .find(|&(_, &l)| l >= want)
                .map(|(&o, &l)| (o, l));
            if let Some((off, l)) = hit {
                p.free.remove(&off);
                if l > want {
                    p.free.insert(off + want, l - want);
                }
                p.free_bytes -= want;
                return Ok(Some(self.slot(p.seg.clone(), off, want, len)));
            }
        }
        let next = parts
            .last()
            .map_or(FIRST_SEGMENT, |p| p.seg.len().saturating_mul(2))
            .min(self.0.largest)
            .max(want);
        if !self.0.budget.take(next as u64) {
            return Ok(None);
        }
        let seg = match Segment::create(&self.0.label, next, Sharing::ReadOnly) {
            Ok(s) => Arc::new(s),
            Err(e) => {
                self.0.budget.give(next as u64);
                return Err(e);
            }
        };
        let size = seg.len();
        let mut free = BTreeMap::new();
        if size > want {
            free.insert(want, size - want);
        }
        parts.push(Part {
            seg: seg.clone(),
            free,
            free_bytes: size - want,
        });
        Ok(Some(self.slot(seg, 0, want, len)))
    }

    fn slot(&self, seg: Arc<Segment>, off: usize, span: usize, len: usize) -> SlotMut {
        SlotMut {
            slot: Slot {
                arena: self.0.clone(),
                seg,
                off,
                span,
                len,
            },
        }
    }

    /// The segment holding `bytes` and their offset in it, when they lie
    /// in this arena.
    pub fn locate(&self, bytes: &[u8]) -> Option<(Arc<Segment>, usize)> {
        let parts = self.0.parts.lock();
        parts
            .iter()
            .find_map(|p| p.seg.offset_of(bytes).map(|o| (p.seg.clone(), o)))
    }

    /// The segment with this id, when it is one of this arena's.
    pub fn segment(&self, id: u64) -> Option<Arc<Segment>> {
        let parts = self.0.parts.lock();
        parts
            .iter()
            .find(|p| p.seg.id() == id)
            .map(|p| p.seg.clone())
    }

    /// Retires every segment with no slot in use; the bytes given back.
    pub fn reclaim(&self) -> u64 {
        let mut parts = self.0.parts.lock();
        let before = parts.len();
        let mut freed = 0u64;
        parts.retain(|p| {
            let empty = p.free_bytes == p.seg.len();
            if empty {
                freed += p.seg.len() as u64;
            }
            !empty
        });
        if parts.len() < before {
            self.0.budget.give(freed);
        }
        freed
    }

    /// Bytes of its segments, and bytes free in them.
    pub fn usage(&self) -> (u64, u64) {
        let parts = self.0.parts.lock();
        parts.iter().fold((0, 0), |(a, f), p| {
            (a + p.seg.len() as u64, f + p.free_bytes as u64)
        })
    }
}

impl Inner {
    fn free(&self, seg: u64, off: usize, span: usize) {
        let mut parts = self.parts.lock();
        let Some(p) = parts.iter_mut().find(|p| p.seg.id() == seg) else {
            return;
        };
        p.free_bytes += span;
        let (mut off, mut span) = (off, span);
        // Coalesced with the free range just before and just after.
        if let Some((&o, &l)) = p.free.range(..off).next_back()
            && o + l == off
        {
            p.free.remove(&o);
            off = o;
            span += l;
        }
        if let Some(&l) = p.free.get(&(off + span)) {
            p.free.remove(&(off + span));
            span += l;
        }
        p.free.insert(off, span);
    }
}

/// A range of a segment, owned: given back to its arena on drop.
struct Slot {
    arena: Arc<Inner>,
    seg: Arc<Segment>,
    off: usize,
    /// Page-rounded length taken from the free list.
    span: usize,
    /// The payload's length.
    len: usize,
}

impl AsRef<[u8]> for Slot {
    fn as_ref(&self) -> &[u8] {
        self.seg.map().slice(self.off, self.len)
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.arena.free(self.seg.id(), self.off, self.span);
    }
}

/// A slot being filled: writable until [`SlotMut::freeze`].
pub struct SlotMut {
    slot: Slot,
}

impl SlotMut {
    /// Its bytes, to fill (nothing else can see them yet).
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        self.slot.seg.map().slice_mut(self.slot.off, self.slot.len)
    }

    /// The segment it is in.
    pub fn segment(&self) -> &Arc<Segment> {
        &self.slot.seg
    }

    /// Its offset in the segment.
    pub fn offset(&self) -> usize {
        self.slot.off
    }

    /// The filled slot as a payload: immutable from now on, given back to
    /// the arena when its last `Bytes` is dropped.
    pub fn freeze(self) -> Bytes {
        Bytes::from_owner(self.slot)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_reused_only_after_their_last_bytes_drop() {
        let a = Arena::new("t", 8 << 20, Budget::new(64 << 20));
        let mut s = a.alloc(1 << 20).unwrap();
        s.bytes_mut().fill(7);
        let (seg, off) = (s.segment().id(), s.offset());
        let b = s.freeze();
        let held = b.clone();
        drop(b);
        // Still held: a new slot must not land on it.
        let mut t = a.alloc(1 << 20).unwrap();
        assert!(!(t.segment().id() == seg && t.offset() == off));
        t.bytes_mut().fill(9);
        assert!(held.iter().all(|&x| x == 7));
        drop(held);
        let u = a.alloc(1 << 20).unwrap();
        assert_eq!(
            (u.segment().id(), u.offset()),
            (seg, off),
            "freed range reused first"
        );
    }

    #[test]
    fn the_budget_bounds_every_arena_together() {
        let budget = Budget::new(8 << 20);
        let a = Arena::new("a", 4 << 20, budget.clone());
        let b = Arena::new("b", 4 << 20, budget.clone());
        let _x = a.alloc(4 << 20).unwrap();
        let _y = b.alloc(4 << 20).unwrap();
        assert!(a.alloc(4096).is_none() && b.alloc(4096).is_none());
        assert_eq!(budget.used(), 8 << 20);
    }

    #[test]
    fn reclaim_retires_empty_segments_only() {
        let budget = Budget::new(64 << 20);
        let a = Arena::new("t", 4 << 20, budget.clone());
        let mut x: Vec<Bytes> = (0..3).map(|_| a.alloc(4 << 20).unwrap().freeze()).collect();
        assert_eq!(budget.used(), 12 << 20);
        let kept = x.pop().unwrap();
        let ids: Vec<u64> = x.iter().map(|b| a.locate(b).unwrap().0.id()).collect();
        drop(x);
        assert_eq!(
            a.usage(),
            (12 << 20, 8 << 20),
            "empty segments stay until reclaimed"
        );
        assert_eq!(a.reclaim(), 8 << 20);
        assert!(ids.iter().all(|&id| a.segment(id).is_none()), "retired");
        assert_eq!((a.usage(), budget.used()), ((4 << 20, 0), 4 << 20));
        assert!(
            a.locate(&kept).is_some(),
            "a segment with a slot in use stays"
        );
    }

    #[test]
    fn free_ranges_coalesce() {
        let a = Arena::new("t", 4 << 20, Budget::new(4 << 20));
        let slots: Vec<Bytes> = (0..4).map(|_| a.alloc(1 << 20).unwrap().freeze()).collect();
        drop(slots);
        assert_eq!(a.usage(), (4 << 20, 4 << 20));
        assert!(
            a.alloc(4 << 20).is_some(),
            "the whole segment in one piece again"
        );
    }

    #[test]
    fn locate_finds_a_frozen_slot_and_nothing_else() {
        let a = Arena::new("t", 4 << 20, Budget::new(4 << 20));
        let b = a.alloc(100).unwrap().freeze();
        let (seg, off) = a.locate(&b).unwrap();
        assert_eq!((seg.len(), off), (4 << 20, 0));
        assert!(a.locate(&[0u8; 100]).is_none());
    }
}
