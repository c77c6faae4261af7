"""intersect and compose (k2 semantics, host-side).

Epsilons with `treat_epsilons_specially=True` (k2's host algorithm): an epsilon arc on one side advances that
side alone (it matches an implicit epsilon self-loop on the other side); epsilon never matches epsilon. So if
both inputs have epsilons, a path can appear more than once (no epsilon filter, as in k2): the result is
equivalent in the tropical semiring, and in the log semiring when at most one side has epsilons.
With False, 0 is an ordinary symbol. Label -1 matches only -1.

Attributes (k2's rules): an attribute on one side only is copied via its arc map (0, or an empty row for a
`Ragged` attribute, where that side has no arc); on both sides, float attributes are summed and any other
kind raises ValueError (as k2's code). Scores are summed.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from fsa_ops.fsa import Fsa, create_fsa_vec
from fsa_ops.host import as_numpy, build, index_attr
from fsa_ops.ragged import Ragged
from fsa_ops.sort import arc_sort
from fsa_ops.unary import invert

__all__ = ["intersect", "compose"]


def _arc_sorted(f: Fsa) -> bool:
    src = f.src.astype(np.int64)
    ulab = f.label.astype(np.int64) & 0xFFFFFFFF
    same = src[1:] == src[:-1]
    return not np.any(same & (ulab[1:] < ulab[:-1]))


def _intersect_one(a: Fsa, b: Fsa, eps: bool):
    na, nb = int(a.num_states), int(b.num_states)
    if na == 0 or nb == 0:
        return None
    fa, fb = na - 1, nb - 1
    a_src, a_dst, a_lab, a_sc = (x.tolist() for x in (a.src, a.dst, a.label, a.score))
    b_src, b_dst, b_lab, b_sc = (x.tolist() for x in (b.src, b.dst, b.label, b.score))
    a_leave = [[] for _ in range(na)]  # non-epsilon arcs (all arcs if not eps)
    a_eps = [[] for _ in range(na)]
    a_by_label = [dict() for _ in range(na)]
    for i, s in enumerate(a_src):
        lab = a_lab[i]
        if eps and lab == 0:
            a_eps[s].append(i)
        else:
            a_leave[s].append(i)
            a_by_label[s].setdefault(lab, []).append(i)
    b_by_label = [dict() for _ in range(nb)]
    b_count = [0] * nb
    b_eps = [[] for _ in range(nb)]
    for i, s in enumerate(b_src):
        lab = b_lab[i]
        if eps and lab == 0:
            b_eps[s].append(i)
        else:
            b_by_label[s].setdefault(lab, []).append(i)
            b_count[s] += 1
    ids = {(0, 0): 0}
    order = [(0, 0)]
    FINAL = -2
    o_src, o_dst, o_lab, o_sc, m_a, m_b = [], [], [], [], [], []

    def state(pa, pb):
        if pa == fa and pb == fb:
            return FINAL
        key = (pa, pb)
        i = ids.get(key)
        if i is None:
            i = ids[key] = len(order)
            order.append(key)
        return i

    q = 0
    while q < len(order):
        sa, sb = order[q]
        bl = b_by_label[sb]
        # matching arcs, in the order of a's arcs (iterate over the smaller side)
        if len(a_leave[sa]) <= b_count[sb]:
            pairs = [(ia, ib) for ia in a_leave[sa] for ib in bl.get(a_lab[ia], ())]
        else:
            al = a_by_label[sa]
            pairs = sorted((ia, ib) for lab, ibs in bl.items() for ia in al.get(lab, ()) for ib in ibs)
        # a's epsilon arcs come in a's arc order too (merged with the matches), then b's epsilon arcs
        if eps and a_eps[sa]:
            pairs = sorted(pairs + [(ia, -1) for ia in a_eps[sa]])
        for ia, ib in pairs:
            if ib < 0:
                o_src.append(q); o_dst.append(state(a_dst[ia], sb)); o_lab.append(0)  # noqa: E702
                o_sc.append(a_sc[ia]); m_a.append(ia); m_b.append(-1)  # noqa: E702
            else:
                o_src.append(q); o_dst.append(state(a_dst[ia], b_dst[ib])); o_lab.append(a_lab[ia])  # noqa: E702
                o_sc.append(a_sc[ia] + b_sc[ib]); m_a.append(ia); m_b.append(ib)  # noqa: E702
        if eps:
            for ib in b_eps[sb]:
                o_src.append(q); o_dst.append(state(sa, b_dst[ib])); o_lab.append(0)  # noqa: E702
                o_sc.append(b_sc[ib]); m_a.append(-1); m_b.append(ib)  # noqa: E702
        q += 1
    dst = np.array(o_dst, np.int64)
    if not np.any(dst == FINAL):
        return None
    n_states = len(order) + 1
    dst[dst == FINAL] = n_states - 1
    return (np.array(o_src, np.int64), dst, np.array(o_lab, np.int32), np.array(o_sc, np.float32),
            n_states, np.array(m_a, np.int64), np.array(m_b, np.int64))


def _is_float(v) -> bool:
    return not isinstance(v, Ragged) and np.asarray(v).dtype.kind == "f"


def _check_shared_attrs(a: Fsa, b: Fsa):
    for k in a.attrs:
        if k in b.attrs and not (_is_float(a.attrs[k]) and _is_float(b.attrs[k])):
            raise ValueError(f"intersect: attribute {k!r} is on both a_fsa and b_fsa and is not float on both; "
                             f"only float attributes can be combined (summed), as in k2: remove or rename one")


def _attrs(a: Fsa, b: Fsa, ma, mb):
    out = {}
    for k, v in a.attrs.items():
        out[k] = index_attr(v, ma) + index_attr(b.attrs[k], mb) if k in b.attrs else index_attr(v, ma)
    for k, v in b.attrs.items():
        if k not in a.attrs:
            out[k] = index_attr(v, mb)
    return out


def _pair(a: Fsa, b: Fsa, eps: bool, ret):
    r = _intersect_one(a, b, eps)
    if r is None:
        z = np.zeros(0, np.int64)
        e = build(z, z, z, z, 0, {}).replace(attrs=_attrs(a, b, z, z))
        return (e, z.astype(np.int32), z.astype(np.int32)) if ret else e
    src, dst, lab, sc, ns, ma, mb = r
    out = build(src, dst, lab, sc, ns, {}).replace(attrs=_attrs(a, b, ma, mb))
    return (out, ma.astype(np.int32), mb.astype(np.int32)) if ret else out


def intersect(a_fsa: Fsa, b_fsa: Fsa, treat_epsilons_specially: bool = True, ret_arc_maps: bool = False):
    """Intersection of two acceptors (k2's intersect; see the module docstring for epsilons/attributes).

    Both inputs must be arc-sorted when treat_epsilons_specially (as k2). Single Fsa x single Fsa gives an
    Fsa; batches are matched pairwise (equal sizes) or broadcast against a single Fsa. States are numbered in
    breadth-first discovery order from (0, 0), the final pair last; unreachable pairs never appear, but
    dead ends may (call connect). No accepting path gives the empty FSA. `ret_arc_maps`: also a_arc_map and
    b_arc_map (-1 where that side contributed no arc; per-FSA indexes, -1 padded for batches)."""
    a = as_numpy(a_fsa, "a_fsa")
    b = as_numpy(b_fsa, "b_fsa")
    _check_shared_attrs(a, b)
    if treat_epsilons_specially:
        for nm, f in (("a_fsa", a), ("b_fsa", b)):
            for g in (f if f.is_batch else [f]):
                if not _arc_sorted(g):
                    raise ValueError(f"intersect: {nm} is not arc-sorted (call arc_sort first; k2 requires it "
                                     f"when treat_epsilons_specially=True)")
    if not a.is_batch and not b.is_batch:
        return _pair(a, b, treat_epsilons_specially, ret_arc_maps)
    la = list(a) if a.is_batch else None
    lb = list(b) if b.is_batch else None
    if la is not None and lb is not None and len(la) != len(lb):
        raise ValueError(f"intersect: batches differ in size: a_fsa has {len(la)}, b_fsa has {len(lb)}")
    n = len(la) if la is not None else len(lb)
    res = [_pair(la[i] if la is not None else a, lb[i] if lb is not None else b, treat_epsilons_specially, True)
           for i in range(n)]
    vec = create_fsa_vec([r[0] for r in res])
    if not ret_arc_maps:
        return vec
    maps = []
    for j in (1, 2):
        m = np.full(vec.label.shape, -1, np.int32)
        for i, r in enumerate(res):
            m[i, :len(r[j])] = r[j]
        maps.append(m)
    return vec, maps[0], maps[1]


def compose(a_fsa: Fsa, b_fsa: Fsa, treat_epsilons_specially: bool = True,
            inner_labels: Optional[str] = None) -> Fsa:
    """Composition (k2's compose): a_fsa's aux_labels (outputs) are matched with b_fsa's labels.

    Implemented as k2: intersect(arc_sort(invert(a_fsa)), b_fsa), then the result's labels are a_fsa's input
    labels and its aux_labels are b_fsa's aux_labels (or the matched labels if b_fsa is an acceptor);
    `inner_labels` names an attribute that receives the matched labels. b_fsa must be arc-sorted."""
    a = as_numpy(a_fsa, "a_fsa")
    b = as_numpy(b_fsa, "b_fsa")
    if "aux_labels" not in a.attrs or isinstance(a.attrs["aux_labels"], Ragged) \
            or np.asarray(a.attrs["aux_labels"]).ndim != a.label.ndim:
        raise ValueError("compose: a_fsa must have aux_labels with one label per arc (not Ragged, as k2)")
    if "left_labels" in a.attrs or "left_labels" in b.attrs:
        raise ValueError("compose: the attribute name 'left_labels' is reserved here")
    b_has_aux = "aux_labels" in b.attrs
    if inner_labels is not None and not b_has_aux:
        raise ValueError("compose: inner_labels needs b_fsa to have aux_labels (as k2)")
    a_inv = arc_sort(invert(a))

    def rename(f, old, new):
        attrs = dict(f.attrs)
        attrs[new] = attrs.pop(old)
        return f.replace(attrs=attrs)

    a_inv = rename(a_inv, "aux_labels", "left_labels")
    ans = intersect(a_inv, b, treat_epsilons_specially=treat_epsilons_specially)
    attrs = dict(ans.attrs)
    if inner_labels is not None:
        attrs[inner_labels] = ans.label.copy()
    if not b_has_aux:
        attrs["aux_labels"] = ans.label.copy()
    label = attrs.pop("left_labels")
    return ans.replace(label=label.astype(np.int32), attrs=attrs)
