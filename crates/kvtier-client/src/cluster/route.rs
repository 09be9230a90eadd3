//! How the cluster client routes a call: each block's ranking of the
//! nodes, which nodes are skipped as down, picking the node for a part,
//! running a part on a node (connecting it first if needed) within the
//! call's deadline, and the two shapes of call: parts grouped by first owner
//! (writes, deletes) and the whole call to one node (lookups). Apart from
//! the calls themselves ([`super::ClusterClient`]'s methods) so each stays
//! readable.
use super::{ClusterClient, unreachable};
use crate::{Client, ClientError, Result};
use futures::future::join_all;
use kvtier_core::Key;
use std::collections::BTreeMap;
use std::future::Future;
use std::time::{Duration, Instant};

/// Leases remembered (to release each on the node that granted it) before
/// expired ones are forgotten.
const LEASES_KEPT: usize = 1024;

impl ClusterClient {
    /// Node indexes ranked for one block, best first.
    pub(super) fn rank(&self, ns: &str, key: &[u8]) -> Vec<usize> {
        kvtier_core::cluster::rank(&self.inner.names, ns, key)
            .into_iter()
            .map(|n| self.inner.index[n])
            .collect()
    }

    pub(super) fn down_mask(&self) -> Vec<bool> {
        let now = Instant::now();
        self.inner
            .down
            .lock()
            .iter()
            .map(|u| u.is_some_and(|u| u > now))
            .collect()
    }

    pub(super) fn mark(&self, node: usize, answered: bool) {
        self.inner.down.lock()[node] = if answered {
            None
        } else {
            Some(Instant::now() + self.inner.down_for)
        };
    }

    /// The first node of `ranked` not down, not failed in this call and not
    /// in `skip`; else the first such node that is down (a last resort).
    pub(super) fn pick(
        ranked: &[usize],
        down: &[bool],
        failed: &[bool],
        skip: &[usize],
    ) -> Option<usize> {
        let mut fallback = None;
        for &n in ranked {
            if failed[n] || skip.contains(&n) {
                continue;
            }
            if !down[n] {
                return Some(n);
            }
            fallback.get_or_insert(n);
        }
        fallback
    }

    pub(super) fn deadline(&self) -> Instant {
        Instant::now() + self.inner.timeout
    }

    pub(super) fn check_deadline(&self, deadline: Instant) -> Result<()> {
        if Instant::now() >= deadline {
            return Err(self.deadline_error());
        }
        Ok(())
    }

    pub(super) fn deadline_error(&self) -> ClientError {
        ClientError::Status(tonic::Status::deadline_exceeded(format!(
            "no answer within {:?}",
            self.inner.timeout
        )))
    }

    /// The connected client of `node`, connecting it first if needed.
    pub(super) async fn client_of(&self, node: usize) -> Result<Client> {
        let n = &self.inner.nodes[node];
        if let Some(c) = n.client.lock().clone() {
            return Ok(c);
        }
        let _one = n.connecting.lock().await;
        if let Some(c) = n.client.lock().clone() {
            return Ok(c);
        }
        let c = Client::connect(n.cfg.clone()).await?;
        *n.client.lock() = Some(c.clone());
        Ok(c)
    }

    /// `call` on `node`'s client before `deadline`; the node is marked down
    /// when it did not answer, up otherwise.
    pub(super) async fn part<T, Fut>(
        &self,
        node: usize,
        deadline: Instant,
        call: impl FnOnce(Client) -> Fut,
    ) -> Result<T>
    where
        Fut: Future<Output = Result<T>>,
    {
        let r = tokio::time::timeout_at(deadline.into(), async {
            let c = self.client_of(node).await?;
            call(c).await
        })
        .await
        .unwrap_or_else(|_| Err(self.deadline_error()));
        self.mark(node, !matches!(&r, Err(e) if unreachable(e)));
        r
    }

