//! The prefix-closed block index both local tiers keep: which blocks are
//! resident, their chain links, LRU order, expiry and pins. The memory tier
//! stores whole blocks in it, the disk tier the location of each record.
//!
//! ```text
//!   map:     BlockId -> Slot { value, cost, parent, tick, children, pin, expiry }
//!   groups:  tenant -> bytes, leaves: tick -> BlockId  (no resident child;
//!            LRU eviction order within a tenant; crate::shares picks the tenant)
//!   expiry:  (deadline, tick) -> BlockId
//!   orphans: parent BlockId -> [child keys]  (children inserted before their parent)
//!   held:    parents of writes in flight (never evicted)
//! ```
//!
//! Only unpinned, unheld *leaves* (blocks none of whose children are resident)
//! are eviction candidates, least recently used first within the tenant whose
//! turn it is ([`crate::shares`]: the most over its capacity share), so a
//! chain is always eaten from its tail: a parent is never evicted while one of its children is
//! resident. Removing a block for any other reason (delete, expiry) removes its
//! resident descendants too. Together these keep the resident set prefix-closed,
//! which is what makes "how many leading blocks exist" a correct cache answer.
//!
//! The expiry clock is the caller's (`D`): the memory tier uses tokio's
//! `Instant` (pausable in tests, immune to wall-clock steps); the disk tier uses
//! Unix milliseconds, because its records outlive the process. Pins are always
//! tokio `Instant`s: leases never outlive the process.
//!
//! Everything here is in-memory and synchronous; callers hold their own lock
//! and act on what removals hand back (demote blocks, unlink files) outside it.
use crate::block::BlockId;
use crate::keys::{Key, Namespace};
use crate::shares::{Groups, ShareStat, Shares};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use tokio::time::Instant;

/// What the index needs to know about a stored value.
pub(crate) trait Node {
    /// Bytes charged against the tier's capacity.
    fn cost(&self) -> u64;
    /// The key of the previous block in the chain, if any.
    fn parent(&self) -> Option<&Key>;
}

struct Slot<V, D> {
    value: V,
    cost: u64,
    /// Its tenant's key in `groups`.
    group: Arc<str>,
    /// Last access; also this slot's position in its group's leaves while it
    /// is a leaf.
    tick: u64,
    /// Keys of resident children (same namespace).
    children: Vec<Key>,
    pinned_until: Option<Instant>,
    /// Position in `expiry`, if the block has a deadline.
    expiry: Option<(D, u64)>,
    /// Its parent is itself or one of its resident descendants (a cycle no
    /// honest chain hash makes: a buggy or hostile writer's). The link to
    /// the parent is left out of the index, so the chain stays a tree and
    /// its blocks stay evictable; otherwise no block of the cycle would
    /// ever be a leaf and the cycle would hold its bytes for good.
    detached: bool,
}

impl<V: Node, D> Slot<V, D> {
    /// The parent this slot is linked to (or waits for as an orphan).
    fn linked_parent(&self) -> Option<&Key> {
        if self.detached {
            None
        } else {
            self.value.parent()
        }
    }
    fn is_leaf(&self) -> bool {
        self.children.is_empty()
    }
    fn pinned(&self, now: Instant) -> bool {
        self.pinned_until.is_some_and(|p| p > now)
    }
}

/// Result of [`ChainIndex::lookup`].
pub(crate) enum Found<'a, V> {
    /// Present and live.
    Live(&'a V),
    /// Not present.
    Missing,
    /// Present but expired: removed now, with its descendants (returned).
    Expired(Vec<(BlockId, V)>),
}

/// Counters a tier reports in its [`crate::tier::TierStats`].
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Counters {
    pub hits: u64,
    pub misses: u64,
    pub evictions: u64,
    pub expirations: u64,
}

/// See the module docs.
pub(crate) struct ChainIndex<V, D> {
    map: HashMap<BlockId, Slot<V, D>>,
    groups: Groups,
    expiry: BTreeMap<(D, u64), BlockId>,
    orphans: HashMap<BlockId, Vec<Key>>,
    held: HashMap<BlockId, u32>,
    bytes: u64,
    tick: u64,
    pub counters: Counters,
    /// Told of every insert and removal (KV events, `docs/events.md`):
    /// these two functions are the only places residency changes.
    observer: Option<Observer>,
}

