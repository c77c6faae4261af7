"""connect: keep only states that are both accessible (from the start) and co-accessible (to the final)."""
from __future__ import annotations

import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import breadth_first_order  # scipy ships with jax (a hard dependency)

from fsa_ops.fsa import Fsa, create_fsa_vec
from fsa_ops.host import as_numpy, empty_like, renumber

__all__ = ["connect", "accessible_states", "coaccessible_states"]


def _reach(a, b, ns, start):
    if ns == 0:
        return np.zeros(0, bool)
    g = csr_matrix((np.ones(len(a), np.int8), (a, b)), shape=(ns, ns))
    seen = np.zeros(ns, bool)
    seen[breadth_first_order(g, start, directed=True, return_predecessors=False)] = True
    return seen


def accessible_states(fsa: Fsa) -> np.ndarray:
    """bool[num_states]: reachable from the start state (single Fsa)."""
    return _reach(np.asarray(fsa.src), np.asarray(fsa.dst), int(fsa.num_states), 0)


def coaccessible_states(fsa: Fsa) -> np.ndarray:
    """bool[num_states]: can reach the final state (single Fsa)."""
    ns = int(fsa.num_states)
    return _reach(np.asarray(fsa.dst), np.asarray(fsa.src), ns, ns - 1)


def _connect_one(fsa: Fsa, ret_arc_map: bool):
    ns = int(fsa.num_states)
    keep = accessible_states(fsa) & coaccessible_states(fsa) if ns else np.zeros(0, bool)
    if ns == 0 or not keep[0] or not keep[ns - 1]:
        e = empty_like(fsa)
        return (e, np.zeros(0, np.int32)) if ret_arc_map else e
    return renumber(fsa, np.nonzero(keep)[0], ret_arc_map=ret_arc_map)


def connect(fsa: Fsa, ret_arc_map: bool = False):
    """Remove states that are not accessible or not co-accessible (and their arcs), keeping the order of the
    rest, as k2's connect. An FSA without an accepting path becomes the empty FSA. Works on cyclic FSAs."""
    fsa = as_numpy(fsa)
    if not fsa.is_batch:
        return _connect_one(fsa, ret_arc_map)
    outs = [_connect_one(f, True) for f in fsa]
    vec = create_fsa_vec([o for o, _ in outs])
    if not ret_arc_map:
        return vec
    amap = np.full(vec.label.shape, -1, np.int32)
    for b, (_, m) in enumerate(outs):
        amap[b, :len(m)] = m
    return vec, amap
