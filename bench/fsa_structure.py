"""Benchmark the host-side structure ops.

1. On a random acyclic 10^6-arc graph with shuffled state ids and a ragged aux_labels (0-3 words per arc, k2's
   RaggedTensor attribute): arc_sort, connect, top_sort, expand_ragged_attributes, invert (which expands the ragged
   aux_labels first), to_str / Fsa.from_str with the ragged column, and batching (create_fsa_vec, fsavec[i],
   index_fsa, cat).
2. compose(L, G) of a lexicon transducer (phones -> words) with a bigram word acceptor (~10^5 arcs out),
   then connect, remove_epsilon and determinize (tropical and log) of its phone-level acceptor.
Writes bench/results/fsa_structure.md.   Usage: python bench/fsa_structure.py [--arcs N] [--words W]
"""
import argparse
import datetime
import os
import platform
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from fsa_ops.connect import connect  # noqa: E402
from fsa_ops.determinize import determinize  # noqa: E402
from fsa_ops.expand import expand_ragged_attributes  # noqa: E402
from fsa_ops.fsa import Fsa, create_fsa_vec, to_str  # noqa: E402
from fsa_ops.fsa_vec import cat, index_fsa  # noqa: E402
from fsa_ops.intersect import compose  # noqa: E402
from fsa_ops.ragged import Ragged  # noqa: E402
from fsa_ops.remove_epsilon import remove_epsilon  # noqa: E402
from fsa_ops.sort import arc_sort, top_sort  # noqa: E402
from fsa_ops.unary import invert, project  # noqa: E402


def timed(rows, name, fn, *args, **kw):
    t = time.perf_counter()
    out = fn(*args, **kw)
    dt = time.perf_counter() - t
    n_out = out.label.shape[-1] if hasattr(out, "label") else len(out)
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
    n = len(f.label)
    words = rng.integers(0, 4, n)
    splits = np.concatenate([[0], np.cumsum(words)])
    f = f.replace(aux_labels=Ragged.from_row_splits(splits, rng.integers(1, 1000, splits[-1])))
    tag = f"{n} arcs, ragged aux_labels with {splits[-1]} words"
    timed(rows, f"arc_sort ({tag})", arc_sort, f)
    timed(rows, f"connect ({tag})", connect, f)
    timed(rows, f"top_sort ({tag})", top_sort, f)
    timed(rows, f"expand_ragged_attributes ({tag})", expand_ragged_attributes, f)
    timed(rows, f"invert ({tag}: expands first)", invert, f)
    text = timed(rows, f"to_str ({tag}; output = characters)", to_str, f)
    g = timed(rows, f"Fsa.from_str ({tag})", Fsa.from_str, text, ragged_label_names=["aux_labels"])
    assert g.aux_labels == f.aux_labels
    vec = timed(rows, f"create_fsa_vec([f, f]) ({2 * n} arcs; output = arcs per FSA)", create_fsa_vec, [f, f])
    timed(rows, "fsavec[1] (trimmed host copy of one FSA)", vec.__getitem__, 1)
    timed(rows, "index_fsa(fsavec, [1, 0, 1]) (output = arcs per FSA)", index_fsa, vec, np.array([1, 0, 1]))
    timed(rows, "cat([fsavec, fsavec]) (output = arcs per FSA)", cat, [vec, vec])
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
        load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
        fh.write(f"`python bench/fsa_structure.py --arcs {args.arcs} --words {args.words} --fanout {args.fanout}`"
                 f" on {datetime.date.today().isoformat()}, {platform.processor() or platform.machine()}, "
                 f"{os.cpu_count()} cores, load average {load} when measured (shared with other jobs: "
                 f"timings are upper bounds), numpy {np.__version__}. One run each (wall clock).\n\n")
        fh.write("| op | seconds | output arcs |\n|---|---:|---:|\n")
        for name, dt, n in rows:
            fh.write(f"| {name} | {dt:.3f} | {n} |\n")
    print("wrote", out)

    import collect_results  # noqa: E402
    collect_results.refresh_after(out)


if __name__ == "__main__":
    main()
