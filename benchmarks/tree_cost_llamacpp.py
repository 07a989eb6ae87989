"""What a token tree costs in llama.cpp: per-token sequence ids (one sequence per node, ancestors shared by
``llama_memory_seq_cp``) vs a chain block of the same number of tokens, on the target GGUF.

A tree of n nodes after a history is scored in ONE ``llama_decode``: the history is copied (metadata only, unified
KV) into every node's sequence, and each node's token carries its own sequence and those of its descendants, so
it attends exactly to the history and its ancestors. Prints the median seconds (and single-step units) of a chain
of n tokens and of a binary (top-2) tree of n nodes, and the expected accepted length either buys at the
acceptance levels given, so the break-even is visible. Not a test: nothing is asserted.

    python benchmarks/tree_cost_llamacpp.py --threads 2 --repeats 5
"""

from __future__ import annotations

import argparse
import statistics
import time

import llama_cpp as L

from verispec import models
from verispec.core.schedule import expected_tokens


def binary_tree(n: int) -> list[int]:
    """Parents of the first n nodes of a complete binary tree in BFS order (-1 = the root)."""
    return [-1 if i < 2 else (i - 2) // 2 for i in range(n)]


def depth_of(parents: list[int]) -> list[int]:
    d: list[int] = []
    for p in parents:
        d.append(1 if p < 0 else d[p] + 1)
    return d


def main() -> None:
    L.llama_backend_init()
    mp = L.llama_model_default_params()
    model = L.llama_model_load_from_file(str(models.gguf_path(models.DEFAULT_TARGET)).encode(), mp)
    cp = L.llama_context_default_params()
    cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_seq_max, cp.kv_unified = 1024, 512, 512, 64, True
    cp.n_threads = cp.n_threads_batch = ARGS.threads
    ctx = L.llama_init_from_model(model, cp)
    mem = L.llama_get_memory(ctx)
    batch = L.llama_batch_init(512, 0, 64)
    hist = [(100 + 7 * i) % 150000 for i in range(ARGS.context)]

    def decode(entries: list[tuple[int, int, list[int]]]) -> None:
        for j, (tok, pos, seqs) in enumerate(entries):
            batch.token[j], batch.pos[j], batch.n_seq_id[j], batch.logits[j] = tok, pos, len(seqs), True
            for s, sid in enumerate(seqs):
                batch.seq_id[j][s] = sid
        batch.n_tokens = len(entries)
        if L.llama_decode(ctx, batch) != 0:
            raise RuntimeError("llama_decode failed")

    L.llama_memory_clear(mem, True)
    decode([(t, i, [0]) for i, t in enumerate(hist[:-1])])
    h = len(hist) - 1  # positions 0..h-1 in sequence 0; the root token is fed with each block

    def chain(n: int) -> float:
        t0 = time.perf_counter()
        decode([(hist[-1], h, [0])] + [(7, h + 1 + i, [0]) for i in range(n)])
        dt = time.perf_counter() - t0
        L.llama_memory_seq_rm(mem, 0, h, -1)
        return dt

    def tree(n: int) -> float:
        parents = binary_tree(n)
        depth = depth_of(parents)
        desc: list[set[int]] = [set() for _ in range(n)]
        for i in range(n - 1, -1, -1):
            p = parents[i]
            if p >= 0:
                desc[p] |= desc[i] | {i}
        t0 = time.perf_counter()
        for i in range(n):  # node i's sequence (1 + i) sees the history
            L.llama_memory_seq_cp(mem, 0, 1 + i, -1, -1)
        entries = [(hist[-1], h, [0] + [1 + i for i in range(n)])]
        entries += [(7 + i, h + depth[i], [1 + i] + [1 + j for j in sorted(desc[i])]) for i in range(n)]
        decode(entries)
        dt = time.perf_counter() - t0
        for i in range(n):
            L.llama_memory_seq_rm(mem, 1 + i, -1, -1)
        L.llama_memory_seq_rm(mem, 0, h, -1)
        return dt

    single = statistics.median(chain(0) for _ in range(ARGS.repeats))
    print(f"single step after {ARGS.context} tokens: {1000 * single:.1f} ms ({ARGS.threads} threads)")
    print("| nodes n | chain of n: ms (steps) | binary tree of n: ms (steps) | tree depth | E[tokens] chain alpha=.7 "
          "| E[tokens] tree alpha2=.9 |")
    print("|---|---|---|---|---|---|")
    for n in ARGS.nodes:
        c = statistics.median(chain(n) for _ in range(ARGS.repeats))
        t = statistics.median(tree(n) for _ in range(ARGS.repeats))
        d = max(depth_of(binary_tree(n)))
        print(f"| {n} | {1000 * c:.1f} ({c / single:.2f}) | {1000 * t:.1f} ({t / single:.2f}) | {d} | "
              f"{expected_tokens(0.7, n):.2f} | {expected_tokens(0.9, d):.2f} |")
    L.llama_batch_free(batch)
    L.llama_free(ctx)
    L.llama_model_free(model)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--nodes", type=int, nargs="+", default=[2, 4, 6, 8, 14])
    ARGS = ap.parse_args()
    main()
