//! Capacity shares: which tenant a block belongs to, and which tenant gives
//! up a block when a local tier is full (docs/security.md, "Capacity shares").
//!
//! Without shares one tier-wide LRU decides, so a tenant that writes fast
//! evicts everyone else. With them every namespace belongs to a *group*: the
//! configured [`ShareClass`] whose prefix it starts with (the longest), or
//! by default the namespace up to and including its first `/` (the whole
//! name when it has none), because tokens grant namespace prefixes such as
//! `acme/` (docs/security.md) and a tenant may make as many namespaces under
//! its prefix as it likes. Each group has a weight (1 by default).
//!
//! Eviction is max-min fair over resident bytes: the victim comes from the
//! group with the most bytes per unit of weight, least recently used leaf
//! first within it (so chains are still eaten from their tails, see
//! [`crate::chain_index`]). A group below the writer's own bytes-per-weight
//! is never a victim: a writer over its share pays with its own blocks, and
//! when it has none left to give its write fails (memory then falls to disk,
//! as for a chain longer than the tier). A tenant alone may fill the whole
//! tier; others take it back down to their fair share as they write.
//!
//! Cost: one `HashMap` lookup and one `BTreeSet` update per insert and
//! removal; a victim is found by walking the groups from the most over their
//! share down, which stops at the writer's own level.
use crate::block::BlockId;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

/// One configured share: the namespaces starting with `prefix` are one
/// tenant with `weight`, reported in metrics as `name`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShareClass {
    /// Metric label (`share="name"`).
    pub name: String,
    /// Namespace prefix; the longest matching prefix wins.
    pub prefix: String,
    /// Relative weight (≥ 1).
    pub weight: u32,
}

/// How the local tiers divide their capacity between tenants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shares {
    /// False: one tier-wide LRU, no shares (the behaviour before shares).
    pub fair: bool,
    /// Weight of a group no [`ShareClass`] names.
    pub default_weight: u32,
    /// Configured shares.
    pub classes: Vec<ShareClass>,
}

impl Default for Shares {
    fn default() -> Self {
        Self {
            fair: true,
            default_weight: 1,
            classes: Vec::new(),
        }
    }
}

/// The metric label of namespaces no [`ShareClass`] names.
pub const OTHER: &str = "other";

/// Resident bytes and evictions of one metric label in one tier.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShareStat {
    /// A [`ShareClass::name`], or [`OTHER`].
    pub name: String,
    /// Bytes charged by its resident blocks.
    pub bytes: u64,
    /// Its blocks evicted to make room for its own writes.
    pub evicted_by_own: u64,
    /// Its blocks evicted to make room for another group's writes.
    pub evicted_by_other: u64,
}

impl Shares {
    /// One tier-wide LRU (for comparisons and tests).
    pub fn off() -> Self {
        Self {
            fair: false,
            ..Self::default()
        }
    }

    /// Checks weights and names: weights ≥ 1, names and prefixes unique,
    /// no class named [`OTHER`].
    pub fn validate(&self) -> Result<(), String> {
        if self.default_weight == 0 {
            return Err("default_weight must be at least 1".into());
        }
        for (i, c) in self.classes.iter().enumerate() {
            if c.weight == 0 {
                return Err(format!("share {:?}: weight must be at least 1", c.name));
            }
            if c.name.is_empty() || c.name == OTHER {
                return Err(format!(
                    "share name {:?} is reserved or empty (namespaces no share names are \
                     reported as {OTHER:?})",
                    c.name
                ));
            }
            for d in &self.classes[..i] {
                if d.name == c.name || d.prefix == c.prefix {
                    return Err(format!(
                        "shares {:?} and {:?} have the same name or prefix",
                        d.name, c.name
                    ));
                }
            }
        }
        Ok(())
    }

    /// The group of namespace `ns`: its key, weight and metric label index
    /// (`classes.len()` is [`OTHER`]). A class's key is its prefix, a default
    /// group's the namespace up to its first `/`; the two never name different
    /// sets (a default key equal to a class prefix means the namespace starts
    /// with that prefix).
    fn group_of<'a>(&'a self, ns: &'a str) -> (&'a str, u32, usize) {
        if !self.fair {
            return ("", 1, self.classes.len());
        }
        let class = self
            .classes
            .iter()
            .enumerate()
            .filter(|(_, c)| ns.starts_with(c.prefix.as_str()))
            .max_by_key(|(_, c)| c.prefix.len());
        match class {
            Some((i, c)) => (c.prefix.as_str(), c.weight, i),
            None => {
                let end = ns.find('/').map_or(ns.len(), |i| i + 1);
                (&ns[..end], self.default_weight, self.classes.len())
            }
        }
    }
}

/// One group's resident bytes and eviction candidates.
struct Group {
    bytes: u64,
    weight: u32,
    label: usize,
    /// Its leaves, by last access (see `ChainIndex`'s leaves).
    leaves: BTreeMap<u64, BlockId>,
}

fn level(bytes: u64, weight: u32) -> u128 {
    ((bytes as u128) << 32) / weight as u128
}

/// Per-group accounting for one tier's index: bytes, leaves in LRU order,
/// and the groups ordered by bytes per weight.
pub(crate) struct Groups {
    shares: Arc<Shares>,
    map: HashMap<Arc<str>, Group>,
    /// (bytes per weight, key) of every group in `map`.
    order: BTreeSet<(u128, Arc<str>)>,
    /// Per metric label: bytes, evicted by own, evicted by other.
    labels: Vec<[u64; 3]>,
}

impl Default for Groups {
    fn default() -> Self {
        Self::new(Arc::new(Shares::default()))
    }
}

