//! A cluster read: keys grouped by first owner, parts read in parallel, the
//! answers put back in the caller's order and cut at the first block no
//! owner has. Apart from the rest of the cluster client because a read is
//! the one call whose parts can come back short (a node without a block),
//! which sends the rest of that node's part to the next owners.
use super::{ClusterClient, add_timing, unreachable};
use crate::{ClientError, ReadBlock, ReadResult, Result, ServerTiming};
use futures::future::join_all;
use kvtier_core::Key;
use std::collections::BTreeMap;

/// See [`ClusterClient::read`].
///
/// Each round sends every pending key to the first owner that is not down,
/// has not failed in this call and has not answered without it. A node
/// that returns only the first `n` keys of its part (reason `missing`) had
/// no block `n`: that key is asked of its next owner, and the rest of the
/// part again. A key `replicas` owners answered without ends the answer
/// there (reason `missing`); a part cut short for another reason (e.g.
/// `deadline`) ends it where it stopped, with that reason.
pub(super) async fn read(
    c: &ClusterClient,
    ns: &str,
    keys: &[Key],
    lease_id: u64,
) -> Result<ReadResult> {
    if keys.is_empty() {
        let (_, r) = c
            .to_first_owner(
                ns,
                None,
                |cl| async move { cl.read(ns, &[], lease_id).await },
            )
            .await?;
        return Ok(r);
    }
    let n = keys.len();
    let deadline = c.deadline();
    let ranks: Vec<Vec<usize>> = keys.iter().map(|k| c.rank(ns, k.as_bytes())).collect();
    // Per key: the nodes that answered without it.
    let mut misses: Vec<Vec<usize>> = vec![Vec::new(); n];
    let mut failed = vec![false; c.inner.nodes.len()];
    let mut last: Option<ClientError> = None;
    let mut got: Vec<Option<ReadBlock>> = vec![None; n];
    let mut timing = ServerTiming::default();
    // Where the answer ends, and why.
    let (mut end, mut reason) = (n, String::new());
    let mut pending: Vec<usize> = (0..n).collect();
    loop {
        let down = c.down_mask();
        let mut groups: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
        pending.sort_unstable();
        for &i in &pending {
            if i >= end {
                break;
            }
            let node = if misses[i].len() < c.inner.replicas {
                ClusterClient::pick(&ranks[i], &down, &failed, &misses[i])
            } else {
                None
            };
            match node {
                Some(node) => groups.entry(node).or_default().push(i),
                None if misses[i].is_empty() => {
                    // Every owner failed.
                    return Err(last.unwrap_or_else(|| c.deadline_error()));
                }
                None => {
                    (end, reason) = (i, "missing".into());
                    break;
                }
            }
        }
        if groups.is_empty() {
            break;
        }
        c.check_deadline(deadline)?;
        pending.clear();
        let parts: Vec<Vec<Key>> = groups
            .values()
            .map(|ix| ix.iter().map(|&i| keys[i].clone()).collect())
            .collect();
        let outs = join_all(groups.keys().zip(&parts).map(|(&node, part)| {
            let lease_id = c.lease_for(node, lease_id);
            c.part(node, deadline, move |cl| async move {
                cl.read(ns, part, lease_id).await
            })
        }))
        .await;
        let mut error = None;
        for ((node, ix), out) in groups.into_iter().zip(outs) {
            let r = match out {
                Ok(r) => r,
                Err(e) if unreachable(&e) => {
                    failed[node] = true;
                    pending.extend(ix);
                    last = Some(e);
                    continue;
                }
                Err(e) => {
                    error.get_or_insert(e);
                    continue;
                }
            };
            add_timing(&mut timing, &r.timing);
            let k = r.blocks.len();
            for b in r.blocks {
                let Some(&i) = ix.get(b.index) else {
                    return Err(ClientError::Status(tonic::Status::internal(format!(
                        "node {} returned block {} of a {}-key read",
                        c.inner.names[node],
                        b.index,
                        ix.len()
                    ))));
                };
                got[i] = Some(ReadBlock { index: i, ..b });
            }
            if k < ix.len() {
                if r.reason == "missing" || r.reason.is_empty() {
                    // The next owner is asked; the rest of this part again.
                    misses[ix[k]].push(node);
                    pending.extend(&ix[k..]);
                } else if ix[k] < end {
                    (end, reason) = (ix[k], r.reason);
                }
            }
        }
        if let Some(e) = error {
            return Err(e);
        }
    }
    let blocks: Vec<ReadBlock> = got.into_iter().take(end).map_while(|b| b).collect();
    if blocks.len() < end {
        // A node's answer skipped a block (not a prefix of its part).
        reason = "missing".into();
    }
    Ok(ReadResult {
        partial: blocks.len() < n,
        reason,
        blocks,
        timing,
    })
}
