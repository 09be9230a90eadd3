"""The scheduler half of the connector: how much of a prompt kvtier holds,
what to load where, and which newly computed blocks to store.

Per request it keeps one Lookup result (one kvtier Lookup per request and
preemption; see ``_State``) and the number of leading blocks known to be in
kvtier or already handed to a worker for storing. Each step,
``build_connector_meta`` turns that into ``LoadSpec``/``SaveSpec`` lists for the
workers, and keys to delete (blocks computed after a load that failed).
Nothing here blocks for long: the Lookup has its own short deadline and a
circuit breaker, and a failure means "0 external tokens".

A hybrid model has several KV-cache groups, each in its own namespace
(docs/vllm.md, "Hybrid models"). A hit of ``h`` tokens needs every block
before ``h`` of a full-attention group, but of a sliding-window or
chunked-local group only the blocks vLLM keeps at ``h`` (the window), so
those are the only ones looked up and loaded: blocks that fell out of every
window a hit uses are never read, and the memory tier's LRU evicts them first.
"""
from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from .common import Breaker, LoadSpec, SaveSpec, StatsLog, chain_keys, is_outage, log
from .config import ConnectorConfig
from .identity import EngineIdentity, group_kind, skipped_tokens

__all__ = ["SchedulerSide"]


@dataclass
class _State:
    """What the scheduler knows about one request."""

    epoch: int
    """``request.num_preemptions`` at lookup: a preempted request is looked up again."""
    keys: list[bytes]
    """Chain keys of the full blocks seen so far (extended as decoding fills blocks)."""
    found: int = 0
    """Leading blocks present in kvtier (every rank) at lookup."""
    leases: dict[str, int] = field(default_factory=dict)
    lease_nodes: dict[str, str] = field(default_factory=dict)
    lease_deadline: float = 0.0
    local: int = 0
    """vLLM's own prefix-cache hit (tokens) passed to the last get_num_new_matched_tokens."""
    saved: int = 0
    """Leading blocks stored in kvtier or handed to a worker for storing."""
    cacheable: bool = True
    """False for requests whose KV is not a function of their tokens alone (LoRA, multimodal, embeddings)."""
    salt: str | None = None
    loading: bool = False
    load_first: int = 0
    """Chain index of the first block of the pending load."""
    load_block_ids: list[int] = field(default_factory=list)


@dataclass
class _Wait:
    """A consumer waiting for the blocks a prefill engine said it stored."""

    deadline: float
    next_probe: float = 0.0


#: How often a waiting consumer asks kvtier again (the scheduler calls back every step).
_WAIT_PROBE_S = 0.005

#: Times a hit is moved back to before a missing window block and checked again.
_WINDOW_TRIES = 4
#: The same with a state group, which moves back one block a try: vLLM keeps
#: states only at some boundaries (a prompt's last block), so a prefix that
#: runs on past one (a reply) needs more tries to reach it. One Lookup each.
_STATE_TRIES = 16


def _transfer_params(request) -> dict[str, Any]:
    """The request's ``kv_transfer_params`` (client input: anything but a dict is ignored)."""
    params = getattr(request, "kv_transfer_params", None)
    return params if isinstance(params, dict) else {}


def awaited_blocks(request) -> int:
    """Blocks a prefill engine stored for this request (``kv_transfer_params``
    from the disaggregated-serving router, docs/vllm.md), 0 if none were announced."""
    n = _transfer_params(request).get("kvtier_blocks", 0)
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else 0


def _uncacheable(request) -> str:
    if getattr(request, "lora_request", None) is not None:
        return "LoRA adapter"
    if getattr(request, "mm_features", None):
        return "multimodal inputs"
    if getattr(request, "prompt_embeds", None) is not None:
        return "prompt embeddings"
    return ""