impl Groups {
    pub fn new(shares: Arc<Shares>) -> Self {
        let labels = vec![[0; 3]; shares.classes.len() + 1];
        Self {
            shares,
            map: HashMap::new(),
            order: BTreeSet::new(),
            labels,
        }
    }

    /// The key of `id`'s group, creating the group if it has none yet.
    pub fn key_for(&mut self, id: &BlockId) -> Arc<str> {
        let (key, weight, label) = self.shares.group_of(id.namespace.as_str());
        if let Some((k, _)) = self.map.get_key_value(key) {
            return k.clone();
        }
        let k: Arc<str> = Arc::from(key);
        self.map.insert(
            k.clone(),
            Group {
                bytes: 0,
                weight,
                label,
                leaves: BTreeMap::new(),
            },
        );
        self.order.insert((level(0, weight), k.clone()));
        k
    }

    fn group(&mut self, key: &str) -> &mut Group {
        self.map.get_mut(key).expect("group of a resident block")
    }

    /// Adds `cost` bytes to the group (or removes them).
    pub fn charge(&mut self, key: &Arc<str>, cost: u64, add: bool) {
        let g = self.map.get_mut(&**key).expect("group of a resident block");
        let old = level(g.bytes, g.weight);
        g.bytes = if add { g.bytes + cost } else { g.bytes - cost };
        let new = level(g.bytes, g.weight);
        let label = &mut self.labels[g.label][0];
        *label = if add { *label + cost } else { *label - cost };
        if old != new {
            self.order.remove(&(old, key.clone()));
            self.order.insert((new, key.clone()));
        }
        self.drop_if_empty(key);
    }

    pub fn add_leaf(&mut self, key: &str, tick: u64, id: BlockId) {
        self.group(key).leaves.insert(tick, id);
    }

    pub fn remove_leaf(&mut self, key: &Arc<str>, tick: u64) {
        self.group(key).leaves.remove(&tick);
        self.drop_if_empty(key);
    }

    /// The leaf of `key`'s group at `tick`, if any (invariant checks).
    pub fn leaf(&self, key: &str, tick: u64) -> Option<&BlockId> {
        self.map.get(key).and_then(|g| g.leaves.get(&tick))
    }

    fn drop_if_empty(&mut self, key: &Arc<str>) {
        if let Some(g) = self.map.get(&**key)
            && g.bytes == 0
            && g.leaves.is_empty()
        {
            self.order.remove(&(level(0, g.weight), key.clone()));
            self.map.remove(&**key);
        }
    }

    /// The next victim: a leaf `ok` accepts, from the group most over its
    /// share that has one, and never from a group below the writer's level
    /// (`writer`: the namespace being written and the bytes it is about to
    /// add that are not charged yet). Returns the leaf and whether it is the
    /// writer's own; counts the eviction against its label.
    pub fn victim(
        &mut self,
        writer: Option<(&str, u64)>,
        ok: impl Fn(&BlockId) -> bool,
    ) -> Option<BlockId> {
        let w = writer.map(|(ns, pending)| {
            let (key, weight, _) = self.shares.group_of(ns);
            let bytes = self.map.get(key).map_or(0, |g| g.bytes);
            (key, level(bytes + pending, weight))
        });
        let pick = |g: &Group| g.leaves.values().find(|id| ok(id)).cloned();
        let mut found = None;
        for (lvl, key) in self.order.iter().rev() {
            let own = w.is_some_and(|(wk, _)| wk == &**key);
            if !own && w.is_some_and(|(_, wl)| *lvl <= wl) {
                break;
            }
            if let Some(id) = pick(&self.map[&**key]) {
                found = Some((id, key.clone(), own));
                break;
            }
        }
        if found.is_none()
            && let Some((wk, _)) = w
            && let Some((k, g)) = self.map.get_key_value(wk)
        {
            found = pick(g).map(|id| (id, k.clone(), true));
        }
        let (id, key, own) = found?;
        let label = self.map[&*key].label;
        self.labels[label][if own { 1 } else { 2 }] += 1;
        Some(id)
    }

    /// Bytes resident in `ns`'s group.
    pub fn bytes_of(&self, ns: &str) -> u64 {
        let (key, _, _) = self.shares.group_of(ns);
        self.map.get(key).map_or(0, |g| g.bytes)
    }

    /// Per metric label: the configured shares in order, then [`OTHER`].
    pub fn stats(&self) -> Vec<ShareStat> {
        let names = self
            .shares
            .classes
            .iter()
            .map(|c| c.name.as_str())
            .chain([OTHER]);
        names
            .zip(&self.labels)
            .map(|(name, l)| ShareStat {
                name: name.to_string(),
                bytes: l[0],
                evicted_by_own: l[1],
                evicted_by_other: l[2],
            })
            .collect()
    }

    /// Checks each group's bytes against `sum_of(key)` and the leaf count.
    pub fn check(&self, sum_of: impl Fn(&str) -> (u64, usize)) -> Result<(), String> {
        for (k, g) in &self.map {
            let (bytes, leaves) = sum_of(k);
            if bytes != g.bytes || leaves != g.leaves.len() {
                return Err(format!(
                    "group {k:?}: {} bytes / {} leaves, blocks say {bytes} / {leaves}",
                    g.bytes,
                    g.leaves.len()
                ));
            }
            if !self.order.contains(&(level(g.bytes, g.weight), k.clone())) {
                return Err(format!("group {k:?} missing from the order"));
            }
        }
        if self.order.len() != self.map.len() {
            return Err("stale group order entries".into());
        }
        Ok(())
    }
}
