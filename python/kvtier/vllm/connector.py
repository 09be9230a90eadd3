"""``KvtierConnector``: vLLM's v1 KV connector backed by a kvtier server.

Enable it with::

    --kv-transfer-config '{"kv_connector":"KvtierConnector",
                           "kv_connector_module_path":"kvtier.vllm",
                           "kv_role":"kv_both",
                           "kv_connector_extra_config":{"url":"127.0.0.1:50051"}}'

vLLM builds one instance in the scheduler process (role SCHEDULER: Lookups,
load and save planning, :mod:`.scheduler`) and one per worker (role WORKER:
block reads and writes, :mod:`.worker`); per-step plans travel from the first
to the others as :class:`KvtierMetadata`. ``docs/vllm.md`` has the payload
layout, namespace rules, failure behaviour and tuning.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    KVConnectorTransferResults,
    SupportsHMA,
)

from ..client import Client
from .amx import request_amx
from .common import LoadSpec, SaveSpec, StatsLog, log, show_info_lines
from .config import ConnectorConfig
from .identity import EngineIdentity, group_kind, unsupported_reason
from .scheduler import SchedulerSide
from .worker import WorkerSide

__all__ = ["KvtierConnector", "KvtierMetadata"]


@dataclass
class KvtierMetadata(KVConnectorMetadata):
    """One step's plan, from the scheduler to every worker."""

    loads: list[LoadSpec] = field(default_factory=list)
    saves: list[SaveSpec] = field(default_factory=list)
    #: Keys to delete before this step's saves (computed after a failed load).
    forget: list[bytes] = field(default_factory=list)


def _client(cfg: ConnectorConfig, timeout_ms: int) -> Client:
    return Client(
        cfg.url,
        connections=cfg.connections,
        timeout=timeout_ms / 1000,
        # One retry, on the next connection of the pool: after kvtier restarts,
        # a gRPC channel still in its reconnect back-off fails fast while
        # another already reconnected.
        retries=1,
        # A request kvtier shed is a miss now, not a wait for its retry hint
        # (the scheduler waits on lookups); the server is not retried harder.
        retry_shed=False,
        data_plane=cfg.data_plane,
    )


