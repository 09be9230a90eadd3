//! Which blocks are written down to the disk tier and to the object store
//! (docs/cache-choice.md, "Admission to the lower tiers").
//!
//! Every engine save stores every full block it computed, and most prompts
//! are never seen again: written through, each of them costs a disk write
//! and an object PUT (billed) that nobody reads back. An admission policy
//! keeps a block in memory only until it is *used* a second time (read, or
//! written again), and writes it down then:
//!
//! * [`Admission::All`]: every block, at its first write (the default; what
//!   the write policies alone did before);
//! * [`Admission::Reuse`]: a block whose second use comes while the engine
//!   still remembers its first (exact, per block; the memory of first uses is
//!   bounded, the oldest forgotten first);
//! * [`Admission::Frequency`]: a TinyLFU-style frequency sketch (a doorkeeper
//!   Bloom filter and a count-min sketch of counters capped at 15, halved every
//!   `10 × capacity` uses, so what counts is recent frequency): a block is
//!   admitted once its estimated uses reach 2, even if memory dropped it in
//!   between, which the exact memory of `Reuse` cannot know.
//!
//! Uses are counted per [`BlockId`] by its 64-bit hash; a collision can only
//! admit a block early, never lose one.
use crate::block::BlockId;
use crate::error::{Error, Result};
use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::hash::{Hash, Hasher};
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};

/// Which blocks a lower tier takes, and when.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Admission {
    /// Every block, at its first write.
    #[default]
    All,
    /// A block at its second use (read or re-write).
    Reuse,
    /// A block once a frequency sketch estimates two uses.
    Frequency,
}

impl Admission {
    /// The config name.
    pub fn name(self) -> &'static str {
        match self {
            Admission::All => "all",
            Admission::Reuse => "reuse",
            Admission::Frequency => "tinylfu",
        }
    }
}

impl FromStr for Admission {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "all" => Ok(Admission::All),
            "reuse" => Ok(Admission::Reuse),
            "tinylfu" => Ok(Admission::Frequency),
            _ => Err(Error::invalid(format!(
                "unknown admission policy {s:?}; expected all, reuse or tinylfu"
            ))),
        }
    }
}

impl std::fmt::Display for Admission {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Uses a policy needs before it admits a block.
const ADMIT_AT: u32 = 2;

/// Counters of one tier's admission.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AdmissionStats {
    /// Blocks written down to the tier (every write down under `all`).
    pub admitted: u64,
    /// Their payload bytes.
    pub admitted_bytes: u64,
    /// Writes whose block was kept in memory only (not yet admitted).
    pub deferred: u64,
    /// Blocks that left memory without being admitted: never written down.
    pub rejected: u64,
}

/// One lower tier's admission policy and what it remembers of uses.
pub struct Admitter {
    policy: Admission,
    state: State,
    admitted: AtomicU64,
    admitted_bytes: AtomicU64,
    deferred: AtomicU64,
    rejected: AtomicU64,
}

enum State {
    All,
    /// Blocks used once, and blocks admitted, each oldest first and at most
    /// `capacity`.
    Reuse {
        once: Mutex<Fifo>,
        admitted: Mutex<Fifo>,
    },
    Frequency(Mutex<Sketch>),
}

/// What a use of a block decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Not admitted: the block stays in memory only.
    Deferred,
    /// Admitted by this use: write it down now.
    Admit,
    /// Admitted by an earlier use.
    Admitted,
}

impl Decision {
    /// Whether the block may be written down.
    pub fn admitted(self) -> bool {
        self != Decision::Deferred
    }
}

impl Admitter {
    /// A policy remembering about `capacity` blocks' uses (the number of
    /// blocks the tier above holds is a good size).
    pub fn new(policy: Admission, capacity: usize) -> Self {
        let capacity = capacity.max(64);
        let state = match policy {
            Admission::All => State::All,
            Admission::Reuse => State::Reuse {
                once: Mutex::new(Fifo::new(capacity)),
                admitted: Mutex::new(Fifo::new(capacity)),
            },
            Admission::Frequency => State::Frequency(Mutex::new(Sketch::new(capacity))),
        };
        Self {
            policy,
            state,
            admitted: AtomicU64::new(0),
            admitted_bytes: AtomicU64::new(0),
            deferred: AtomicU64::new(0),
            rejected: AtomicU64::new(0),
        }
    }

    /// The policy.
    pub fn policy(&self) -> Admission {
        self.policy
    }

