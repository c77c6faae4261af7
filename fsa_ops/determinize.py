"""determinize (host-side): a deterministic equivalent on labels, for acceptors and (as k2) transducers.

The input must be epsilon-free (label 0 raises ValueError; k2 would treat 0 as an ordinary symbol). An FSA
that is already arc-sorted and deterministic keeps its arcs, as in k2 (its attributes are converted as
below, where k2 would return it untouched; k2 decides that for a whole batch, this code per FSA). The
output is deterministic and arc-sorted, states numbered in breadth-first discovery order, the final state
last; no weight pushing (k2's default kNoWeightPushing): weight is emitted as late as the structure allows.
`max_states` guards against input that is not determinizable (cycles without the twins property).

Acceptors without attributes (and, with `log_semiring=True`, acceptors with float attributes, which are then
dropped): weighted subset construction in the tropical (default) or log semiring; subsets are compared with
residuals rounded to `delta`.

Transducers (an integer or `Ragged` attribute such as aux_labels; tropical semiring only, as k2's
determinize) and tropical acceptors with float attributes: k2's algorithm. A determinized state is (base
input state, label sequence followed from it); each input state it reaches keeps its best path from the
base. After each label the base moves to the last state that all these best paths share, and the output arc
takes the weight of the path prefix it skipped and derives from those input arcs (k2's arc_derivs).
Attributes follow that ragged arc map (`remove_epsilon.attrs_from_arc_paths`): 1-D integer attributes become
`Ragged` (0, and -1 on final arcs, removed), Ragged ones are concatenated, float ones summed. So for each
label sequence the output carries the best input path's score and aux labels: equivalent as a weighted
transducer when the input is functional (one aux sequence per label sequence, e.g. an LG with
disambiguation symbols), as in k2.
"""
from __future__ import annotations

import math

import numpy as np

from fsa_ops.connect import connect
from fsa_ops.fsa import Fsa, create_fsa_vec
from fsa_ops.host import as_numpy, build
from fsa_ops.properties import ARC_SORTED_AND_DETERMINISTIC, get_properties
from fsa_ops.ragged import Ragged
from fsa_ops.remove_epsilon import attrs_from_arc_paths

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


def _is_transducer(fsa: Fsa) -> bool:
    return any(isinstance(v, Ragged) or np.asarray(v).dtype.kind in "iub" for v in fsa.attrs.values())


def _determinize_one(fsa: Fsa, log_semiring: bool, delta: float, max_states: int) -> Fsa:
    ns = int(fsa.num_states)
    derivs = _is_transducer(fsa) or (bool(fsa.attrs) and not log_semiring)
    if get_properties(fsa) & ARC_SORTED_AND_DETERMINISTIC:   # unchanged (k2), but attributes as below
        n = len(fsa.label)
        return fsa.replace(attrs=attrs_from_arc_paths(fsa, np.arange(n + 1), np.arange(n)) if derivs else {})
    if derivs:
        return _determinize_transducer(fsa, max_states)
    fsa = fsa.replace(attrs={})
    if ns == 0:
        return build([], [], [], [], 0, {})
    if np.any(fsa.label == 0):
        raise ValueError("determinize: the input has epsilon arcs (label 0); call remove_epsilon first")
    plus = _plus(log_semiring)
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
        for lbl in sorted(by_label, key=lambda x: x & 0xFFFFFFFF):
            cands = by_label[lbl]
            w = -math.inf
            for _, v in cands:
                w = plus(w, v)
            if lbl == -1:
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
            o_src.append(q); o_dst.append(i); o_lab.append(lbl); o_sc.append(w)  # noqa: E702
        q += 1
    o_dst = np.array(o_dst, np.int64)
    if not np.any(o_dst == FINAL):
        return build([], [], [], [], 0, {})
    n_out = len(subsets) + 1
    o_dst[o_dst == FINAL] = n_out - 1
    return build(o_src, o_dst, o_lab, o_sc, n_out, {})


