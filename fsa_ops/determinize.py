"""determinize (host-side weighted subset construction) in the tropical (k2's default) or log semiring.

The input must be an epsilon-free acceptor (label 0 raises ValueError; k2 would treat 0 as an ordinary
symbol) without integer attributes: k2 returns ragged aux_labels here, which this layout does not carry, so
transducers raise ValueError (determinize an acceptor, e.g. `project(fsa)`, instead). Float attributes are
dropped. The output is deterministic and arc-sorted, states numbered in breadth-first discovery order with
the final state last; residual weights are pushed towards the final state (no weight pushing, as k2's
default kNoWeightPushing: each arc carries the semiring sum of what it covers). Subsets are compared with
residuals rounded to `delta`; `max_states` guards against non-determinizable (non-twins) cyclic input.
"""
from __future__ import annotations

import math

import numpy as np

from fsa_ops.fsa import Fsa
from fsa_ops.host import as_numpy, build, map_fsas

__all__ = ["determinize"]


def _plus(log):
    if log:
        def f(a, b):
            if a == -math.inf:
                return b
            if b == -math.inf:
                return a
            m = max(a, b)
            return m + math.log1p(math.exp(-abs(a - b)))
        return f
    return max


def _determinize_one(fsa: Fsa, log_semiring: bool, delta: float, max_states: int) -> Fsa:
    ns = int(fsa.num_states)
    int_attrs = [k for k, v in fsa.attrs.items() if np.asarray(v).dtype.kind in "iu"]
    if int_attrs:
        raise ValueError(f"determinize: integer attributes {int_attrs} (e.g. aux_labels) are not supported; "
                         f"determinize an acceptor (project the transducer first)")
    if ns == 0:
        return build([], [], [], [], 0, {})
    if np.any(fsa.label == 0):
        raise ValueError("determinize: the input has epsilon arcs (label 0); call remove_epsilon first")
    plus = _plus(log_semiring)
    final = ns - 1
    src, dst, lab, sc = fsa.src.tolist(), fsa.dst.tolist(), fsa.label.tolist(), fsa.score.astype(
        np.float64).tolist()
    leaving = [[] for _ in range(ns)]
    for i, s in enumerate(src):
        leaving[s].append(i)
    start = ((0, 0.0),)
    ids = {(0,): 0}
    subsets = [start]
    FINAL = -2
    o_src, o_dst, o_lab, o_sc = [], [], [], []
    q = 0
    while q < len(subsets):
        sub = subsets[q]
        by_label = {}
        for st, r in sub:
            for a in leaving[st]:
                by_label.setdefault(lab[a], []).append((dst[a], r + sc[a]))
        for l in sorted(by_label, key=lambda x: x & 0xFFFFFFFF):
            cands = by_label[l]
            w = -math.inf
            for _, v in cands:
                w = plus(w, v)
            if l == -1:
                o_src.append(q); o_dst.append(FINAL); o_lab.append(-1); o_sc.append(w)  # noqa: E702
                continue
            res = {}
            for d, v in cands:
                res[d] = plus(res.get(d, -math.inf), v - w)
            items = tuple(sorted(res.items()))
            key = tuple(x for d, r in items for x in (d, round(r / delta)))
            i = ids.get(key)
            if i is None:
                i = ids[key] = len(subsets)
                subsets.append(items)
                if len(subsets) > max_states:
                    raise ValueError(f"determinize: more than max_states={max_states} states; the input may "
                                     f"not be determinizable in this semiring (cycles without the twins property)")
            o_src.append(q); o_dst.append(i); o_lab.append(l); o_sc.append(w)  # noqa: E702
        q += 1
    o_dst = np.array(o_dst, np.int64)
    if not np.any(o_dst == FINAL):
        return build([], [], [], [], 0, {})
    n_out = len(subsets) + 1
    o_dst[o_dst == FINAL] = n_out - 1
    return build(o_src, o_dst, o_lab, o_sc, n_out, {})


def determinize(fsa: Fsa, log_semiring: bool = False, delta: float = 1e-6, max_states: int = 10_000_000) -> Fsa:
    """Determinize an epsilon-free acceptor (see the module docstring). Single Fsa or batch."""
    fsa = as_numpy(fsa)
    fsa = fsa.replace(attrs={k: v for k, v in fsa.attrs.items() if np.asarray(v).dtype.kind not in "f"})
    return map_fsas(lambda f: _determinize_one(f, log_semiring, delta, max_states), fsa)