class SchedulerSide:
    """Scheduler-role logic of :class:`kvtier.vllm.KvtierConnector`."""

    def __init__(self, cfg: ConnectorConfig, identity: EngineIdentity, client, can_load: bool, can_save: bool,
                 block_size: int, stats: StatsLog, specs: list | None = None):
        self.cfg = cfg
        self.identity = identity
        #: The KV-cache groups' specs (None: one full-attention group), their
        #: kinds (identity.group_kind) and every rank's namespace of each.
        self.specs = specs or [None]
        self.kinds = [group_kind(sp) if sp is not None else "full" for sp in self.specs]
        self.group_ns = [identity.namespaces(g) if len(self.specs) > 1 else identity.namespaces()
                         for g in range(len(self.specs))]
        self.namespaces = [ns for group in self.group_ns for ns in group]
        #: vLLM accepts load failures of a multi-group model only as failed
        #: async loads (its scheduler's _handle_invalid_blocks raises), and a
        #: window or state group cannot restart at a failed block (the tokens
        #: after it would attend to the null blocks before it): every load of
        #: such a model is async whatever load_mode says, and fails whole.
        self.hybrid = len(self.specs) > 1 or any(kind != "full" for kind in self.kinds)
        #: Whether vLLM is told a load completes later (get_num_new_matched_tokens)
        #: and the load is queued as async (update_state_after_alloc): one answer for both.
        self.async_load = self.cfg.load_mode == "async" or self.hybrid
        #: A state group holds states at block boundaries only: a hit must
        #: end on one, so the last prompt block is recomputed whole.
        self.aligned = "state" in self.kinds
        self.client = client
        self.can_load = can_load
        self.can_save = can_save
        self.block_size = block_size
        self.stats = stats
        # A secret salt for this deployment's keys (docs/keys.md); from the
        # environment, never from kv_connector_extra_config (vLLM logs that).
        self._key_salt = os.environ.get("KVTIER_KEY_SALT", "").encode()
        self.breaker = Breaker(cfg.url, cfg.retry_initial_ms / 1000, cfg.retry_max_ms / 1000)
        self._states: dict[str, _State] = {}
        self._requests: dict[str, Any] = {}  # vLLM's Request objects
        self._waits: dict[str, _Wait] = {}
        self._loads: list[LoadSpec] = []
        self._forget: list[bytes] = []
        self._kv_cache_manager = None
        # Lease releases are fire-and-forget: never on the scheduler's path.
        self._releaser = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kvtier-release")
        self._lock = threading.Lock()
        self.lookups = 0
        self.hit_blocks = 0

    def bind_kv_cache_manager(self, manager) -> None:
        self._kv_cache_manager = manager

    # -- lookup -----------------------------------------------------------

    def _ask(self, namespaces: list[str], keys: list[bytes], lease_ms: int, timeout: float,
             leases: dict[str, int], nodes: dict[str, str], tiers: dict[str, int]) -> int:
        """Leading ``keys`` present in every namespace of ``namespaces``
        (leases and where they were granted added to ``leases``/``nodes``)."""
        found = len(keys)
        for ns in namespaces:
            r = self.client.lookup(ns, keys=keys[:found], lease_ms=lease_ms, timeout=timeout)
            found = min(found, r.found)
            for t in r.tiers[:found]:
                tiers[t.name.lower()] = tiers.get(t.name.lower(), 0) + 1
            if r.lease_id:
                leases[ns] = r.lease_id
                if r.lease_node:
                    nodes[ns] = r.lease_node
            if found == 0:
                break
        return found

    def _cap(self, request) -> int:
        """The longest hit in tokens: vLLM computes at least the last token
        itself; with a state group the hit also ends on a block boundary."""
        cap = request.num_tokens - 1
        return cap // self.block_size * self.block_size if self.aligned else cap

    def _hit_blocks(self, request, keys: list[bytes], lease_ms: int, timeout: float,
                    leases: dict[str, int], nodes: dict[str, str], tiers: dict[str, int]) -> int:
        """Leading blocks of ``keys`` every group can serve (the model's hit).

        Full-attention groups need every block before the hit; window groups
        (sliding window, chunked local) only the blocks vLLM keeps at it. A
        window with a missing block moves the hit back to before that block
        and is checked again, up to ``_WINDOW_TRIES`` times."""
        found = len(keys)
        for g, kind in enumerate(self.kinds):
            if kind == "full" and found:
                found = self._ask(self.group_ns[g], keys[:found], lease_ms, timeout, leases, nodes, tiers)
        windows = [g for g, kind in enumerate(self.kinds) if kind in ("window", "state")]
        if not windows:
            return found
        bs = self.block_size
        tries = _STATE_TRIES if self.aligned else _WINDOW_TRIES
        for _ in range(tries):
            if not found:
                return 0
            hit = min(found * bs, self._cap(request))
            end = -(-hit // bs)
            attempt: dict[str, int] = {}
            ok = True
            try:
                for g in windows:
                    first = skipped_tokens(self.specs[g], hit) // bs
                    got = self._ask(self.group_ns[g], keys[first:end], lease_ms, timeout, attempt, nodes, tiers)
                    if got < end - first:
                        found = first + got  # the hit must end before the missing block
                        ok = False
                        break
            except Exception:
                self._release(attempt)
                raise
            if ok:
                leases.update(attempt)
                return found
            self._release(attempt)
        return 0

    def _lookup(self, request, st: _State, want_lease: bool) -> None:
        """Looks up every group on every rank; ``st.found`` is the model's hit in blocks."""
        if not st.keys or not self.breaker.allow():
            st.found = 0
            return
        t0 = time.perf_counter()
        timeout = self.cfg.lookup_timeout_ms / 1000
        lease_ms = self.cfg.lease_ms if want_lease else 0
        leases: dict[str, int] = {}
        nodes: dict[str, str] = {}
        tiers: dict[str, int] = {}
        try:
            found = self._hit_blocks(request, st.keys, lease_ms, timeout, leases, nodes, tiers)
        except Exception as e:  # noqa: BLE001 - any failure is a miss
            if is_outage(e):
                self.breaker.failure(e)
            else:
                log.warning("kvtier lookup for request %s failed: %s", request.request_id, e)
            self._release(leases)
            st.found = 0
            self.stats("lookup", req=request.request_id, blocks=len(st.keys), found=0, error=str(e),
                       us=int((time.perf_counter() - t0) * 1e6))
            return
        self.breaker.success()
        st.found = found
        st.leases = leases if found else {}
        st.lease_nodes = nodes if found else {}
        if leases and not found:
            self._release(leases)
        st.lease_deadline = time.monotonic() + lease_ms / 1000 * 0.8
        self.lookups += 1
        self.stats("lookup", req=request.request_id, blocks=len(st.keys), found=found, tiers=tiers,
                   us=int((time.perf_counter() - t0) * 1e6))

    def _release(self, leases: dict[str, int]) -> None:
        if not leases:
            return

        def go():
            for lease_id in leases.values():
                try:
                    self.client.release(lease_id, timeout=self.cfg.lookup_timeout_ms / 1000)
                except Exception as e:  # noqa: BLE001 - the lease expires anyway
                    log.debug("kvtier lease %d release failed: %s", lease_id, e)

        self._releaser.submit(go)

    def get_num_new_matched_tokens(self, request, num_computed_tokens: int) -> tuple[int | None, bool]:
        req_id = request.request_id
        st = self._states.get(req_id)
        epoch = getattr(request, "num_preemptions", 0)
        wait = self._waits.get(req_id)
        if wait is not None and time.monotonic() < wait.next_probe:
            return None, False  # vLLM keeps the request waiting and asks again next step
        if st is None or st.epoch != epoch:
            reason = _uncacheable(request)
            salt = getattr(request, "cache_salt", None)
            keys = (
                chain_keys(list(request.all_token_ids), self.block_size, salt, key_salt=self._key_salt)
                if not reason
                else []
            )
            st = _State(epoch=epoch, keys=keys, cacheable=not reason, salt=salt)
            self._states[req_id] = st
            self._requests[req_id] = request
            want_lease = self.can_load and not getattr(request, "skip_reading_prefix_cache", False)
            self._lookup(request, st, want_lease)
            st.saved = st.found
            if want_lease and self._still_waiting(request, st):
                return None, False
        elif st.leases and time.monotonic() > st.lease_deadline and not st.loading:
            # Still waiting to be scheduled and the lease is about to lapse: look again.
            self._release(st.leases)
            st.leases = {}
            self._lookup(request, st, True)
            st.saved = max(st.saved, st.found)
        st.local = num_computed_tokens
        if not self.can_load or not st.found or getattr(request, "skip_reading_prefix_cache", False):
            # (prompt logprobs, some pooling requests: vLLM must compute every token)
            return 0, False
        hit = min(st.found * self.block_size, self._cap(request))  # vLLM must compute at least the last token
        ext = max(0, hit - num_computed_tokens)
        return ext, ext > 0 and self.async_load

    def _still_waiting(self, request, st: _State) -> bool:
        """A consumer of a prefill engine (``kv_role: kv_consumer`` behind a
        prefill/decode router) is told how many blocks the producer stored;
        its writes may still be in flight, so the request waits for them, up
        to ``load_timeout_ms``, rather than recomputing the prefix. Past the
        deadline it takes what is there (the rest is recomputed)."""
        want = min(awaited_blocks(request), len(st.keys))
        req_id = request.request_id
        now = time.monotonic()
        wait = self._waits.get(req_id)
        if st.found >= want:
            if wait is not None:
                self._waits.pop(req_id, None)
                self.stats("awaited", req=req_id, blocks=want, found=st.found)
            return False
        if wait is None:
            wait = self._waits[req_id] = _Wait(deadline=now + self.cfg.load_timeout_ms / 1000)
        if now >= wait.deadline:
            self._waits.pop(req_id, None)
            log.warning("kvtier: request %s waited %d ms for %d announced blocks, found %d; the rest is recomputed",
                        req_id, self.cfg.load_timeout_ms, want, st.found)
            self.stats("awaited", req=req_id, blocks=want, found=st.found, timeout=True)
            return False
        wait.next_probe = now + _WAIT_PROBE_S
        self._release(st.leases)
        del self._states[req_id]  # looked up afresh on the next call
        self._requests.pop(req_id, None)
        return True

    def _null_block(self) -> int:
        """vLLM's null block id: what a group holds where it keeps no KV (before a window)."""
        pool = getattr(self._kv_cache_manager, "block_pool", None)
        return pool.null_block.block_id if pool is not None else 0

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int) -> None:
        if num_external_tokens <= 0:
            return
        st = self._states[request.request_id]
        bs = self.block_size
        first = st.local // bs
        last = -(-(st.local + num_external_tokens) // bs)
        null = self._null_block()
        for g, group_ids in enumerate(blocks.get_block_ids()):
            # A window group holds null blocks where it keeps no KV: those are
            # not loaded (docs/vllm.md, "Hybrid models").
            pairs = [(k, b) for k, b in zip(st.keys[first:last], group_ids[first:last])
                     if b != null or self.kinds[g] == "full"]
            if self.kinds[g] == "state":
                # Only the state at the hit: vLLM puts its block last, nulls before.
                pairs = [(k, b) for k, b in pairs if b == group_ids[last - 1]]
            if not pairs and not self.async_load:
                continue  # (an async load reports every group done, even an empty one)
            spec = LoadSpec(
                req_id=request.request_id,
                keys=[k for k, _ in pairs],
                block_ids=[b for _, b in pairs],
                leases=dict(st.leases),
                lease_nodes=dict(st.lease_nodes),
                is_async=self.async_load,
                group=g,
            )
            if g == 0:
                st.load_block_ids = spec.block_ids
            self.hit_blocks += len(spec.keys)
            self._loads.append(spec)
        st.leases = {}  # the workers release them once read
        st.lease_nodes = {}
        st.loading = True
        st.load_first = first

    # -- per step ---------------------------------------------------------

    def build(self, scheduler_output) -> tuple[list[LoadSpec], list[SaveSpec]]:
        loads, self._loads = self._loads, []
        saves: list[SaveSpec] = []
        if self.can_save:
            spec_tokens = scheduler_output.scheduled_spec_decode_tokens or {}
            for new in scheduler_output.scheduled_new_reqs:
                self._plan_save(saves, new.req_id, new.num_computed_tokens,
                                scheduler_output.num_scheduled_tokens.get(new.req_id, 0)
                                - len(spec_tokens.get(new.req_id, ())))
            cached = scheduler_output.scheduled_cached_reqs
            for i, req_id in enumerate(cached.req_ids):
                self._plan_save(saves, req_id, cached.num_computed_tokens[i],
                                scheduler_output.num_scheduled_tokens.get(req_id, 0)
                                - len(spec_tokens.get(req_id, ())))
            if self.aligned:
                self._plan_states(saves, scheduler_output)
        return loads, saves

    def take_forget(self) -> list[bytes]:
        """Keys the workers delete before this step's saves (``update_connector_output``)."""
        forget, self._forget = self._forget, []
        return forget

    def _extend_keys(self, st: _State, tokens, blocks: int) -> None:
        """Makes ``st.keys`` cover the first ``blocks`` blocks of ``tokens``."""
        if blocks > len(st.keys):
            prev = st.keys[-1] if st.keys else None
            st.keys.extend(chain_keys(list(tokens[:blocks * self.block_size]), self.block_size, st.salt,
                                      start=len(st.keys), prev=prev, key_salt=self._key_salt))

    def _plan_states(self, saves: list[SaveSpec], scheduler_output) -> None:
        """Stores the Mamba states vLLM hands over this step
        (``kv_connector_block_state.boundary_state_offloads``: group, block,
        boundary), each under the key of the block that ends at its
        boundary. vLLM names the exact block: a state group's block table is
        not positional (states move and blocks are freed as a request runs).
        The worker copies them at the end of this step, after the forward
        pass wrote them and before a later one can reuse the blocks; offers of
        requests that finished or were preempted this step are dropped (their
        blocks may already belong to another request)."""
        state = getattr(scheduler_output, "kv_connector_block_state", None)
        offers = getattr(state, "boundary_state_offloads", None) or {}
        gone = set(getattr(scheduler_output, "finished_req_ids", ()) or ()) | set(
            getattr(scheduler_output, "preempted_req_ids", ()) or ())
        bs = self.block_size
        for req_id, entries in offers.items():
            st = self._states.get(req_id)
            request = self._requests.get(req_id)
            if st is None or request is None or not st.cacheable or req_id in gone:
                continue
            for group, block_id, boundary in entries:
                known = len(request.all_token_ids) if self.cfg.save_decode_blocks else request.num_prompt_tokens
                if (group >= len(self.kinds) or self.kinds[group] != "state" or boundary <= 0 or boundary % bs
                        or boundary > known):
                    continue  # (a partial tail: kvtier stores whole blocks only; or past what is stored)
                i = boundary // bs - 1
                self._extend_keys(st, request.all_token_ids, i + 1)
                saves.append(SaveSpec(req_id=req_id, keys=[st.keys[i]], block_ids=[block_id], parent=None,
                                      group=group, chained=False))

    def _plan_save(self, saves: list[SaveSpec], req_id: str, computed: int, scheduled: int) -> None:
        st = self._states.get(req_id)
        request = self._requests.get(req_id)
        if st is None or request is None or not st.cacheable:
            return
        tokens = request.all_token_ids
        known = len(tokens)
        if not self.cfg.save_decode_blocks:
            known = min(known, request.num_prompt_tokens)
        full = min(computed + max(0, scheduled), known) // self.block_size
        if full <= st.saved:
            return
        self._extend_keys(st, tokens, full)
        if self._kv_cache_manager is None:
            return
        groups = self._kv_cache_manager.get_block_ids(req_id)
        if any(len(ids) < full for ids in groups):
            return
        first = st.saved
        null = self._null_block()
        for g, ids in enumerate(groups):
            if self.kinds[g] == "state":
                continue  # (states are stored from vLLM's boundary hand-offs, _plan_states)
            chained = self.kinds[g] == "full"
            # Only a chain's tokens name its blocks to a router (it rebuilds
            # the chain from them); a salted request's blocks match nobody else's.
            named = chained and self.cfg.send_token_ids and st.salt is None
            # Runs of real blocks: a window group may already hold null blocks
            # where it keeps no KV (never the blocks computed this step).
            run: list[int] = []
            for i in range(first, full + 1):
                if i < full and ids[i] != null:
                    run.append(i)
                    continue
                if run:
                    saves.append(SaveSpec(
                        req_id=req_id,
                        keys=st.keys[run[0]:run[-1] + 1],
                        block_ids=[ids[j] for j in run],
                        parent=st.keys[run[0] - 1] if run[0] and chained else None,
                        group=g,
                        chained=chained,
                        tokens=(list(tokens[run[0] * self.block_size:(run[-1] + 1) * self.block_size])
                                if named else []),
                    ))
                    run = []
        st.saved = full

    def request_finished(self, request) -> dict[str, Any] | None:
        """Forgets the request. A prefill engine (``kv_producer``, or any
        engine asked with ``do_remote_decode``) answers with the
        ``kv_transfer_params`` a decode engine waits on: how many leading
        blocks it stored or handed to its workers to store."""
        st = self._states.pop(request.request_id, None)
        self._requests.pop(request.request_id, None)
        self._waits.pop(request.request_id, None)
        if st is not None and st.leases:
            self._release(st.leases)
        asked = _transfer_params(request).get("do_remote_decode") is True
        announce = self.can_save and (not self.can_load or asked)
        if st is None or not announce or not st.cacheable:
            return None
        return {"kvtier_blocks": st.saved}

    def update_connector_output(self, finished_recving, invalid_block_ids, failed_recving=()) -> None:
        """Worker results of the last step. Blocks that failed to load are
        recomputed by vLLM; storing restarts at the first of them, so kvtier
        gets the recomputed blocks (the worker deleted a bad one).

        The blocks computed after the load (in its step, and in the next one
        under async scheduling) attended to stale KV: the worker that saw the
        failure did not store them, but other ranks may have, so they are
        deleted (every worker, before its next writes) and stored again once
        recomputed; otherwise the first writer would keep the wrong bytes."""
        if invalid_block_ids:
            for st in self._states.values():
                bad = [i for i, b in enumerate(st.load_block_ids) if b in invalid_block_ids]
                if bad:
                    end = max(st.load_first + len(st.load_block_ids), st.found)
                    if st.saved > end:
                        self._forget.extend(st.keys[end:st.saved])
                    st.saved = min(st.saved, st.load_first + bad[0])
                    st.found = min(st.found, st.load_first + bad[0])
        for req_id in failed_recving or ():
            # A hybrid model's failed load (async): vLLM recomputes the whole
            # prompt, and asks again; kvtier's answer is a miss now, and every
            # block is stored again (those present count as existing).
            state = self._states.get(req_id)
            if state is not None:
                state.found = state.saved = 0
        for req_id in finished_recving or ():
            state = self._states.get(req_id)
            if state is not None:
                state.loading = False

    def shutdown(self) -> None:
        self._releaser.shutdown(wait=False)
