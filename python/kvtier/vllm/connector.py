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
)

from ..client import Client
from .amx import request_amx
from .common import LoadSpec, SaveSpec, StatsLog, log, show_info_lines
from .config import ConnectorConfig
from .identity import EngineIdentity, unsupported_reason
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


class KvtierConnector(KVConnectorBase_V1):
    """A vLLM KV connector that stores and loads full KV blocks in kvtier."""

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
        self._worker: WorkerSide | None = None
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
            )
            log.info("kvtier connector (scheduler): %s, namespaces %s, load_mode %s",
                     self.cfg.url, self._scheduler.namespaces, self.cfg.load_mode)
        else:
            from vllm.distributed.parallel_state import get_pp_group, get_tensor_model_parallel_rank

            if request_amx():
                log.debug("kvtier connector: AMX tile state granted to this worker (docs/vllm.md)")
            ns = self.identity.namespace(get_pp_group().rank_in_group, get_tensor_model_parallel_rank())
            self._worker = WorkerSide(
                self.cfg,
                ns,
                _client(self.cfg, self.cfg.load_timeout_ms),
                list(kv_cache_config.kv_cache_groups[0].layer_names),
                self.block_size,
                stats,
            )

    @property
    def namespace(self) -> str:
        """This worker's namespace (the first rank's on the scheduler side)."""
        if self._worker is not None:
            return self._worker.namespace
        return self.identity.namespace() if not self.disabled else ""

    # ==============================
    # Worker side
    # ==============================

    def register_kv_caches(self, kv_caches: dict[str, Any]) -> None:
        if self._worker is not None:
            try:
                self._worker.register(kv_caches)
            except ValueError as e:
                log.warning("kvtier connector disabled on this worker: %s", e)
                self._worker.layout = None

    def start_load_kv(self, forward_context, **kwargs: Any) -> None:
        if self._worker is None or not self.has_connector_metadata():
            return
        meta = self._get_connector_metadata()
        if meta.loads:
            self._worker.start_load(meta.loads)

    def wait_for_layer_load(self, layer_name: str) -> None:
        if self._worker is not None:
            self._worker.wait_for_layer_load(layer_name)

    def save_kv_layer(self, layer_name: str, kv_layer, attn_metadata, **kwargs: Any) -> None:
        # Blocks are copied out once per step in wait_for_save (all layers in one
        # pass over each block): notes/*-vllm-ttft.md measured no gain from
        # per-layer copies on CPU, where the copy competes with the forward pass.
        return

    def wait_for_save(self) -> None:
        if self._worker is None or not self.has_connector_metadata():
            return
        meta = self._get_connector_metadata()
        self._worker.save(meta.saves, meta.forget)

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        if self._worker is None:
            return None, None
        return None, self._worker.get_finished() or None

    def get_block_ids_with_load_errors(self) -> set[int]:
        if self._worker is None:
            return set()
        return self._worker.take_errors()

    def shutdown(self) -> None:
        if self._worker is not None:
            self._worker.shutdown()
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
                connector_output.finished_recving, getattr(connector_output, "invalid_block_ids", None)
            )

    def request_finished(self, request, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        if self._scheduler is not None:
            return False, self._scheduler.request_finished(request)
        return False, None
