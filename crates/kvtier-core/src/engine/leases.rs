//! Leases: pinning a chain's blocks in memory and on disk for a while, so
//! that a lookup's answer still holds when the caller reads. Pins are charged
//! against the engine's pin budget (per namespace and in total), so leases
//! never make other writes fail.

use super::*;

impl Engine {
    /// Pins explicit keys; every key must be present (in memory or on disk).
    pub fn lease(&self, ns: &Namespace, keys: &[Key], dur: Duration) -> Result<LeaseGrant> {
        if keys.is_empty() {
            return Err(Error::invalid("lease needs at least one key"));
        }
        let ids: Vec<BlockId> = keys
            .iter()
            .map(|k| BlockId::new(ns.clone(), k.clone()))
            .collect();
        for id in &ids {
            if !self.held_locally(id) {
                return Err(Error::not_found(format!(
                    "cannot lease key {:?} in namespace {}: not present",
                    id.key, id.namespace
                )));
            }
        }
        match self.pin(&ids, dur, false)? {
            Some((grant, _)) => Ok(grant),
            None => Err(Error::exhausted("nothing to pin")),
        }
    }

    /// Pins the leading `ids` that fit the pin budget (all of them or an
    /// error unless `partial`) under one lease; `None` when none fit.
    pub(super) fn pin(
        &self,
        ids: &[BlockId],
        dur: Duration,
        partial: bool,
    ) -> Result<Option<(LeaseGrant, usize)>> {
        if dur.is_zero() {
            return Err(Error::invalid("lease duration must be > 0 ms"));
        }
        let dur = dur.min(self.cfg.max_lease);
        // A block is pinned in memory and on disk; the larger of the two is
        // charged (the budget is the memory tier's, and disks are larger).
        let mut costs = self.memory.pin_costs(ids);
        if let Some(d) = &self.disk {
            for (c, d) in costs.iter_mut().zip(d.pin_costs(ids)) {
                *c = (*c).max(d);
            }
        }
        let (lease_id, n, until) = self.leases.charge(ids, &costs, dur);
        if n < ids.len() && !partial {
            // Refused whole: what was reserved for the leading blocks goes back.
            self.leases.refund(lease_id, until);
            let budget = self.leases.budget();
            let (total, mine) = self.leases.pinned_bytes(&ids[0].namespace);
            return Err(Error::exhausted(format!(
                "pinning these {} blocks needs {} bytes; leases pin {mine} of {} bytes allowed \
                 for namespace {} and {total} of {} in all (engine.max_pinned_per_namespace, \
                 engine.max_pinned); release leases or lease fewer blocks",
                ids.len(),
                costs.iter().sum::<u64>(),
                budget.per_namespace,
                ids[0].namespace,
                budget.total
            )));
        }
        if n == 0 {
            self.counters.lease_refusals.fetch_add(1, Ordering::Relaxed);
            return Ok(None);
        }
        if n < ids.len() {
            self.counters.lease_refusals.fetch_add(1, Ordering::Relaxed);
        }
        let ids = &ids[..n];
        let grant = match self.leases.grant(lease_id, ids, until) {
            Ok(g) => g,
            Err(e) => {
                // Too many leases: nothing is pinned, so nothing stays charged.
                self.leases.refund(lease_id, until);
                return Err(e);
            }
        };
        self.memory.pin(ids, grant.expires_at);
        if let Some(d) = &self.disk {
            d.pin(ids, grant.expires_at);
        }
        Ok(Some((grant, n)))
    }

    /// Fails unless lease `id` is active.
    pub fn check_lease(&self, id: u64) -> Result<()> {
        self.leases.check(id)
    }

    /// Namespace of active lease `id`, if it is active.
    pub fn lease_namespace(&self, id: u64) -> Option<Namespace> {
        self.leases.namespace_of(id)
    }

    /// Ends a lease early: its pin charge is given back and the pins it
    /// placed are lifted (where a later lease extended a pin, that one
    /// stays; a block pinned by an earlier-ending lease as well loses its pin
    /// too, which can only turn that lease's read into a miss, never into
    /// wrong data).
    pub fn release_lease(&self, id: u64) -> Result<()> {
        self.release_lease_if(id, |_| true)
    }

    /// [`Engine::release_lease`] if `allowed` accepts the lease's
    /// namespace; otherwise the same error as for a lease never granted
    /// (a tenant must not learn of another's leases by releasing them).
    pub fn release_lease_if(
        &self,
        id: u64,
        allowed: impl FnOnce(Option<&Namespace>) -> bool,
    ) -> Result<()> {
        let (ids, until) = self.leases.release_if(id, allowed)?;
        self.memory.unpin(&ids, until);
        if let Some(d) = &self.disk {
            d.unpin(&ids, until);
        }
        Ok(())
    }
}
