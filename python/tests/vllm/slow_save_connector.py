"""A ``KvtierConnector`` whose block writes start late.

For the prefill/decode test: the producer's writes reach kvtier
``$KVTIER_TEST_SAVE_DELAY_S`` seconds after the step that computed the
blocks, long after the producer answered the router, so a decode engine that
did not wait for the announced blocks would find none and recompute them.
Everything else is the product's connector unchanged.
"""
from __future__ import annotations

import os
import time

from kvtier.vllm.connector import KvtierConnector


class SlowSaveConnector(KvtierConnector):
    def register_kv_caches(self, kv_caches) -> None:
        super().register_kv_caches(kv_caches)
        worker = self._worker
        if worker is None:
            return
        delay = float(os.environ.get("KVTIER_TEST_SAVE_DELAY_S", "0"))
        write = worker._write

        def late_write(arg):
            time.sleep(delay)
            return write(arg)

        worker._write = late_write
