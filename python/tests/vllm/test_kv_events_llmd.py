"""A consumer kvtier did not write reads kvtier's KV events: llm-d's
KV-cache indexer (llm-d-kv-cache v0.9.0, its own ZMQ subscriber, vLLM event
decoding, token processor and index, run as tools/llmd-check) subscribed to
real ``kvtier serve --kv-events`` nodes answers "how much of this prompt is
in which tier on which node" while blocks are written, evicted and deleted,
and agrees with kvtier's own per-tier lookup (docs/events.md).

The namespace is llm-d's "model" (the topic is ``kv@NODE@NAMESPACE``): llm-d
seeds its keys with it, as a router asks with the namespace of the model it
serves.
"""
from __future__ import annotations

from kvevents import BS, Chain, Node

from kvtier import Block
from kvtier.server import free_port_pairs

from llmd import LlmdCheck, wait_for


def _joined(llmd: LlmdCheck, nodes: list[Node], ns: str = "warm/up") -> None:
    """Writes a marker block through each node until llm-d indexed it (ZMQ's slow joiner)."""
    for j, n in enumerate(nodes):
        toks = [90_000 + j * BS + i for i in range(BS)]
        key = f"marker-{j}".encode()

        def seen(n=n, toks=toks, key=key):
            n.client.write(ns, [Block(key=key, payload=b"m", token_count=BS, token_ids=toks)])
            return llmd.lookup(ns, toks)["leading"]

        wait_for(seen, timeout=30, interval=0.2, describe=llmd.log_tail)


def test_llmd_follows_writes_deletes_and_demotions_per_tier(tmp_path):
    # The router knows the model by its served name, not kvtier's namespace:
    # events.models publishes the namespace under that name (llm-d seeds its
    # keys with it, so only then do kvtier's blocks match the engines').
    cfg = tmp_path / "kvtier.toml"
    cfg.write_text('[events.models]\n"acme/" = "acme/Llama-3.1-8B"\n')
    node = Node(tmp_path, "node-a", "--disk-dir", str(tmp_path / "disk"), "--write-policy", "write-back",
                "--memory-capacity", "1MiB", "--config", str(cfg))
    try:
        with LlmdCheck([node.endpoint], BS) as llmd:
            _joined(llmd, [node])
            c = Chain("acme/llama", "c", 2, payload=300 << 10)
            model = "acme/Llama-3.1-8B"
            c.write(node)
            wait_for(lambda: llmd.lookup(model, c.tokens)["pods"].get("node-a", {}).get("cpu") == 2,
                     describe=lambda: llmd.lookup(model, c.tokens))
            # A third and fourth block do not fit in memory (write-back): the
            # chain's tail moves to disk, and llm-d follows it there.
            d = Chain("acme/llama", "d", 2, payload=300 << 10)
            d.write(node)
            def moved():
                h = llmd.lookup(model, c.tokens)["held"].get("node-a", {})
                return h.get("cpu") == [0] and h.get("disk") == [1]
            wait_for(moved, describe=lambda: llmd.lookup(model, c.tokens))
            # kvtier's own per-tier lookup says the same of node-a: the
            # head in memory, the tail on disk, a run of 2 blocks.
            r = node.client.lookup(c.ns, keys=c.keys)
            mine = {t.tier.name.lower(): (t.blocks, t.leading) for t in r.tier_counts if t.node == "node-a"}
            assert mine == {"memory": (1, 1), "disk": (1, 1)}, r.tier_counts
            assert llmd.lookup(model, c.tokens)["leading"]["node-a"] == 2
            # Delete the chain's head: gone from every tier, for llm-d too.
            node.client.delete(c.ns, [c.keys[0]])
            wait_for(lambda: not llmd.lookup(model, c.tokens)["leading"].get("node-a"),
                     describe=lambda: llmd.lookup(model, c.tokens))
            # Under the namespace itself nothing matches: a different seed.
            assert not llmd.lookup(c.ns, d.tokens)["leading"]
            # The other chain is untouched.
            assert llmd.lookup(model, d.tokens)["leading"].get("node-a") == 2
    finally:
        node.stop()


def test_llmd_sees_which_node_holds_which_block_in_a_cluster(tmp_path):
    ports = free_port_pairs(2)  # each node's data plane takes P + 1 ("auto")
    names = [f"127.0.0.1:{p}" for p in ports]
    nodes_arg = ",".join(f"grpc://{n}" for n in names)
    nodes = [Node(tmp_path, names[i], "--cluster-nodes", nodes_arg, "--cluster-self", f"grpc://{names[i]}",
                  "--cluster-replicas", "1", grpc_port=ports[i]) for i in range(2)]
    try:
        with LlmdCheck([n.endpoint for n in nodes], BS) as llmd:
            _joined(llmd, nodes)
            c = Chain("acme/llama", "k", 8)
            # One block at a time, each indexed before the next: llm-d drops
            # a BlockStored whose parent it has not seen, and a parent placed
            # on the other node may be announced after its child
            # (docs/events.md, "Consumers").
            for i in range(8):
                nodes[0].client.write(c.ns, [c.block(i)])
                wait_for(lambda i=i: sum(len(t.get("cpu", [])) for t in
                                         llmd.lookup(c.ns, c.tokens)["held"].values()) == i + 1,
                         describe=lambda: llmd.lookup(c.ns, c.tokens))
            # Where kvtier placed each block (per-block placement over the
            # two nodes), as node 0's lookup reports it.
            r = nodes[0].client.lookup(c.ns, keys=c.keys)
            assert r.found == 8 and set(r.nodes) == set(names), r.nodes

            def held() -> dict[str, set[int]]:
                h = llmd.lookup(c.ns, c.tokens)["held"]
                return {pod: set(h.get(pod, {}).get("cpu", [])) for pod in names}

            want = {pod: {i for i, n in enumerate(r.nodes) if n == pod} for pod in names}
            wait_for(lambda: held() == want, describe=held)
            # Each node's leading run, as llm-d scores it, is the run kvtier's
            # lookup reports for that node.
            leading = llmd.lookup(c.ns, c.tokens)["leading"]
            for pod in names:
                run = next((i for i, n in enumerate(r.nodes) if n != pod), 8)
                assert leading.get(pod, 0) == run, (pod, leading, r.nodes)
            mine = sum(t.leading for t in r.tier_counts if t.node == names[0])
            assert mine == next((i for i, n in enumerate(r.nodes) if n != names[0]), 8)
    finally:
        for n in nodes:
            n.stop()