class KvtierConnector(KVConnectorBase_V1, SupportsHMA):
    """A vLLM KV connector that stores and loads full KV blocks in kvtier.

    It supports vLLM's hybrid KV-cache manager (``SupportsHMA``), so vLLM
    keeps it on: each KV-cache group (full attention, sliding window, chunked
    local, Mamba states in vLLM's "align" mode) is stored in a namespace of
    its own and a worker side per group moves its blocks; a model with a
    group kvtier cannot cache runs with the connector off and HMA on
    (docs/vllm.md, "Hybrid models").
    """

    @property
    def requires_kv_delivery(self) -> bool:
        # A best-effort cache: a dropped save is a later miss, never lost output.
        return False

    def __init__(self, vllm_config, role: KVConnectorRole, kv_cache_config=None):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        show_info_lines()
        ktc = self._kv_transfer_config
        self.cfg = ConnectorConfig.from_extra(ktc.kv_connector_extra_config)
        self.block_size = vllm_config.cache_config.block_size
        self._scheduler: SchedulerSide | None = None
        self._workers: list[WorkerSide] = []
        # Async loads of a hybrid model: a request is loaded once every
        # group's worker side finished (groups left, per request), and
        # failed if one failed (reported once finished).
        self._recv_left: dict[str, int] = {}
        self._recv_failed: set[str] = set()
        #: Whether load failures go to vLLM per request (failed_recving)
        #: rather than per block: several groups, or a window / state group
        #: (scheduler.SchedulerSide.hybrid).
        self._per_request = False
        self.disabled = unsupported_reason(kv_cache_config) if kv_cache_config is not None else "no KV-cache config"
        if self.disabled:
            log.warning("kvtier connector disabled: %s; the engine runs without kvtier", self.disabled)
            return
        if self.cfg.load_failure_policy == "recompute" and getattr(ktc, "kv_load_failure_policy", None) != "recompute":
            # vLLM's default ("fail") would turn a cache miss into a failed request.
            ktc.kv_load_failure_policy = "recompute"
        self.identity = EngineIdentity(vllm_config, kv_cache_config, self.cfg.model_id, self.cfg.namespace_prefix)
        stats = StatsLog(self.cfg.stats_file, role.name.lower())
        if role == KVConnectorRole.SCHEDULER:
            self._scheduler = SchedulerSide(
                self.cfg,
                self.identity,
                _client(self.cfg, self.cfg.lookup_timeout_ms),
                can_load=ktc.is_kv_consumer,
                can_save=ktc.is_kv_producer,
                block_size=self.block_size,
                stats=stats,
                specs=[g.kv_cache_spec for g in kv_cache_config.kv_cache_groups],
            )
            log.info("kvtier connector (scheduler): %s, namespaces %s, load_mode %s",
                     self.cfg.url, self._scheduler.namespaces, self.cfg.load_mode)
            if self._scheduler.hybrid:
                kinds = ", ".join(f"{g}: {k}" for g, k in enumerate(self._scheduler.kinds))
                log.info("kvtier connector: hybrid model, %d KV-cache groups (%s), a namespace each; loads are "
                         "async (vLLM takes a multi-group load failure only from an async load)",
                         len(self._scheduler.kinds), kinds)
        else:
            from vllm.distributed.parallel_state import get_pp_group, get_tensor_model_parallel_rank

            if request_amx():
                log.debug("kvtier connector: AMX tile state granted to this worker (docs/vllm.md)")
            groups = kv_cache_config.kv_cache_groups
            self._per_request = len(groups) > 1 or any(group_kind(g.kv_cache_spec) != "full" for g in groups)
            rank = (get_pp_group().rank_in_group, get_tensor_model_parallel_rank())
            client = _client(self.cfg, self.cfg.load_timeout_ms)  # one pool for every group
            self._workers = [
                WorkerSide(self.cfg, self.identity.namespace(*rank, g), client, list(group.layer_names),
                           self.block_size, stats, log_transport=g == 0,
                           state=group_kind(group.kv_cache_spec) == "state")
                for g, group in enumerate(kv_cache_config.kv_cache_groups)
            ]

    @property
    def _worker(self) -> WorkerSide | None:
        """The first group's worker side (the only one of a model with one group)."""
        return self._workers[0] if self._workers else None

    @property
    def namespace(self) -> str:
        """This worker's namespace of the first group (the first rank's on the scheduler side)."""
        if self._worker is not None:
            return self._worker.namespace
        return self.identity.namespace() if not self.disabled else ""

    # ==============================
    # Worker side
    # ==============================

    def register_kv_caches(self, kv_caches: dict[str, Any]) -> None:
        for w in self._workers:
            try:
                w.register(kv_caches)
            except ValueError as e:
                log.warning("kvtier connector disabled on this worker (%s): %s", w.namespace, e)
                w.layout = None

    def start_load_kv(self, forward_context, **kwargs: Any) -> None:
        if not self._workers or not self.has_connector_metadata():
            return
        meta = self._get_connector_metadata()
        if not meta.loads:
            return
        for g, w in enumerate(self._workers):
            specs = [s for s in meta.loads if s.group == g]
            if specs:
                if self._per_request:
                    for spec in specs:
                        if spec.is_async:
                            self._recv_left[spec.req_id] = self._recv_left.get(spec.req_id, 0) + 1
                w.start_load(specs)

    def wait_for_layer_load(self, layer_name: str) -> None:
        for w in self._workers:
            w.wait_for_layer_load(layer_name)

    def save_kv_layer(self, layer_name: str, kv_layer, attn_metadata, **kwargs: Any) -> None:
        # Blocks are copied out once per step in wait_for_save (all layers in one
        # pass over each block): notes/*-vllm-ttft.md measured no gain from
        # per-layer copies on CPU, where the copy competes with the forward pass.
        return

    def wait_for_save(self) -> None:
        if not self._workers or not self.has_connector_metadata():
            return
        meta = self._get_connector_metadata()
        for g, w in enumerate(self._workers):
            w.save([s for s in meta.saves if s.group == g], meta.forget)

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        return None, self._finished_recving() or None

    def _finished_recving(self) -> set[str]:
        if not self._per_request:
            return self._workers[0].get_finished() if self._workers else set()
        done: set[str] = set()
        for w in self._workers:
            # Finished before failed: a load records its failure before it
            # reports itself done, so every failure of a request in ``finished``
            # is seen now or was seen earlier (never after its finish).
            finished = w.get_finished()
            self._recv_failed |= w.take_failed()
            for req_id in finished:
                left = self._recv_left.get(req_id, 1) - 1
                if left > 0:
                    self._recv_left[req_id] = left
                else:
                    self._recv_left.pop(req_id, None)
                    done.add(req_id)
        return done

    def get_transfer_results(self, finished_req_ids: set[str]) -> KVConnectorTransferResults:
        done = self._finished_recving()
        # A hybrid model's failed loads go to vLLM as failed requests: it
        # cannot map a block id back to a request with several groups, and
        # restarting a window or state group at a failed block would compute
        # on the null blocks before it.
        failed = self._recv_failed & done
        self._recv_failed -= failed
        return KVConnectorTransferResults(finished_recving=done, failed_recving=failed)

    def get_block_ids_with_load_errors(self) -> set[int]:
        if self._per_request or not self._workers:
            for w in self._workers:
                w.take_errors()  # (reported as failed requests instead)
            return set()
        self._workers[0].take_failed()  # (a single group reports blocks, below)
        return self._workers[0].take_errors()

    def shutdown(self) -> None:
        for w in self._workers:
            w.shutdown()
        if self._scheduler is not None:
            self._scheduler.shutdown()

    # ==============================
    # Scheduler side
    # ==============================

    def bind_kv_cache_manager(self, kv_cache_manager) -> None:
        super().bind_kv_cache_manager(kv_cache_manager)
        if self._scheduler is not None:
            self._scheduler.bind_kv_cache_manager(kv_cache_manager)

    def get_num_new_matched_tokens(self, request, num_computed_tokens: int) -> tuple[int | None, bool]:
        if self._scheduler is None:
            return 0, False
        return self._scheduler.get_num_new_matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int) -> None:
        if self._scheduler is not None:
            self._scheduler.update_state_after_alloc(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output) -> KVConnectorMetadata:
        if self._scheduler is None:
            return KvtierMetadata()
        loads, saves = self._scheduler.build(scheduler_output)
        return KvtierMetadata(loads=loads, saves=saves, forget=self._scheduler.take_forget())

    def update_connector_output(self, connector_output) -> None:
        if self._scheduler is not None:
            self._scheduler.update_connector_output(
                connector_output.finished_recving, getattr(connector_output, "invalid_block_ids", None),
                getattr(connector_output, "failed_recving", None),
            )

    def request_finished(self, request, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        if self._scheduler is not None:
            return False, self._scheduler.request_finished(request)
        return False, None

    def request_finished_all_groups(self, request, block_ids: tuple[list[int], ...]) -> tuple[bool, dict[str, Any] | None]:
        # Saves copy blocks out at the end of their step, so no group's blocks
        # need to outlive the request.
        return self.request_finished(request, block_ids[0] if block_ids else [])
