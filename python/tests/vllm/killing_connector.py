"""A ``KvtierConnector`` that kills the kvtier server between Lookup and load.

For the failure test: when the file named by ``$KVTIER_TEST_KILL_FILE`` exists
(it holds the server's pid), the scheduler side SIGKILLs that server right
after a Lookup found blocks and vLLM allocated blocks for them, before any
worker reads them. Everything else is the product's connector unchanged.
"""
from __future__ import annotations

import os
import signal
import time

from kvtier.vllm.connector import KvtierConnector


def _dead(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


class KillingConnector(KvtierConnector):
    def update_state_after_alloc(self, request, blocks, num_external_tokens: int) -> None:
        super().update_state_after_alloc(request, blocks, num_external_tokens)
        path = os.environ.get("KVTIER_TEST_KILL_FILE", "")
        if num_external_tokens > 0 and path and os.path.exists(path):
            pid = int(open(path).read())
            os.remove(path)
            os.kill(pid, signal.SIGKILL)
            end = time.monotonic() + 10
            while not _dead(pid) and time.monotonic() < end:
                time.sleep(0.005)
            with open(path + ".killed", "w") as f:
                f.write(str(pid))