def _determinize_transducer(fsa: Fsa, max_states: int) -> Fsa:
    """k2's determinization with arc derivs (see the module docstring), for one epsilon-free Fsa."""
    if np.any(fsa.label == 0):
        raise ValueError("determinize: the input has epsilon arcs (label 0); call remove_epsilon first")
    core, amap = connect(fsa.replace(attrs={}), ret_arc_map=True)   # (k2 requires connected input)
    amap = np.asarray(amap, np.int64)
    ns = int(core.num_states)
    if ns == 0:
        return core.replace(attrs=attrs_from_arc_paths(fsa, np.zeros(1, np.int64), np.zeros(0, np.int64)))
    final = ns - 1
    dst, lab, sc = core.dst.tolist(), core.label.tolist(), core.score.astype(np.float64).tolist()
    leaving = [[] for _ in range(ns)]
    for i, s in enumerate(core.src.tolist()):
        leaving[s].append(i)
    # a det state: key (base state, labels from it); elems: input state -> (score from base, best arc path)
    keys = [(0, ())]
    ids = {keys[0]: 0}
    elems = [{0: (0.0, ())}]
    o_src, o_dst, o_lab, o_sc, derivs = [], [], [], [], []
    q = 0
    while q < len(keys):
        base, seq = keys[q]
        by_label = {}
        cur, elems[q] = elems[q], None       # (processed once: free it)
        for t in sorted(cur):
            w, path = cur[t]
            for a in leaving[t]:
                nxt = by_label.setdefault(lab[a], {})
                old = nxt.get(dst[a])
                v = w + sc[a]
                if old is None or v > old[0]:
                    nxt[dst[a]] = (v, path + (a,))
        for lbl in sorted(by_label, key=lambda x: x & 0xFFFFFFFF):
            new = by_label[lbl]
            paths = [p for _, p in new.values()]
            k = min(len(p) for p in paths)       # longest common prefix = the most recent common ancestor
            first = paths[0]
            for p in paths[1:]:
                j = 0
                while j < k and p[j] == first[j]:
                    j += 1
                k = j
            prefix = first[:k]
            w0 = sum(sc[a] for a in prefix)
            new_base = dst[prefix[-1]] if k else base
            key = (new_base, (seq + (lbl,))[k:])
            i = ids.get(key)
            if i is None:
                i = ids[key] = len(keys)
                keys.append(key)
                elems.append({t: (v - w0, p[k:]) for t, (v, p) in new.items()})
                if len(keys) > max_states:
                    raise ValueError(f"determinize: more than max_states={max_states} states; the input may "
                                     f"not be determinizable (cycles without the twins property)")
            o_src.append(q); o_dst.append(i); o_lab.append(lbl); o_sc.append(w0); derivs.append(prefix)  # noqa
        q += 1
    fin = ids[(final, ())]   # (a connected input reaches its final state)
    order = np.array([j for j in range(len(keys)) if j != fin] + [fin], np.int64)
    new_id = np.empty(len(keys), np.int64)
    new_id[order] = np.arange(len(keys))
    o_src, o_dst = new_id[np.asarray(o_src, np.int64)], new_id[np.asarray(o_dst, np.int64)]
    perm = np.argsort(o_src, kind="stable")
    lens = np.array([len(derivs[j]) for j in perm], np.int64)
    splits = np.concatenate([[0], np.cumsum(lens)])
    flat = np.fromiter((a for j in perm for a in derivs[j]), np.int64, count=int(splits[-1]))
    out = build(o_src[perm], o_dst[perm], np.asarray(o_lab, np.int32)[perm], np.asarray(o_sc)[perm], len(keys), {})
    return out.replace(attrs=attrs_from_arc_paths(fsa, splits, amap[flat]))


def determinize(fsa: Fsa, log_semiring: bool = False, delta: float = 1e-6, max_states: int = 10_000_000) -> Fsa:
    """Determinize an epsilon-free acceptor or transducer (see the module docstring). Single Fsa or batch.

    `log_semiring=True` (acceptors only; k2 has the tropical semiring) log-sums the weights of paths merged."""
    if not isinstance(log_semiring, (bool, np.bool_)):
        raise TypeError(f"determinize: log_semiring must be a bool, got {log_semiring!r} (k2's weight_pushing_type "
                        f"is not supported: this code does no weight pushing, k2's default)")
    fsa = as_numpy(fsa)
    if log_semiring and _is_transducer(fsa):
        raise ValueError("determinize: log_semiring=True needs an acceptor; integer or Ragged attributes "
                         f"{sorted(fsa.attrs)} are carried in the tropical semiring only (as k2)")
    fsas = list(fsa) if fsa.is_batch else [fsa]
    if any(np.any(f.label == 0) for f in fsas):
        raise ValueError("determinize: the input has epsilon arcs (label 0); call remove_epsilon first")
    outs = [_determinize_one(f, log_semiring, delta, max_states) for f in fsas]
    return create_fsa_vec(outs) if fsa.is_batch else outs[0]