    /// Counts a use of `id` (a write or a read): whether the block is now
    /// admitted, and whether this use admitted it.
    pub fn record(&self, id: &BlockId) -> Decision {
        match &self.state {
            State::All => Decision::Admit,
            State::Reuse { once, admitted } => {
                let h = hash(id);
                if admitted.lock().contains(h) {
                    return Decision::Admitted;
                }
                if once.lock().remove(h) {
                    admitted.lock().insert(h);
                    return Decision::Admit;
                }
                once.lock().insert(h);
                Decision::Deferred
            }
            State::Frequency(s) => match s.lock().increment(hash(id)) {
                n if n < ADMIT_AT => Decision::Deferred,
                n if n == ADMIT_AT => Decision::Admit,
                _ => Decision::Admitted,
            },
        }
    }

    /// Whether `id` is admitted now, without counting a use.
    pub fn admits(&self, id: &BlockId) -> bool {
        match &self.state {
            State::All => true,
            State::Reuse { admitted, .. } => admitted.lock().contains(hash(id)),
            State::Frequency(s) => s.lock().estimate(hash(id)) >= ADMIT_AT,
        }
    }

    /// Counts a block of `bytes` written down to the tier.
    pub fn note_admitted(&self, bytes: u64) {
        self.admitted.fetch_add(1, Ordering::Relaxed);
        self.admitted_bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Counts a write kept in memory only.
    pub fn note_deferred(&self) {
        self.deferred.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a block that left memory without being admitted.
    pub fn note_rejected(&self) {
        self.rejected.fetch_add(1, Ordering::Relaxed);
    }

    /// Counters.
    pub fn stats(&self) -> AdmissionStats {
        AdmissionStats {
            admitted: self.admitted.load(Ordering::Relaxed),
            admitted_bytes: self.admitted_bytes.load(Ordering::Relaxed),
            deferred: self.deferred.load(Ordering::Relaxed),
            rejected: self.rejected.load(Ordering::Relaxed),
        }
    }
}

/// A set of block hashes that forgets its oldest past `capacity`.
///
/// Each insertion is stamped, and `order` holds (hash, stamp): a hash
/// removed and inserted again leaves its old entry behind, which must not
/// make the set forget the new one when it reaches the front.
struct Fifo {
    live: HashMap<u64, u64>,
    order: VecDeque<(u64, u64)>,
    next: u64,
    capacity: usize,
}

impl Fifo {
    fn new(capacity: usize) -> Self {
        Self {
            live: HashMap::new(),
            order: VecDeque::new(),
            next: 0,
            capacity,
        }
    }

    fn contains(&self, h: u64) -> bool {
        self.live.contains_key(&h)
    }

    fn remove(&mut self, h: u64) -> bool {
        self.live.remove(&h).is_some()
    }

    fn insert(&mut self, h: u64) {
        if let std::collections::hash_map::Entry::Vacant(e) = self.live.entry(h) {
            e.insert(self.next);
            self.order.push_back((h, self.next));
            self.next += 1;
        }
        while self.live.len() > self.capacity {
            match self.order.pop_front() {
                Some((old, stamp)) if self.live.get(&old) == Some(&stamp) => {
                    self.live.remove(&old);
                }
                Some(_) => {} // a removed or re-inserted hash's old entry
                None => break,
            }
        }
        // Removals leave entries behind; drop them once they are half the queue.
        if self.order.len() > 2 * self.capacity.max(1) {
            let live = &self.live;
            self.order.retain(|(h, s)| live.get(h) == Some(s));
        }
    }
}

fn hash(id: &BlockId) -> u64 {
    // SipHash with fixed keys: the same block hashes alike in every call.
    let mut h = std::hash::DefaultHasher::new();
    id.hash(&mut h);
    h.finish()
}

/// TinyLFU's frequency sketch: a doorkeeper Bloom filter (a first use only
/// sets its three bits; 8 bits per remembered block, so about 0.5 % of
/// one-time blocks pass as seen at a full window) in front of a count-min
/// sketch of four rows of counters capped at 15 (a byte each);
/// every `10 × width` increments all counters are halved and the doorkeeper
/// cleared, so old uses fade (Einziger, Friedman, Manes: "TinyLFU", 2017).
struct Sketch {
    door: Vec<u64>,
    door_mask: usize,
    rows: [Vec<u8>; 4],
    mask: usize,
    added: usize,
    reset_at: usize,
}

impl Sketch {
    fn new(capacity: usize) -> Self {
        let width = capacity.next_power_of_two();
        Self {
            door: vec![0; 8 * width / 64],
            door_mask: 8 * width - 1,
            rows: std::array::from_fn(|_| vec![0; width]),
            mask: width - 1,
            added: 0,
            reset_at: 10 * width,
        }
    }

    fn slot(&self, h: u64, row: usize) -> usize {
        let x = h.rotate_left(16 * row as u32) ^ (row as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        (x.wrapping_mul(0xff51_afd7_ed55_8ccd) >> 20) as usize & self.mask
    }

    /// The doorkeeper's three bits of `h` (word, mask).
    fn door_bits(&self, h: u64) -> [(usize, u64); 3] {
        std::array::from_fn(|k| {
            let i = (h
                .rotate_left(21 * k as u32)
                .wrapping_mul(0x9e37_79b9_7f4a_7c15)
                >> 17) as usize
                & self.door_mask;
            (i / 64, 1 << (i % 64))
        })
    }

    fn seen(&self, h: u64) -> bool {
        self.door_bits(h)
            .iter()
            .all(|&(w, bit)| self.door[w] & bit != 0)
    }

    fn estimate(&self, h: u64) -> u32 {
        if !self.seen(h) {
            return 0;
        }
        let min = (0..4)
            .map(|r| self.rows[r][self.slot(h, r)])
            .min()
            .unwrap_or(0);
        1 + u32::from(min)
    }

    /// Counts a use; returns the estimate after it.
    fn increment(&mut self, h: u64) -> u32 {
        if !self.seen(h) {
            for (w, bit) in self.door_bits(h) {
                self.door[w] |= bit;
            }
        } else {
            for r in 0..4 {
                let i = self.slot(h, r);
                self.rows[r][i] = (self.rows[r][i] + 1).min(15);
            }
        }
        self.added += 1;
        if self.added >= self.reset_at {
            self.added = 0;
            self.door.iter_mut().for_each(|w| *w = 0);
            for row in &mut self.rows {
                row.iter_mut().for_each(|c| *c /= 2);
            }
        }
        self.estimate(h)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::{Key, Namespace};

    fn id(i: u32) -> BlockId {
        BlockId::new(
            Namespace::new("n").unwrap(),
            Key::new(i.to_be_bytes().to_vec()).unwrap(),
        )
    }

    use Decision::*;

    #[test]
    fn all_admits_at_the_first_use() {
        let a = Admitter::new(Admission::All, 100);
        assert_eq!(a.record(&id(1)), Admit);
        assert!(a.admits(&id(2)));
    }

    #[test]
    fn reuse_admits_at_the_second_use_and_forgets_the_oldest_first_uses() {
        let a = Admitter::new(Admission::Reuse, 64);
        assert_eq!(a.record(&id(1)), Deferred, "a first use is not admitted");
        assert!(!a.admits(&id(1)));
        assert_eq!(a.record(&id(1)), Admit, "a second use is");
        assert_eq!(a.record(&id(1)), Admitted, "and stays admitted");
        assert!(a.admits(&id(1)));
        for i in 100..100 + 64 {
            assert_eq!(a.record(&id(i)), Deferred);
        }
        assert_eq!(a.record(&id(2)), Deferred);
        // 65 first uses in a 64-entry memory: the oldest (100) is forgotten.
        assert_eq!(a.record(&id(100)), Deferred, "forgotten: a first use again");
        assert_eq!(a.record(&id(2)), Admit);
    }

    #[test]
    fn a_hash_removed_and_inserted_again_is_forgotten_only_in_its_new_turn() {
        let mut f = Fifo::new(3);
        f.insert(1);
        assert!(f.remove(1));
        f.insert(2);
        f.insert(3);
        f.insert(1); // again: its first entry is still at the front
        f.insert(4); // one over capacity: the oldest live one (2) goes
        assert!(
            f.contains(1),
            "the re-inserted hash was forgotten by its old entry"
        );
        assert!(!f.contains(2));
        assert!(f.contains(3) && f.contains(4));
        // Many removals keep the queue bounded.
        for i in 10..1000 {
            f.insert(i);
            f.remove(i);
        }
        assert!(f.order.len() <= 6, "{} entries queued", f.order.len());
    }

    #[test]
    fn the_sketch_admits_what_it_saw_twice_and_forgets_with_age() {
        let a = Admitter::new(Admission::Frequency, 1024);
        assert_eq!(a.record(&id(1)), Deferred);
        assert!(!a.admits(&id(1)));
        assert_eq!(a.record(&id(1)), Admit, "seen twice");
        assert!(a.admits(&id(1)));
        // One-hit wonders are not admitted (a few may collide: rarely).
        let early = (1000..1500)
            .filter(|&i| a.record(&id(i)).admitted())
            .count();
        assert!(early < 10, "{early} of 500 single uses admitted");
        // After 10 × width further uses the doorkeeper is cleared.
        for i in 0..(10 * 1024) {
            a.record(&id(1_000_000 + i));
        }
        assert!(!a.admits(&id(1000)), "an old single use has faded");
    }

    #[test]
    fn names_round_trip_and_unknown_ones_are_refused() {
        for p in [Admission::All, Admission::Reuse, Admission::Frequency] {
            assert_eq!(p.name().parse::<Admission>().unwrap(), p);
        }
        let e = "lru".parse::<Admission>().unwrap_err();
        assert!(e.message.contains("all, reuse or tinylfu"), "{}", e.message);
    }
}
