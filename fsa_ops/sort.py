"""arc_sort and top_sort (k2 semantics), host-side and vectorised with numpy."""
from __future__ import annotations

import numpy as np

from fsa_ops.fsa import Fsa, create_fsa_vec
from fsa_ops.host import as_numpy, empty_like, map_fsas, renumber

__all__ = ["arc_sort", "top_sort"]


def _arc_sort_one(fsa: Fsa):
    # k2's Arc::operator<: label compared as unsigned (so -1 comes last), then dest_state
    order = np.lexsort((fsa.dst, fsa.label.astype(np.int64) & 0xFFFFFFFF, fsa.src)).astype(np.int32)
    out = Fsa(fsa.src[order], fsa.dst[order], fsa.label[order], fsa.score[order], fsa.num_states,
              fsa.num_arcs, {k: v[order] for k, v in fsa.attrs.items()}, max_states=fsa.max_states)
    return out, order


def arc_sort(fsa: Fsa, ret_arc_map: bool = False):
    """Sort the arcs leaving each state by label (unsigned, so -1 last) then dest state, as k2.

    Single Fsa or batch; `ret_arc_map` also returns arc_map (new arc -> input arc; for a batch, indexes
    into each FSA's own arcs, padded with -1)."""
    fsa = as_numpy(fsa)
    if not fsa.is_batch:
        out, order = _arc_sort_one(fsa)
        return (out, order) if ret_arc_map else out
    outs = [_arc_sort_one(f) for f in fsa]
    vec = create_fsa_vec([o for o, _ in outs], pad_arcs_to=fsa.label.shape[1], max_states=fsa.max_states)
    if not ret_arc_map:
        return vec
    amap = np.full(fsa.label.shape, -1, np.int32)
    for b, (_, m) in enumerate(outs):
        amap[b, :len(m)] = m
    return vec, amap


def _top_sort_one(fsa: Fsa, ret_arc_map: bool):
    ns = int(fsa.num_states)
    if ns == 0:
        e = empty_like(fsa)
        return (e, np.zeros(0, np.int32)) if ret_arc_map else e
    final = ns - 1
    src, dst = fsa.src.astype(np.int64), fsa.dst.astype(np.int64)
    real = src != dst  # self-loops are allowed and ignored
    rsrc, rdst = src[real], dst[real]
    indeg = np.bincount(rdst, minlength=ns)
    if indeg[0] > 0:
        raise ValueError("top_sort: arcs (other than self-loops) enter the start state; k2's top_sort requires "
                         "none (call connect first if they come from unreachable states)")
    order_r = np.argsort(rsrc, kind="stable")
    rsrc, rdst = rsrc[order_r], rdst[order_r]
    splits = np.searchsorted(rsrc, np.arange(ns + 1))
    done = np.zeros(ns, bool)
    batch = np.nonzero(indeg == 0)[0]
    batch = batch[batch != final] if ns > 1 else batch
    order = []
    while len(batch):
        order.append(batch)
        done[batch] = True
        starts, ends = splits[batch], splits[batch + 1]
        lens = ends - starts
        if lens.sum() == 0:
            break
        arc_idx = np.repeat(starts - np.cumsum(lens) + lens, lens) + np.arange(lens.sum())
        touched, dec = np.unique(rdst[arc_idx], return_counts=True)  # O(level size), not O(num_states)
        indeg[touched] -= dec
        batch = touched[(indeg[touched] == 0) & ~done[touched] & (touched != final)]
    order = np.concatenate(order) if order else np.zeros(0, np.int64)
    if ns > 1:
        order = np.append(order, final)
    if len(order) != ns:
        raise ValueError("top_sort: the FSA has cycles other than self-loops")
    return renumber(fsa, order, ret_arc_map=ret_arc_map)


def top_sort(fsa: Fsa, ret_arc_map: bool = False):
    """Renumber states so that every arc goes to a higher-or-equal state (k2's TopSort: Kahn's algorithm in
    batches, start state first, final state last; self-loops allowed; other cycles raise ValueError)."""
    fsa = as_numpy(fsa)
    if not fsa.is_batch:
        return _top_sort_one(fsa, ret_arc_map)
    if not ret_arc_map:
        return map_fsas(lambda f: _top_sort_one(f, False), fsa)
    outs = [_top_sort_one(f, True) for f in fsa]
    vec = create_fsa_vec([o for o, _ in outs])
    amap = np.full(vec.label.shape, -1, np.int32)
    for b, (_, m) in enumerate(outs):
        amap[b, :len(m)] = m
    return vec, amap
