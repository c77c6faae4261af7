"""Benchmark the host-side structure ops.

1. arc_sort / connect / top_sort (+ invert, to_str) on a random acyclic 10^6-arc graph with shuffled state ids.
2. compose(L, G) of a lexicon transducer (phones -> words) with a bigram word acceptor (~10^5 arcs out),
   then connect, remove_epsilon and determinize (tropical and log) of its phone-level acceptor.
Writes bench/results/fsa_structure.md.   Usage: python bench/fsa_structure.py [--arcs N] [--words W]
"""
import argparse
import os
import platform
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from fsa_ops.connect import connect  # noqa: E402
from fsa_ops.determinize import determinize  # noqa: E402
from fsa_ops.fsa import Fsa, to_str  # noqa: E402
from fsa_ops.intersect import compose  # noqa: E402
from fsa_ops.remove_epsilon import remove_epsilon  # noqa: E402
from fsa_ops.sort import arc_sort, top_sort  # noqa: E402
from fsa_ops.unary import invert, project  # noqa: E402


def timed(rows, name, fn, *args, **kw):
    t = time.perf_counter()
    out = fn(*args, **kw)
    dt = time.perf_counter() - t
    n_out = len(out.label) if hasattr(out, "label") else len(out)
    rows.append((name, dt, n_out))
    print(f"{name:55s} {dt:8.3f} s   -> {n_out} arcs", flush=True)
    return out


def random_graph(num_arcs, rng):
    ns = num_arcs // 5
    src = rng.integers(0, ns - 1, num_arcs)
    span = rng.geometric(0.05, num_arcs)
    dst = np.minimum(src + span, ns - 1)
    lab = np.where(dst == ns - 1, -1, rng.integers(0, 500, num_arcs))
    # shuffle the middle state ids so that the graph is not top-sorted
    perm = np.concatenate([[0], 1 + rng.permutation(ns - 2), [ns - 1]])
    f = Fsa.from_arcs(perm[src], perm[dst], lab, rng.standard_normal(num_arcs).astype(np.float32),
                      num_states=ns, aux_labels=np.where(lab == -1, -1, rng.integers(0, 100, num_arcs)))
    return f


def lexicon(num_words, num_phones, rng):
    """L: phones -> words. From state 0, each word is a chain of its phones (first arc outputs the word,
    the others output epsilon) back to state 0; state 0 -> final with -1."""
    src, dst, lab, aux = [], [], [], []
    nxt = 1
    prons = set()
    for w in range(1, num_words + 1):
        while True:
            pron = tuple(rng.integers(1, num_phones + 1, rng.integers(2, 6)).tolist())
            if pron not in prons:
                prons.add(pron)
                break
        prev = 0
        for i, p in enumerate(pron):
            d = 0 if i == len(pron) - 1 else nxt
            if d:
                nxt += 1
            src.append(prev); dst.append(d); lab.append(p); aux.append(w if i == 0 else 0)  # noqa: E702
            prev = d
    final = nxt
    src.append(0); dst.append(final); lab.append(-1); aux.append(-1)  # noqa: E702
    return Fsa.from_arcs(np.array(src), np.array(dst), np.array(lab), np.zeros(len(src), np.float32),
                         num_states=final + 1, aux_labels=np.array(aux))


def bigram(num_words, fanout, rng):
    """G: word acceptor; state w = last word; each state has `fanout` successor words and a final arc."""
    ns = num_words + 2
    final = ns - 1
    src = np.repeat(np.arange(num_words + 1), fanout)
    words = rng.integers(1, num_words + 1, len(src))
    scores = -rng.exponential(1.0, len(src)).astype(np.float32)
    src = np.concatenate([src, np.arange(num_words + 1)])
    dst = np.concatenate([words, np.full(num_words + 1, final)])
    lab = np.concatenate([words, np.full(num_words + 1, -1)])
    sc = np.concatenate([scores, np.full(num_words + 1, -2.0, np.float32)])
    g = Fsa.from_arcs(src, dst, lab, sc, num_states=ns)
    return arc_sort(g)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--arcs", type=int, default=1_000_000)
    ap.add_argument("--words", type=int, default=3000)
    ap.add_argument("--fanout", type=int, default=30)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    rows = []
    t = time.perf_counter()
    f = random_graph(args.arcs, rng)
    print(f"built random graph: {len(f.label)} arcs, {int(f.num_states)} states in {time.perf_counter()-t:.2f}s")
    timed(rows, f"arc_sort ({len(f.label)} arcs)", arc_sort, f)
    timed(rows, f"connect ({len(f.label)} arcs)", connect, f)
    timed(rows, f"top_sort ({len(f.label)} arcs)", top_sort, f)
    timed(rows, f"invert ({len(f.label)} arcs)", invert, f)
    text = timed(rows, f"to_str ({len(f.label)} arcs; output = characters)", to_str, f)
    timed(rows, f"Fsa.from_str ({len(f.label)} arcs, transducer)", Fsa.from_str, text, acceptor=False)
    L = lexicon(args.words, 40, rng)
    G = bigram(args.words, args.fanout, rng)
    print(f"L: {len(L.label)} arcs, G: {len(G.label)} arcs")
    LG = timed(rows, f"compose(L {len(L.label)} arcs, G {len(G.label)} arcs)", compose, L, G)
    LG = timed(rows, "connect(LG)", connect, LG)
    A = project(LG)  # phone-level acceptor
    W = invert(LG)  # word labels, epsilon on word-internal arcs
    timed(rows, f"remove_epsilon(invert(LG)) (tropical; {int((W.label == 0).sum())} eps arcs)", remove_epsilon, W)
    timed(rows, "determinize(phone acceptor of LG, tropical)", determinize, A)
    timed(rows, "determinize(phone acceptor of LG, log)", determinize, A, log_semiring=True)
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "fsa_structure.md")
    with open(out, "w") as fh:
        fh.write("# fsa_ops host-side structure ops\n\n")
        fh.write(f"`python bench/fsa_structure.py --arcs {args.arcs} --words {args.words} --fanout {args.fanout}`"
                 f" on {platform.processor() or platform.machine()}, {os.cpu_count()} cores "
                 f"(shared with other jobs when measured), numpy {np.__version__}.\n\n")
        fh.write("| op | seconds | output arcs |\n|---|---:|---:|\n")
        for name, dt, n in rows:
            fh.write(f"| {name} | {dt:.3f} | {n} |\n")
    print("wrote", out)

    import collect_results  # noqa: E402
    collect_results.refresh_after(out)


if __name__ == "__main__":
    main()
