//! The engine's paths through a cluster (`docs/cluster.md`): lookups ask
//! each peer once for the keys it owns, reads go memory → disk → owners →
//! object store, writes reach every owner, deletes every live node. A request
//! that a peer forwarded here runs on the [`Engine::local_twin`], which
//! touches only this node's memory and disk.

use super::*;
use crate::cluster::{Owners, PeerId};
use futures::future::join_all;
use std::collections::HashMap;

impl Engine {
    /// An engine over the same memory and disk tiers, without peers and
    /// without the object store: what serves requests other nodes forward
    /// here (they already asked, or will ask, the object store themselves).
    /// It shares the lease table (one pin budget per node); its counters are its own.
    pub fn local_twin(&self) -> Engine {
        Engine {
            cfg: self.cfg.clone(),
            memory: self.memory.clone(),
            disk: self.disk.clone(),
            policy: self.policy,
            leases: self.leases.clone(),
            counters: Arc::default(),
            writing: self.writing.clone(),
            object: None,
            peers: None,
            // One memory of uses per node: forwarded reads and writes count.
            disk_admission: self.disk_admission.clone(),
            object_admission: self.object_admission.clone(),
        }
    }

    /// True when this engine places blocks over a cluster.
    pub fn in_cluster(&self) -> bool {
        self.peers.is_some()
    }

    /// The leading `keys` held here or by their owners. Keys this node does
    /// not hold go to their first live owner, grouped: one request per peer,
    /// all in parallel. A peer answers how many leading keys of its group it
    /// holds, so its first miss bounds the prefix; a peer that fails holds
    /// nothing.
    pub(super) async fn lookup_in_cluster(
        &self,
        peers: &dyn Peers,
        ns: &Namespace,
        keys: &[Key],
        timing: &mut StorageTiming,
    ) -> (Vec<Place>, Vec<BlockId>) {
        let ids: Vec<BlockId> = keys
            .iter()
            .map(|k| BlockId::new(ns.clone(), k.clone()))
            .collect();
        let mut tiers: Vec<Option<Place>> = vec![None; ids.len()];
        let mut ask: HashMap<PeerId, Vec<usize>> = HashMap::new();
        let t0 = Instant::now();
        for (i, id) in ids.iter().enumerate() {
            if self.memory.contains_block(id) {
                tiers[i] = Some(Place::here(TierKind::Memory));
            } else if self.disk.as_ref().is_some_and(|d| d.has(id)) {
                tiers[i] = Some(Place::here(TierKind::Disk));
            } else {
                match peers.owners(id).peers.first() {
                    Some(&p) => ask.entry(p).or_default().push(i),
                    // No other node may hold it: the prefix ends here.
                    None => break,
                }
            }
        }
        timing.add(TierKind::Memory, t0.elapsed());
        if !ask.is_empty() {
            let t0 = Instant::now();
            let answers = self.ask_lookups(peers, ns, keys, ask).await;
            let mut retry: HashMap<PeerId, Vec<usize>> = HashMap::new();
            for (p, r, idx) in answers {
                match r {
                    Ok(held) => {
                        for (&i, &t) in idx.iter().zip(&held) {
                            tiers[i] = Some(Place::peer(p, t));
                        }
                    }
                    // The peer is now marked down: ask the keys' next owners.
                    Err(_) => {
                        for i in idx {
                            if let Some(&p) = peers.owners(&ids[i]).peers.first() {
                                retry.entry(p).or_default().push(i);
                            }
                        }
                    }
                }
            }
            if !retry.is_empty() {
                for (p, r, idx) in self.ask_lookups(peers, ns, keys, retry).await {
                    if let Ok(held) = r {
                        for (&i, &t) in idx.iter().zip(&held) {
                            tiers[i] = Some(Place::peer(p, t));
                        }
                    }
                }
            }
            timing.add(TierKind::Peer, t0.elapsed());
        }
        let found = tiers.iter().take_while(|t| t.is_some()).count();
        let tiers = tiers[..found].iter().map(|t| t.expect("found")).collect();
        let mut ids = ids;
        ids.truncate(found);
        (tiers, ids)
    }

    /// One lookup per peer, in parallel, each for its group of keys (indexes
    /// into `keys`, in chain order).
    async fn ask_lookups(
        &self,
        peers: &dyn Peers,
        ns: &Namespace,
        keys: &[Key],
        groups: HashMap<PeerId, Vec<usize>>,
    ) -> Vec<(PeerId, Result<Vec<TierKind>>, Vec<usize>)> {
        join_all(groups.into_iter().map(|(p, idx)| {
            let group: Vec<Key> = idx.iter().map(|&i| keys[i].clone()).collect();
            async move { (p, peers.lookup(p, ns, &group).await, idx) }
        }))
        .await
    }