/// Called with `true` and the block's parent when a block becomes resident,
/// `false` when it leaves. Runs under the tier's lock, so it must only hand
/// the change on.
pub(crate) type Observer = Arc<dyn Fn(bool, &BlockId, Option<&Key>) + Send + Sync>;

impl<V, D> Default for ChainIndex<V, D> {
    fn default() -> Self {
        Self::new(Arc::new(Shares::default()))
    }
}

impl<V, D> ChainIndex<V, D> {
    /// An empty index dividing its tier per `shares`.
    pub fn new(shares: Arc<Shares>) -> Self {
        Self {
            map: HashMap::new(),
            groups: Groups::new(shares),
            expiry: BTreeMap::new(),
            orphans: HashMap::new(),
            held: HashMap::new(),
            bytes: 0,
            tick: 0,
            counters: Counters::default(),
            observer: None,
        }
    }

    /// Reports every later insert and removal to `o`.
    pub fn observe(&mut self, o: Observer) {
        self.observer = Some(o);
    }
}

impl<V: Node, D: Ord + Copy> ChainIndex<V, D> {
    /// Every resident id with its parent (to announce what a tier held
    /// before it was observed).
    pub fn ids(&self) -> Vec<(BlockId, Option<Key>)> {
        self.map
            .iter()
            .map(|(id, s)| (id.clone(), s.value.parent().cloned()))
            .collect()
    }

    /// Resident blocks.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Bytes charged by resident blocks.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The value under `id`, expired or not, without touching recency.
    pub fn get(&self, id: &BlockId) -> Option<&V> {
        self.map.get(id).map(|s| &s.value)
    }

