"""expand_ragged_attributes (k2): turn Ragged attributes into one value per arc by expanding arcs into chains.

An arc whose ragged rows hold up to n values becomes a chain of max(1, n) arcs through n - 1 new states: the
first arc keeps the score, the label and the other attributes' values (the rest get score 0, label 0 and the
filler 0; a Ragged attribute that is not expanded keeps its row on the first arc, empty rows on the rest); the
k-th arc carries the k-th value of each expanded row (0 past its end). An arc into the final state keeps label -1
on its last arc, and its expanded values there are -1: a row of a final arc that does not end in -1 gets one more
arc for it. Elsewhere -1 values become 0. The new states of a state's chains follow it in the numbering, in arc
order, so a top-sorted FSA stays top-sorted. Vectorised numpy, O(output arcs) plus one stable sort.
"""
from __future__ import annotations

from typing import List, Optional

import numpy as np

from fsa_ops.fsa import Fsa, create_fsa_vec, fix_final_labels
from fsa_ops.host import as_numpy, build, csr, index_attr, pad_arc_maps
from fsa_ops.ragged import is_ragged

__all__ = ["expand_ragged_attributes"]


def _chain_lengths(final_arc: np.ndarray, rows) -> np.ndarray:
    """int64[A]: arcs in each chain, max(1, longest row) plus one for a final arc whose row ends without -1."""
    n = np.ones(len(final_arc), np.int64)
    for r in rows:
        lens = r.lengths.astype(np.int64)
        last = r.values[np.arange(len(lens)), np.maximum(lens - 1, 0)] if r.width else np.zeros(len(lens), np.int32)
        ext = np.where(final_arc & (lens >= 1) & (last != -1), lens + 1, lens)
        n = np.maximum(n, ext)
    return n


def _expand_one(fsa: Fsa, names: List[str]):
    ns = int(fsa.num_states)
    A = len(fsa.label)
    rows = [fsa.attrs[k] for k in names]
    final_arc = fsa.label == -1
    n = _chain_lengths(final_arc, rows)
    extra = n - 1
    excl = np.concatenate([[0], np.cumsum(extra)])                    # extra states before each arc
    splits = csr(fsa.src.astype(np.int64), ns)
    new_id = np.arange(ns) + excl[splits[:-1]] if ns else np.zeros(0, np.int64)   # original state -> new id
    arc = np.repeat(np.arange(A), n)                                  # output arc -> input arc
    pos = np.arange(len(arc)) - np.repeat(np.cumsum(n) - n, n)        # position in its chain
    last = pos == n[arc] - 1
    chain0 = fsa.src.astype(np.int64)[arc] + 1 + excl[arc]            # the chain's first new state
    src = np.where(pos == 0, new_id[fsa.src[arc]] if A else 0, chain0 + pos - 1)
    dst = np.where(last, new_id[fsa.dst[arc]] if A else 0, chain0 + pos)
    fin = final_arc[arc]
    label = np.where(fin, np.where(last, -1, 0), np.where(pos == 0, fsa.label[arc], 0)).astype(np.int32)
    score = np.where(pos == 0, fsa.score[arc], 0).astype(np.float32)
    arc_map = np.where(pos == 0, arc, -1)
    order = np.argsort(src, kind="stable")
    src, dst, label, score, arc_map, arc, pos, fin = (x[order] for x in (src, dst, label, score, arc_map, arc, pos,
                                                                         fin))
    out_final = label == -1
    attrs = {k: index_attr(v, arc_map) for k, v in fsa.attrs.items() if k not in names}
    for k, r in zip(names, rows):
        inside = pos < r.lengths[arc]
        val = np.where(inside, r.values[arc, np.minimum(pos, max(r.width - 1, 0))] if r.width else 0, 0)
        val = np.where((val == 0) | (val == -1), np.where(out_final, -1, 0), val).astype(np.int32)
        bad = out_final & (val != -1)
        if bad.any():
            i = int(arc[np.nonzero(bad)[0][0]])
            raise ValueError(f"expand_ragged_attributes: attribute {k!r} of arc {i} (into the final state) has "
                             f"{r.tolist()[i]}; values other than -1 cannot sit on the final arc")
        attrs[k] = val
    total_states = ns + int(excl[-1])
    out = build(src, dst, label, score, total_states, attrs)
    if "aux_labels" in out.attrs and not is_ragged(out.attrs["aux_labels"]) and out.attrs["aux_labels"].ndim == 1:
        out.attrs["aux_labels"] = fix_final_labels(out, out.attrs["aux_labels"], "aux_labels")
    return out, arc_map.astype(np.int32)


def expand_ragged_attributes(fsas: Fsa, ret_arc_map: bool = False,
                             ragged_attribute_names: Optional[List[str]] = None):
    """k2's expand_ragged_attributes: the Ragged attributes named (default: all of them) become int32 [..., A']
    attributes, arcs expanded into chains as the module docstring says. Single Fsa or batch.

    Returns the new Fsa, and with `ret_arc_map` also arc_map int32[..., A'] (output arc -> the input arc whose
    score it carries, -1 for the later arcs of a chain; a batch's maps index each FSA's own arcs, padded with
    -1). With no Ragged attribute to expand, returns `fsas` itself (and the identity map)."""
    fsas = as_numpy(fsas, "fsas")
    if ragged_attribute_names is None:
        names = sorted(k for k, v in fsas.attrs.items() if is_ragged(v))
    else:
        names = list(ragged_attribute_names)
        for k in names:
            if k not in fsas.attrs or not is_ragged(fsas.attrs[k]):
                raise ValueError(f"ragged_attribute_names: {k!r} is not a Ragged attribute of fsas "
                                 f"(Ragged ones: {sorted(a for a, v in fsas.attrs.items() if is_ragged(v))})")
    if not names:
        if not ret_arc_map:
            return fsas
        ident = np.broadcast_to(np.arange(fsas.label.shape[-1], dtype=np.int32), fsas.label.shape).copy()
        if fsas.is_batch:
            ident[ident >= fsas.num_arcs[:, None]] = -1
        return fsas, ident
    if not fsas.is_batch:
        out, amap = _expand_one(fsas, names)
        return (out, amap) if ret_arc_map else out
    outs = [_expand_one(f, names) for f in fsas]
    vec = create_fsa_vec([o for o, _ in outs]) if outs else fsas
    if not ret_arc_map:
        return vec
    return vec, pad_arc_maps([m for _, m in outs], vec.label.shape[1])
