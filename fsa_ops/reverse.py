"""reverse (host-side, numpy): the FSA that accepts each label sequence of the input reversed, with the same
score (k2's `reverse`; scores are sums, so the reverse weight equals the weight in both semirings).

Layout of the result, as k2's Reverse: the input's final state becomes the start state 0, the input's start
state becomes state num_states - 1, the other states keep their numbers, and a new final state num_states is
added. Every input arc s -> d becomes an arc d' -> s' (primes: the renumbering above) with the same label
(-1 becomes 0: the arcs into the old final state now leave the new start state) and score; a state's arcs
are its incoming arcs in input order. Last comes the new arc num_states - 1 -> num_states, label -1, score 0.
Attributes follow the arcs (arc_map); the new arc gets the filler 0 (so aux_labels keep their -1 on the arcs
that left the old final state, and the new final arc has aux_label 0, as in k2). The empty FSA stays empty;
an FSA with a single state (no arc can enter a final state that is also the start) raises ValueError.
"""
from __future__ import annotations

import numpy as np

from fsa_ops.fsa import Fsa, create_fsa_vec
from fsa_ops.host import as_numpy, empty_like, from_arc_map, pad_arc_maps

__all__ = ["reverse"]


def _reverse_one(fsa: Fsa, index: str):
    ns = int(fsa.num_states)
    if ns == 0:
        return empty_like(fsa), np.zeros(0, np.int32)
    if ns == 1:
        raise ValueError(f"fsa{index}: has a single state (start = final); k2's reverse needs 0 or >= 2 states")
    final = ns - 1
    old2new = np.arange(ns)
    old2new[0], old2new[final] = final, 0
    src, dst = np.asarray(fsa.src, np.int64), np.asarray(fsa.dst, np.int64)
    new_src = old2new[dst]
    order = np.argsort(new_src, kind="stable")       # a state's arcs: its incoming arcs in input order
    arc_map = np.append(order, -1)
    label = np.asarray(fsa.label)[order]
    out = from_arc_map(fsa, arc_map,
                       np.append(new_src[order], final), np.append(old2new[src[order]], ns),
                       np.append(np.where(label == -1, 0, label), -1),
                       np.append(np.asarray(fsa.score, np.float32)[order], np.float32(0)), ns + 1)
    return out, arc_map.astype(np.int32)


def reverse(fsa: Fsa, ret_arc_map: bool = False):
    """Reverse a single Fsa or each FSA of a batch (see the module docstring). `ret_arc_map`: also return
    arc_map (output arc -> input arc, -1 for the new final arc; per-FSA indexes, -1 padded for a batch), e.g.
    to carry gradients: ``jnp.where(arc_map >= 0, scores[arc_map], 0)``."""
    fsa = as_numpy(fsa)
    if not fsa.is_batch:
        out, amap = _reverse_one(fsa, "")
        return (out, amap) if ret_arc_map else out
    outs = [_reverse_one(f, f"[{i}]") for i, f in enumerate(fsa)]
    vec = create_fsa_vec([o for o, _ in outs]) if outs else fsa
    return (vec, pad_arc_maps([m for _, m in outs], vec.label.shape[1])) if ret_arc_map else vec