    /// Looks `id` up at `now`, refreshing its recency if `touch`. An expired
    /// block is removed with its descendants and counted as expired.
    pub fn lookup(&mut self, id: &BlockId, now: D, touch: bool) -> Found<'_, V> {
        let Some(s) = self.map.get(id) else {
            return Found::Missing;
        };
        if s.expiry.is_some_and(|(t, _)| t <= now) {
            let removed = self.remove_cascade(id);
            self.counters.expirations += removed.len() as u64;
            return Found::Expired(removed);
        }
        if touch {
            self.tick += 1;
            let tick = self.tick;
            let s = self.map.get_mut(id).expect("present");
            let old = std::mem::replace(&mut s.tick, tick);
            if s.is_leaf() {
                self.groups.remove_leaf(&s.group, old);
                self.groups.add_leaf(&s.group, tick, id.clone());
            }
        }
        Found::Live(&self.map[id].value)
    }

    /// Inserts a block (the id must not be present), linking it to a resident
    /// parent or recording it as that parent's orphan, and adopting its own
    /// orphans. Does not evict: see [`ChainIndex::evict_until`].
    pub fn insert(&mut self, id: BlockId, value: V, expires: Option<D>) {
        debug_assert!(!self.map.contains_key(&id), "{id:?} inserted twice");
        self.tick += 1;
        let tick = self.tick;
        let expiry = expires.map(|t| (t, tick));
        if let Some(k) = expiry {
            self.expiry.insert(k, id.clone());
        }
        let children = self.orphans.remove(&id).unwrap_or_default();
        let detached = value
            .parent()
            .is_some_and(|p| self.closes_a_cycle(&id, p, !children.is_empty()));
        if let Some(parent) = value.parent().filter(|_| !detached) {
            let pid = BlockId::new(id.namespace.clone(), parent.clone());
            match self.map.get_mut(&pid) {
                Some(p) => {
                    if p.is_leaf() {
                        self.groups.remove_leaf(&p.group, p.tick);
                    }
                    p.children.push(id.key.clone());
                }
                None => self.orphans.entry(pid).or_default().push(id.key.clone()),
            }
        }
        let group = self.groups.key_for(&id);
        let slot = Slot {
            cost: value.cost(),
            group,
            value,
            tick,
            children,
            pinned_until: None,
            expiry,
            detached,
        };
        self.groups.charge(&slot.group, slot.cost, true);
        if slot.is_leaf() {
            self.groups.add_leaf(&slot.group, tick, id.clone());
        }
        self.bytes += slot.cost;
        if let Some(o) = &self.observer {
            o(true, &id, slot.value.parent());
        }
        self.map.insert(id, slot);
    }

    /// Whether linking `id` (about to be inserted, with resident children iff
    /// `has_children`) under `parent` would close a cycle: `parent` is `id`
    /// itself or one of its resident descendants. Walks up from `parent`
    /// (the index is a forest, so the walk ends); only blocks inserted after
    /// their children, which are rare, pay for it.
    fn closes_a_cycle(&self, id: &BlockId, parent: &Key, has_children: bool) -> bool {
        if *parent == id.key {
            return true;
        }
        if !has_children {
            return false;
        }
        let mut cur = BlockId::new(id.namespace.clone(), parent.clone());
        while let Some(s) = self.map.get(&cur) {
            match s.linked_parent() {
                Some(p) if *p == id.key => return true,
                Some(p) => cur = BlockId::new(id.namespace.clone(), p.clone()),
                None => return false,
            }
        }
        false
    }

    /// Protects `id` from eviction (the parent of a write in flight); counted,
    /// so every call needs one [`ChainIndex::release`].
    pub fn hold(&mut self, id: &BlockId) {
        *self.held.entry(id.clone()).or_default() += 1;
    }

    /// Undoes one [`ChainIndex::hold`].
    pub fn release(&mut self, id: &BlockId) {
        if let Some(n) = self.held.get_mut(id) {
            *n -= 1;
            if *n == 0 {
                self.held.remove(id);
            }
        }
    }

    /// Evicts least recently used leaves that are not pinned at `now`, not
    /// held and not `protect`, until `fits(resident bytes)` holds, taking
    /// them from the tenants most over their capacity share and never from
    /// one below the writer's (`writer`: the namespace written and the bytes
    /// it adds that are not inserted yet; see [`crate::shares`]). On success
    /// returns the evicted blocks; if no candidate is left, returns the ones
    /// evicted so far in `Err` (they stay evicted).
    #[allow(clippy::type_complexity)]
    pub fn evict_until(
        &mut self,
        fits: impl Fn(u64) -> bool,
        protect: Option<&BlockId>,
        writer: Option<(&Namespace, u64)>,
        now: Instant,
    ) -> Result<Vec<(BlockId, V)>, Vec<(BlockId, V)>> {
        let mut out = Vec::new();
        let writer = writer.map(|(ns, pending)| (ns.as_str(), pending));
        while !fits(self.bytes) {
            // Oldest leaf first. Removing a leaf may turn its parent into a
            // leaf with an older tick, so the scan restarts each time.
            let (map, held) = (&self.map, &self.held);
            let victim = self.groups.victim(writer, |id| {
                Some(id) != protect
                    && !held.contains_key(id)
                    && !map.get(id).is_some_and(|s| s.pinned(now))
            });
            let Some(id) = victim else { return Err(out) };
            out.extend(self.remove_cascade(&id));
            self.counters.evictions += 1;
        }
        Ok(out)
    }

    /// Removes every block whose deadline is at or before `now`, with its
    /// descendants; returns them.
    pub fn purge_expired(&mut self, now: D) -> Vec<(BlockId, V)> {
        let mut out = Vec::new();
        while let Some((&(t, _), _)) = self.expiry.first_key_value() {
            if t > now {
                break;
            }
            let (_, id) = self.expiry.pop_first().expect("non-empty");
            out.extend(self.remove_cascade(&id));
        }
        self.counters.expirations += out.len() as u64;
        out
    }

    /// Pins resident blocks until `until` (a later pin already in place
    /// stays); returns how many were resident.
    pub fn pin(&mut self, ids: &[BlockId], until: Instant) -> usize {
        let mut n = 0;
        for id in ids {
            if let Some(s) = self.map.get_mut(id) {
                s.pinned_until = Some(s.pinned_until.map_or(until, |p| p.max(until)));
                n += 1;
            }
        }
        n
    }

    /// Lifts the pins that end exactly at `until` (placed by the lease being
    /// released; a pin a later lease extended ends later and stays).
    pub fn unpin(&mut self, ids: &[BlockId], until: Instant) {
        for id in ids {
            if let Some(s) = self.map.get_mut(id)
                && s.pinned_until == Some(until)
            {
                s.pinned_until = None;
            }
        }
    }

    /// Bytes pinned at `now`.
    pub fn pinned_bytes(&self, now: Instant) -> u64 {
        self.map
            .values()
            .filter(|s| s.pinned(now))
            .map(|s| s.cost)
            .sum()
    }

    /// What pinning `ids` in order holds here, per id (see
    /// [`crate::lease::chain_costs`]).
    pub fn pin_costs(&self, ids: &[BlockId]) -> Vec<u64> {
        crate::lease::chain_costs(ids, |id| {
            self.map
                .get(id)
                .map(|s| (s.cost, s.value.parent().cloned()))
        })
    }

    /// Resident bytes and evictions per share label (see [`crate::shares`]).
    pub fn share_stats(&self) -> Vec<ShareStat> {
        self.groups.stats()
    }

    /// Bytes resident in the capacity-share group of `ns`.
    pub fn group_bytes(&self, ns: &Namespace) -> u64 {
        self.groups.bytes_of(ns.as_str())
    }

    /// Removes `id` and its resident descendants. The result lists
    /// descendants before ancestors, so acting on it in order (unlinking
    /// files) never leaves a child without its parent.
    pub fn remove_cascade(&mut self, id: &BlockId) -> Vec<(BlockId, V)> {
        let mut stack = vec![id.clone()];
        let mut out = Vec::new();
        while let Some(cur) = stack.pop() {
            let Some(s) = self.map.remove(&cur) else {
                continue;
            };
            self.bytes -= s.cost;
            if s.is_leaf() {
                self.groups.remove_leaf(&s.group, s.tick);
            }
            self.groups.charge(&s.group, s.cost, false);
            if let Some(k) = s.expiry {
                self.expiry.remove(&k);
            }
            for c in &s.children {
                stack.push(BlockId::new(cur.namespace.clone(), c.clone()));
            }
            // Children pushed above are removed after us; unlink from our
            // parent only if the parent stays (it is not part of this cascade).
            if let Some(p) = s.linked_parent() {
                let pid = BlockId::new(cur.namespace.clone(), p.clone());
                if let Some(ps) = self.map.get_mut(&pid) {
                    ps.children.retain(|k| k != &cur.key);
                    if ps.children.is_empty() {
                        self.groups.add_leaf(&ps.group, ps.tick, pid);
                    }
                } else if let Some(o) = self.orphans.get_mut(&pid) {
                    o.retain(|k| k != &cur.key);
                    if o.is_empty() {
                        self.orphans.remove(&pid);
                    }
                }
            }
            if let Some(o) = &self.observer {
                o(false, &cur, None);
            }
            out.push((cur, s.value));
        }
        out.reverse();
        out
    }

    /// Checks the structural invariants (used by tests): byte accounting, the
    /// leaf set, the expiry index, and the parent/child links (every block
    /// with a parent is either linked to its resident parent or recorded as
    /// that parent's orphan, never both).
    pub fn check_invariants(&self) -> Result<(), String> {
        let bytes: u64 = self.map.values().map(|s| s.cost).sum();
        if bytes != self.bytes {
            return Err(format!("byte count {} != sum {bytes}", self.bytes));
        }
        for (id, s) in &self.map {
            if s.cost != s.value.cost() {
                return Err(format!(
                    "{id:?}: charged {} != cost {}",
                    s.cost,
                    s.value.cost()
                ));
            }
            let in_leaves = self.groups.leaf(&s.group, s.tick) == Some(id);
            if s.is_leaf() != in_leaves {
                return Err(format!(
                    "{id:?}: leaf={} in_leaves={in_leaves}",
                    s.is_leaf()
                ));
            }
            if let Some(k) = &s.expiry
                && self.expiry.get(k) != Some(id)
            {
                return Err(format!("{id:?}: missing from the expiry index"));
            }
            for c in &s.children {
                let cid = BlockId::new(id.namespace.clone(), c.clone());
                match self.map.get(&cid) {
                    Some(ch) if ch.linked_parent() == Some(&id.key) => {}
                    _ => return Err(format!("{id:?} lists non-resident child {c:?}")),
                }
            }
            if s.detached {
                let p = s
                    .value
                    .parent()
                    .ok_or(format!("{id:?}: detached, no parent"))?;
                let pid = BlockId::new(id.namespace.clone(), p.clone());
                let linked = self
                    .map
                    .get(&pid)
                    .is_some_and(|ps| ps.children.contains(&id.key));
                if linked || self.orphans.get(&pid).is_some_and(|o| o.contains(&id.key)) {
                    return Err(format!("{id:?}: detached but linked"));
                }
            }
            if let Some(p) = s.linked_parent() {
                let pid = BlockId::new(id.namespace.clone(), p.clone());
                let linked = self
                    .map
                    .get(&pid)
                    .is_some_and(|ps| ps.children.contains(&id.key));
                let orphan = self.orphans.get(&pid).is_some_and(|o| o.contains(&id.key));
                if linked == orphan {
                    return Err(format!("{id:?}: linked={linked} orphan={orphan}"));
                }
            }
        }
        self.groups.check(|key| {
            let of_group = self.map.values().filter(|s| &*s.group == key);
            of_group.fold((0, 0), |(b, l), s| (b + s.cost, l + s.is_leaf() as usize))
        })?;
        if self.expiry.len() > self.map.len() {
            return Err("stale expiry entries".into());
        }
        for (pid, kids) in &self.orphans {
            if self.map.contains_key(pid) {
                return Err(format!("{pid:?} is resident but still has orphans"));
            }
            for k in kids {
                if !self
                    .map
                    .contains_key(&BlockId::new(pid.namespace.clone(), k.clone()))
                {
                    return Err(format!("orphan {k:?} of {pid:?} is not resident"));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    //! The index's own property test: random inserts (children before and
    //! after parents), lookups, pins, evictions, expiry and removals against a
    //! model, checking the invariants and prefix closure after every step.
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashSet;
    use std::time::Duration;

    #[derive(Debug)]
    struct V {
        cost: u64,
        parent: Option<Key>,
    }
    impl Node for V {
        fn cost(&self) -> u64 {
            self.cost
        }
        fn parent(&self) -> Option<&Key> {
            self.parent.as_ref()
        }
    }

    fn key(chain: u8, pos: u8) -> Key {
        Key::new(vec![chain, pos]).unwrap()
    }
    /// Chains 0 and 1 share a tenant (`a/`), chain 2 is another (`b`), so
    /// the per-tenant bookkeeping of [`crate::shares`] is checked too.
    fn id(chain: u8, pos: u8) -> BlockId {
        let ns = ["a/0", "a/1", "b"][chain as usize % 3];
        BlockId::new(Namespace::new(ns).unwrap(), key(chain, pos))
    }

    #[derive(Debug, Clone)]
    enum Op {
        Insert {
            chain: u8,
            pos: u8,
            cost: u64,
            ttl: Option<u64>,
        },
        Touch {
            chain: u8,
            pos: u8,
        },
        Pin {
            chain: u8,
            pos: u8,
        },
        Evict {
            budget: u64,
        },
        Expire {
            at: u64,
        },
        Remove {
            chain: u8,
            pos: u8,
        },
    }

    fn op() -> impl Strategy<Value = Op> {
        let at = (0u8..3, 0u8..5);
        prop_oneof![
            4 => (at.clone(), 1u64..100, prop::option::weighted(0.2, 1u64..50))
                .prop_map(|((chain, pos), cost, ttl)| Op::Insert { chain, pos, cost, ttl }),
            2 => at.clone().prop_map(|(chain, pos)| Op::Touch { chain, pos }),
            1 => at.clone().prop_map(|(chain, pos)| Op::Pin { chain, pos }),
            2 => (0u64..600).prop_map(|budget| Op::Evict { budget }),
            1 => (0u64..60).prop_map(|at| Op::Expire { at }),
            1 => at.prop_map(|(chain, pos)| Op::Remove { chain, pos }),
        ]
    }

    /// A resident block whose parent was ever linked has its parent resident;
    /// with parents always inserted first this is plain prefix closure.
    fn prefix_closed(ix: &ChainIndex<V, u64>, resident: &HashSet<(u8, u8)>) -> Result<(), String> {
        for &(c, p) in resident {
            if ix.get(&id(c, p)).is_none() {
                return Err(format!("({c},{p}) lost without a removal"));
            }
            if p > 0 && !resident.contains(&(c, p - 1)) {
                return Err(format!("({c},{p}) resident without its parent"));
            }
        }
        if ix.len() != resident.len() {
            return Err(format!(
                "{} resident, model says {}",
                ix.len(),
                resident.len()
            ));
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn stays_consistent_and_prefix_closed(ops in prop::collection::vec(op(), 1..80)) {
            let mut ix: ChainIndex<V, u64> = ChainIndex::default();
            let mut resident: HashSet<(u8, u8)> = HashSet::new();
            let t0 = Instant::now();
            let mut pinned_until: HashMap<(u8, u8), Instant> = HashMap::new();
            for op in ops {
                match op {
                    Op::Insert { chain, pos, cost, ttl } => {
                        // Parents first, as the engine writes chains; the
                        // orphan path is exercised by the reverse test below.
                        if resident.contains(&(chain, pos)) || (pos > 0 && !resident.contains(&(chain, pos - 1))) {
                            continue;
                        }
                        let parent = (pos > 0).then(|| key(chain, pos - 1));
                        ix.insert(id(chain, pos), V { cost, parent }, ttl.map(|t| t + 10));
                        resident.insert((chain, pos));
                    }
                    Op::Touch { chain, pos } => {
                        let live = matches!(ix.lookup(&id(chain, pos), 0, true), Found::Live(_));
                        prop_assert_eq!(live, resident.contains(&(chain, pos)));
                    }
                    Op::Pin { chain, pos } => {
                        let until = t0 + Duration::from_secs(3600);
                        let ids: Vec<BlockId> = (0..=pos).map(|p| id(chain, p)).collect();
                        ix.pin(&ids, until);
                        for p in 0..=pos {
                            if resident.contains(&(chain, p)) {
                                pinned_until.insert((chain, p), until);
                            }
                        }
                    }
                    Op::Evict { budget } => {
                        let res = ix.evict_until(|b| b <= budget, None, None, t0);
                        let (ok, gone) = match res { Ok(g) => (true, g), Err(g) => (false, g) };
                        for (bid, _) in &gone {
                            let k = (bid.key.as_bytes()[0], bid.key.as_bytes()[1]);
                            prop_assert!(!pinned_until.contains_key(&k), "evicted a pinned block {:?}", k);
                            resident.remove(&k);
                        }
                        if ok {
                            prop_assert!(ix.bytes() <= budget);
                        } else {
                            // Only pinned blocks (and their ancestors) remain.
                            prop_assert!(ix.bytes() > budget);
                        }
                    }
                    Op::Expire { at } => {
                        for (bid, _) in ix.purge_expired(at) {
                            let k = (bid.key.as_bytes()[0], bid.key.as_bytes()[1]);
                            resident.remove(&k);
                            pinned_until.remove(&k);
                        }
                    }
                    Op::Remove { chain, pos } => {
                        let gone = ix.remove_cascade(&id(chain, pos));
                        for (bid, _) in &gone {
                            let k = (bid.key.as_bytes()[0], bid.key.as_bytes()[1]);
                            prop_assert_eq!(k.0, chain);
                            prop_assert!(k.1 >= pos);
                            resident.remove(&k);
                            pinned_until.remove(&k);
                        }
                        // Descendants before ancestors.
                        let positions: Vec<u8> = gone.iter().map(|(b, _)| b.key.as_bytes()[1]).collect();
                        prop_assert!(positions.windows(2).all(|w| w[0] > w[1]), "{:?} not leaf-first", positions);
                    }
                }
                prop_assert_eq!(ix.check_invariants(), Ok(()));
                prop_assert_eq!(prefix_closed(&ix, &resident), Ok(()));
            }
        }

        #[test]
        fn children_inserted_first_are_adopted(n in 1u8..6, order in Just(()).prop_perturb(|_, mut r| {
            let mut v: Vec<u8> = (0..6).collect();
            for i in (1..v.len()).rev() { v.swap(i, (r.next_u32() as usize) % (i + 1)); }
            v
        })) {
            let mut ix: ChainIndex<V, u64> = ChainIndex::default();
            for &pos in order.iter().filter(|&&p| p < n) {
                let parent = (pos > 0).then(|| key(0, pos - 1));
                ix.insert(id(0, pos), V { cost: 1, parent }, None);
                prop_assert_eq!(ix.check_invariants(), Ok(()));
            }
            // Once all are in, the chain is linked: the only leaf is the tail,
            // so evicting one block takes the tail, and removing the head
            // takes all of them.
            let gone = ix.evict_until(|b| b < n as u64, None, None, Instant::now()).unwrap();
            prop_assert_eq!(gone.len(), 1);
            prop_assert_eq!(gone[0].0.key.as_bytes()[1], n - 1);
            prop_assert_eq!(ix.remove_cascade(&id(0, 0)).len(), n as usize - 1);
            prop_assert_eq!(ix.len(), 0);
            prop_assert_eq!(ix.check_invariants(), Ok(()));
        }
    }

    #[test]
    fn held_parents_and_protected_blocks_are_not_evicted() {
        let mut ix: ChainIndex<V, u64> = ChainIndex::default();
        ix.insert(
            id(0, 0),
            V {
                cost: 10,
                parent: None,
            },
            None,
        );
        ix.insert(
            id(1, 0),
            V {
                cost: 10,
                parent: None,
            },
            None,
        );
        ix.hold(&id(0, 0));
        let now = Instant::now();
        let err = ix
            .evict_until(|b| b == 0, Some(&id(1, 0)), None, now)
            .unwrap_err();
        assert!(err.is_empty());
        ix.release(&id(0, 0));
        let gone = ix
            .evict_until(|b| b <= 10, Some(&id(1, 0)), None, now)
            .unwrap();
        assert_eq!(gone[0].0, id(0, 0));
        assert_eq!(ix.counters.evictions, 1);
    }

    #[test]
    fn expired_lookup_removes_descendants() {
        let mut ix: ChainIndex<V, u64> = ChainIndex::default();
        ix.insert(
            id(0, 0),
            V {
                cost: 1,
                parent: None,
            },
            Some(5),
        );
        ix.insert(
            id(0, 1),
            V {
                cost: 1,
                parent: Some(key(0, 0)),
            },
            None,
        );
        assert!(matches!(ix.lookup(&id(0, 0), 4, true), Found::Live(_)));
        match ix.lookup(&id(0, 0), 5, true) {
            Found::Expired(r) => assert_eq!(r.len(), 2),
            _ => panic!("not expired at its deadline"),
        }
        assert_eq!(ix.counters.expirations, 2);
        assert_eq!(ix.len(), 0);
        ix.check_invariants().unwrap();
    }

    /// Blocks whose parent links form a cycle (no chain hash makes one, a
    /// hostile or buggy writer can): every one of them is still evicted when
    /// space is needed, in any insertion order, and removals terminate.
    #[test]
    fn cycles_stay_evictable() {
        // The parent's position of each block: a self-parent, a 2-cycle and
        // a 3-cycle (its links close through orphans in some orders).
        let cycles: [&[u8]; 3] = [&[0], &[1, 0], &[2, 0, 1]];
        for (c, links) in cycles.iter().enumerate() {
            let n = links.len();
            // Every rotation of the insertion order.
            for start in 0..n {
                let mut ix: ChainIndex<V, u64> = ChainIndex::default();
                for i in 0..n {
                    let pos = (start + i) % n;
                    let parent = Some(key(c as u8, links[pos]));
                    ix.insert(id(c as u8, pos as u8), V { cost: 1, parent }, None);
                    ix.check_invariants().unwrap();
                }
                let gone = ix.evict_until(|b| b == 0, None, None, Instant::now());
                assert_eq!(
                    gone.map(|g| g.len()).map_err(|g| g.len()),
                    Ok(n),
                    "cycle {c} inserted from {start}"
                );
                assert_eq!(ix.len(), 0);
                ix.check_invariants().unwrap();
                // Removal of any member ends, and takes the ones below it.
                for i in 0..n {
                    let pos = (start + i) % n;
                    let parent = Some(key(c as u8, links[pos]));
                    ix.insert(id(c as u8, pos as u8), V { cost: 1, parent }, None);
                }
                let removed = ix.remove_cascade(&id(c as u8, start as u8));
                assert!(!removed.is_empty());
                ix.check_invariants().unwrap();
            }
        }
    }
}
