//! The same-host front's shared memory (docs/local.md): one arena per
//! namespace, so a segment a client maps holds only bytes of namespaces
//! its token may read, and one budget for every arena and lent segment.
use kvtier_shm::{Arena, Budget};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;

/// Largest segment an arena cuts slots from: large enough that a GPU
/// engine registers few of them, small enough that a namespace with little
/// in it does not hold much (arenas start at 4 MiB and double).
pub const LARGEST_SEGMENT: usize = 256 << 20;

/// Every namespace's arena, and the budget they share.
pub struct Shm {
    budget: Arc<Budget>,
    arenas: Mutex<HashMap<String, Arena>>,
}

impl Shm {
    /// Arenas and lent segments together within `bytes`
    /// (`server.local_shared_memory`).
    pub fn new(bytes: u64) -> Arc<Self> {
        Arc::new(Self {
            budget: Budget::new(bytes),
            arenas: Mutex::new(HashMap::new()),
        })
    }

    /// The budget (lent segments are charged to it too).
    pub fn budget(&self) -> &Arc<Budget> {
        &self.budget
    }

    /// Retires every arena's empty segments (the budget ran out); the
    /// bytes given back.
    pub fn reclaim(&self) -> u64 {
        let arenas: Vec<Arena> = self.arenas.lock().values().cloned().collect();
        arenas.iter().map(Arena::reclaim).sum()
    }

    /// A slot of `len` bytes in `arena`; when the budget is out, every
    /// arena's empty segments are retired and it is tried once more.
    pub fn alloc(&self, arena: &Arena, len: usize) -> std::io::Result<Option<kvtier_shm::SlotMut>> {
        match arena.try_alloc(len)? {
            Some(s) => Ok(Some(s)),
            None if self.reclaim() > 0 => arena.try_alloc(len),
            None => Ok(None),
        }
    }

    /// The arena of namespace `ns`, made on first use.
    pub fn arena(&self, ns: &str) -> Arena {
        self.arenas
            .lock()
            .entry(ns.to_owned())
            .or_insert_with(|| Arena::new(&label(ns), LARGEST_SEGMENT, self.budget.clone()))
            .clone()
    }
}

/// A memfd's name (visible in /proc/PID/maps): the namespace, cut short
/// and stripped of anything but [A-Za-z0-9._-].
fn label(ns: &str) -> String {
    let clean: String = ns
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || "._-".contains(*c))
        .take(40)
        .collect();
    format!("ns-{clean}")
}