    /// Sends each key's part to its first owner (`send(client, indexes into
    /// keys)`), nodes in parallel; the part of a node that does not answer
    /// goes to the next owner. Returns the nodes' answers.
    pub(super) async fn grouped<T, F, Fut>(
        &self,
        ns: &str,
        keys: &[&Key],
        send: F,
    ) -> Result<Vec<T>>
    where
        F: Fn(Client, Vec<usize>) -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        let deadline = self.deadline();
        let ranks: Vec<Vec<usize>> = keys.iter().map(|k| self.rank(ns, k.as_bytes())).collect();
        let mut failed = vec![false; self.inner.nodes.len()];
        let mut last: Option<ClientError> = None;
        let mut pending: Vec<usize> = (0..keys.len()).collect();
        let mut answers = Vec::new();
        while !pending.is_empty() {
            let down = self.down_mask();
            let mut groups: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
            pending.sort_unstable();
            for &i in &pending {
                match Self::pick(&ranks[i], &down, &failed, &[]) {
                    Some(n) => groups.entry(n).or_default().push(i),
                    None => return Err(last.unwrap_or_else(|| self.deadline_error())),
                }
            }
            self.check_deadline(deadline)?;
            pending.clear();
            let outs = join_all(
                groups
                    .iter()
                    .map(|(&n, ix)| self.part(n, deadline, |c| send(c, ix.clone()))),
            )
            .await;
            let mut error = None;
            for ((n, ix), out) in groups.into_iter().zip(outs) {
                match out {
                    Ok(a) => answers.push(a),
                    Err(e) if unreachable(&e) => {
                        failed[n] = true;
                        pending.extend(ix);
                        last = Some(e);
                    }
                    Err(e) => {
                        error.get_or_insert(e);
                    }
                }
            }
            if let Some(e) = error {
                return Err(e);
            }
        }
        Ok(answers)
    }

    /// `call` on the first owner of `key` (on the first node without a key),
    /// then on the next ones while they do not answer. Returns the node and
    /// its answer.
    pub(super) async fn to_first_owner<T, F, Fut>(
        &self,
        ns: &str,
        key: Option<&Key>,
        call: F,
    ) -> Result<(usize, T)>
    where
        F: Fn(Client) -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        let deadline = self.deadline();
        let ranked = match key {
            Some(k) => self.rank(ns, k.as_bytes()),
            None => (0..self.inner.nodes.len()).collect(),
        };
        let mut failed = vec![false; self.inner.nodes.len()];
        let mut last = None;
        loop {
            let Some(n) = Self::pick(&ranked, &self.down_mask(), &failed, &[]) else {
                return Err(last.unwrap_or_else(|| self.deadline_error()));
            };
            self.check_deadline(deadline)?;
            match self.part(n, deadline, &call).await {
                Ok(r) => return Ok((n, r)),
                Err(e) if unreachable(&e) => {
                    failed[n] = true;
                    last = Some(e);
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// The lease id to send `node` with a read under `lease_id`: the id
    /// itself for the node that granted it (or every node, when this client
    /// did not take it), 0 for the others, which would refuse a lease they
    /// never granted.
    pub(super) fn lease_for(&self, node: usize, lease_id: u64) -> u64 {
        if lease_id == 0 {
            return 0;
        }
        match self.inner.leases.lock().get(&lease_id) {
            Some((granted_by, _)) if *granted_by != node => 0,
            _ => lease_id,
        }
    }

    pub(super) fn remember_lease(&self, lease_id: u64, node: usize, lease_ms: u32) {
        if lease_id == 0 {
            return;
        }
        let now = Instant::now();
        let mut leases = self.inner.leases.lock();
        if leases.len() >= LEASES_KEPT {
            leases.retain(|_, (_, until)| *until > now);
        }
        let until = now + Duration::from_millis(u64::from(lease_ms));
        leases.insert(lease_id, (node, until));
    }
}