    /// The block from the first of its owners that has it. A peer that
    /// fails is marked down by the peer layer, which makes the next node of
    /// the ranking an owner: that one is asked too, within the same request.
    /// Returns the owners as they stand at the end.
    pub(super) async fn read_from_peers(
        &self,
        peers: &dyn Peers,
        id: &BlockId,
        timing: &mut StorageTiming,
    ) -> (Option<Block>, Owners) {
        let mut owners = peers.owners(id);
        if owners.peers.is_empty() {
            return (None, owners);
        }
        let t0 = Instant::now();
        let mut tried: Vec<PeerId> = Vec::new();
        let mut got = None;
        'ask: loop {
            let mut failed = false;
            for p in untried(&owners, &tried) {
                tried.push(p);
                match peers.get(p, id).await {
                    Ok(Some(b)) => {
                        got = Some(b);
                        break 'ask;
                    }
                    Ok(None) => {}
                    Err(_) => failed = true,
                }
            }
            owners = peers.owners(id);
            if !failed || owners.peers.iter().all(|p| tried.contains(p)) {
                break;
            }
        }
        timing.add(TierKind::Peer, t0.elapsed());
        (got, owners)
    }

    /// Copies a block this node read from the object store, but does not
    /// own, to its owners in the background, so the next read of it anywhere
    /// finds it in the cluster's memory. Best effort.
    pub(super) fn replicate_to_owners(&self, owners: &Owners, b: &Block) {
        let Some(peers) = &self.peers else { return };
        for &p in &owners.peers {
            let (peers, b) = (peers.clone(), b.clone());
            tokio::spawn(async move {
                if let Err(e) = peers.put(p, b, Overwrite::Never).await {
                    tracing::debug!(error = %e, "copying a block to its owner failed");
                }
            });
        }
    }

    /// A write in a cluster: stored here if this node owns the block (and,
    /// as on a single node, in the object store), or only in the object
    /// store if it does not; then on every other owner, in parallel.
    /// Acknowledged when the local step succeeded; a node that stores nothing
    /// itself (not an owner, no object store) needs one owner to have taken
    /// it. A failed replica is the peer layer's to count; its copy goes to
    /// the next node of the ranking, so one lost node loses no block.
    pub(super) async fn store_in_cluster(
        &self,
        peers: &Arc<dyn Peers>,
        block: Block,
        mode: Overwrite,
        timing: &mut StorageTiming,
    ) -> Result<WriteOutcome> {
        self.check_size(block.payload.len())?;
        let mut owners = peers.owners(&block.meta.id);
        // The copies this block should have: one per owner.
        let want = usize::from(owners.local) + owners.peers.len();
        let mut local_copy = owners.local;
        let mut here = if owners.local {
            Some(self.store_here(block.clone(), mode, timing).await?)
        } else if let Some(obj) = &self.object {
            Some(self.store_object_only(obj, block.clone(), timing).await?)
        } else {
            None
        };
        let t0 = Instant::now();
        let mut tried: Vec<PeerId> = Vec::new();
        let mut stored = 0;
        let mut first_err = None;
        // A replica that fails marks its peer down, which makes the next node
        // of the ranking an owner: it gets the replica in a second round.
        for _round in 0..2 {
            let todo = untried(&owners, &tried);
            if todo.is_empty() {
                break;
            }
            tried.extend(&todo);
            let results = join_all(todo.iter().map(|&p| peers.put(p, block.clone(), mode))).await;
            let failed = results.iter().any(|r| r.is_err());
            for r in results {
                match r {
                    Ok(()) => stored += 1,
                    Err(e) => {
                        first_err.get_or_insert(e);
                    }
                }
            }
            if !failed {
                break;
            }
            owners = peers.owners(&block.meta.id);
            if owners.local && !local_copy {
                let out = self.store_local(block.clone(), mode, timing).await?;
                here.get_or_insert(out);
                local_copy = true;
            }
        }
        // A replica can fail without its peer being marked down (it sheds
        // load, or its memory is full), leaving the block short of its
        // copies: the next live nodes of the ranking take them, which are
        // the ones that become owners if an owner is lost.
        let mut copies = stored + usize::from(local_copy);
        if copies < want {
            for next in peers.ranked(&block.meta.id) {
                if copies >= want {
                    break;
                }
                match next {
                    None if !local_copy => {
                        if let Ok(out) = self.store_local(block.clone(), mode, timing).await {
                            here.get_or_insert(out);
                            local_copy = true;
                            copies += 1;
                        }
                    }
                    Some(p) if !tried.contains(&p) => {
                        tried.push(p);
                        match peers.put(p, block.clone(), mode).await {
                            Ok(()) => {
                                stored += 1;
                                copies += 1;
                            }
                            Err(e) => {
                                first_err.get_or_insert(e);
                            }
                        }
                    }
                    _ => {}
                }
            }
        }
        // No owner took a replica and this node kept none: keep one here (a
        // stand-in owner), so the block is readable now (a write-back upload
        // is not) and survives until the object store has it.
        if stored == 0 && !local_copy && !tried.is_empty() {
            match self.store_local(block.clone(), mode, timing).await {
                Ok(out) => {
                    here.get_or_insert(out);
                }
                Err(e) if here.is_none() => return Err(e),
                Err(e) => {
                    tracing::warn!(error = %e, "no replica of a block was stored, and no local copy either")
                }
            }
        }
        if !tried.is_empty() {
            timing.add(TierKind::Peer, t0.elapsed());
        }
        match (here, first_err) {
            (Some(out), _) => Ok(out),
            (None, _) if stored > 0 => Ok(WriteOutcome::Stored),
            (None, Some(e)) => Err(e.context("no owner of the block could store it")),
            (None, None) => Err(Error::unavailable("no node of the cluster owns this block")),
        }
    }

    /// Deletes on every live peer as well (descendants may live anywhere);
    /// returns the most any node removed. A peer that fails is skipped: the
    /// object store, the source of truth, was already cleared by the caller.
    pub(super) async fn delete_on_peers(
        &self,
        peers: &dyn Peers,
        id: &BlockId,
        timing: &mut StorageTiming,
    ) -> u64 {
        let live = peers.live();
        if live.is_empty() {
            return 0;
        }
        let t0 = Instant::now();
        let n = join_all(live.into_iter().map(|p| peers.delete(p, id)))
            .await
            .into_iter()
            .filter_map(|r| r.ok())
            .max()
            .unwrap_or(0);
        timing.add(TierKind::Peer, t0.elapsed());
        n
    }
}

/// The owners not asked yet, in rank order.
fn untried(owners: &Owners, tried: &[PeerId]) -> Vec<PeerId> {
    owners
        .peers
        .iter()
        .copied()
        .filter(|p| !tried.contains(p))
        .collect()
}
