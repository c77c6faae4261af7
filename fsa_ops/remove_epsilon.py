"""remove_epsilon (host-side): an equivalent epsilon-free FSA, attributes turned ragged as in k2.

Tropical semiring (default, k2's remove_epsilon): for every state s and every state t in its epsilon
closure, each non-epsilon arc t -> u becomes an arc s -> u whose score adds the best epsilon path s ~> t;
epsilon cycles must have score <= 0 (as k2). Log semiring (`log_semiring=True`, not in k2): the epsilon
paths' scores are log-summed, keeping paths with different integer attributes (e.g. aux_labels) apart, so
the weighted relation is preserved exactly; needs an input without epsilon cycles. The result is connected.

Each output arc derives from a sequence of input arcs (the epsilon path, then the arc); attributes follow
k2's rules for such a ragged arc map (`attrs_from_arc_paths`): a 1-D integer attribute becomes a `Ragged`
of its values along the sequence with the filler 0 removed, and -1 removed where it sits on an arc into the
final state (so aux_labels of final arcs become []); a `Ragged` attribute gets its rows concatenated (and,
for aux_labels only, 0s removed); a float attribute is summed along the sequence.
"""
from __future__ import annotations

from collections import deque

import numpy as np

from fsa_ops.connect import connect
from fsa_ops.fsa import Fsa, create_fsa_vec
from fsa_ops.host import as_numpy, build
from fsa_ops.ragged import Ragged
from fsa_ops.unary import add_epsilon_self_loops

__all__ = ["remove_epsilon", "remove_epsilon_and_add_self_loops", "attrs_from_arc_paths"]


def attrs_from_arc_paths(fsa: Fsa, row_splits, arc_ids, name_zero_free=("aux_labels",),
                         remove_filler: bool = True) -> dict:
    """Attributes of output arcs that each derive from a sequence of `fsa`'s arcs (k2's ragged arc map).

    Output arc j derives from arcs ``arc_ids[row_splits[j]:row_splits[j + 1]]`` of the single Fsa `fsa`.
    1-D integer attributes become `Ragged` (values along the sequence; with `remove_filler`, 0 dropped, and -1
    dropped on arcs into the final state); `Ragged` attributes get their rows concatenated (0 dropped for the
    names in `name_zero_free`); float attributes are summed. Returns {name: value[num_out_arcs]}."""
    splits = np.asarray(row_splits, np.int64)
    ids = np.asarray(arc_ids, np.int64)
    m = len(splits) - 1
    seg = np.repeat(np.arange(m), np.diff(splits))
    into_final = np.asarray(fsa.label) == -1
    out = {}
    for k, v in fsa.attrs.items():
        if isinstance(v, Ragged):
            rows = v.numpy().take(ids)
            n_out = np.bincount(seg, weights=rows.lengths, minlength=m).astype(np.int64)
            r = Ragged.from_row_splits(np.concatenate([[0], np.cumsum(n_out)]), rows.flat_values)
            out[k] = r.remove_values_eq(0) if k in name_zero_free else r
            continue
        v = np.asarray(v)
        if v.dtype.kind in "iub":
            if v.ndim != 1:
                raise ValueError(f"attribute {k!r}: integer attributes must be 1-D or Ragged, got shape {v.shape}")
            vals = v.astype(np.int32)[ids]
            keep = (vals != 0) & ~((vals == -1) & into_final[ids]) if remove_filler else np.ones(len(ids), bool)
            n_out = np.bincount(seg[keep], minlength=m)
            out[k] = Ragged.from_row_splits(np.concatenate([[0], np.cumsum(n_out)]), vals[keep])
        else:
            s = np.zeros((m,) + v.shape[1:], np.float64)
            np.add.at(s, seg, v[ids].astype(np.float64))
            out[k] = s.astype(v.dtype)
    return out


def _closure_tropical(s, eps_out, e_dst, e_sc, ns):
    """Best epsilon path from s to each reachable t: {t: [(score, tuple of eps arc ids)]}."""
    best = {s: 0.0}
    back = {s: None}
    count = {}
    queue = deque([s])
    inq = {s}
    while queue:
        t = queue.popleft()
        inq.discard(t)
        count[t] = count.get(t, 0) + 1
        if count[t] > ns + 1:
            raise ValueError("remove_epsilon: epsilon cycle with positive score (k2 requires score <= 0)")
        for e in eps_out[t]:
            u, v = e_dst[e], best[t] + e_sc[e]
            if u not in best or v > best[u] + 1e-12:
                best[u] = v
                back[u] = (t, e)
                if u not in inq:
                    queue.append(u)
                    inq.add(u)
    out = {}
    for t, v in best.items():
        path = []
        cur = t
        guard = 0
        while back[cur] is not None and guard <= ns:
            prev, e = back[cur]
            path.append(e)
            cur = prev
            guard += 1
        out[t] = [(v, tuple(reversed(path)))]
    return out


def _closure_log(s, eps_out, e_dst, e_sc, contrib, max_paths=100_000):
    """All epsilon paths from s grouped by (t, integer-attribute sequences): {t: [(logsum, best path)]}."""
    groups = {}
    stack = [(s, 0.0, ())]
    n = 0
    while stack:
        t, v, path = stack.pop()
        n += 1
        if n > max_paths:
            raise ValueError("remove_epsilon: too many epsilon paths (log semiring enumerates them)")
        key = (t,) + tuple(tuple(x for e in path for x in c[e]) for c in contrib)
        g = groups.get(key)
        if g is None:
            groups[key] = [v, v, path]
        else:
            g[0] = np.logaddexp(g[0], v)
            if v > g[1]:
                g[1], g[2] = v, path
        for e in eps_out[t]:
            stack.append((e_dst[e], v + e_sc[e], path + (e,)))
    out = {}
    for key, (tot, _, path) in groups.items():
        out.setdefault(key[0], []).append((tot, path))
    return out


def _eps_acyclic(ns, src, dst):
    indeg = np.bincount(dst, minlength=ns)
    adj = [[] for _ in range(ns)]
    for a, d in zip(src, dst):
        adj[a].append(d)
    stack = [i for i in range(ns) if indeg[i] == 0]
    seen = 0
    while stack:
        x = stack.pop()
        seen += 1
        for d in adj[x]:
            indeg[d] -= 1
            if indeg[d] == 0:
                stack.append(d)
    return seen == ns


def _remove_epsilon_one(fsa: Fsa, log_semiring: bool, remove_filler: bool = True,
                        zero_free=("aux_labels",)) -> Fsa:
    ns = int(fsa.num_states)
    label = fsa.label
    is_eps = label == 0
    src, dst, sc = fsa.src.tolist(), fsa.dst.tolist(), fsa.score.astype(np.float64).tolist()
    eps_ids = np.nonzero(is_eps)[0]
    eps_out = [[] for _ in range(ns)]
    for e in eps_ids.tolist():
        eps_out[src[e]].append(e)
    if log_semiring and not _eps_acyclic(ns, fsa.src[eps_ids], fsa.dst[eps_ids]):
        raise ValueError("remove_epsilon: log_semiring=True needs an input without epsilon cycles")
    contrib = []   # per integer attribute: what each arc adds to an output arc's value (for the log grouping)
    if log_semiring and len(eps_ids):
        one = attrs_from_arc_paths(fsa, np.arange(len(label) + 1), np.arange(len(label)), zero_free, remove_filler)
        contrib = [[tuple(r) for r in v.tolist()] for v in one.values() if isinstance(v, Ragged)]
    # states without leaving epsilons keep their non-epsilon arcs as they are (vectorised); the others get
    # the arcs leaving their epsilon closure (Python, per state)
    has_eps = np.zeros(ns, bool)
    has_eps[fsa.src[eps_ids]] = True
    plain = np.nonzero(~is_eps & ~has_eps[fsa.src])[0] if ns else np.zeros(0, np.int64)
    rs = np.searchsorted(fsa.src, np.arange(ns + 1)).tolist()     # arcs are sorted by src
    eps_list = is_eps.tolist()
    o_src, o_dst, o_sc, paths = [], [], [], []
    for s in np.nonzero(has_eps)[0].tolist():
        if s == ns - 1:
            continue
        clo = (_closure_log(s, eps_out, dst, sc, contrib) if log_semiring
               else _closure_tropical(s, eps_out, dst, sc, ns))
        for t in sorted(clo):
            for v, path in clo[t]:
                for a in range(rs[t], rs[t + 1]):
                    if eps_list[a]:
                        continue
                    o_src.append(s)
                    o_dst.append(dst[a])
                    o_sc.append(v + sc[a])
                    paths.append(path + (a,))
    lens = np.concatenate([np.ones(len(plain), np.int64), np.array([len(p) for p in paths], np.int64)])
    ids = np.concatenate([plain, np.fromiter((a for p in paths for a in p), np.int64, count=int(lens.sum()) -
                                             len(plain))]).astype(np.int64)
    o_src = np.concatenate([fsa.src[plain], np.asarray(o_src, np.int64)]).astype(np.int64)
    o_dst = np.concatenate([fsa.dst[plain], np.asarray(o_dst, np.int64)]).astype(np.int64)
    o_sc = np.concatenate([fsa.score[plain].astype(np.float64), np.asarray(o_sc, np.float64)])
    splits = np.concatenate([[0], np.cumsum(lens)])
    order = np.argsort(o_src, kind="stable")      # by src state; within a state the order built above
    o_src, o_dst, o_sc, lens = o_src[order], o_dst[order], o_sc[order], lens[order]
    ids = ids[np.repeat(splits[order] - np.concatenate([[0], np.cumsum(lens)])[:-1], lens) + np.arange(len(ids))]
    splits = np.concatenate([[0], np.cumsum(lens)])
    core = build(o_src, o_dst, label[ids[splits[1:] - 1]] if len(lens) else [], o_sc, ns, {})
    core, kept = connect(core, ret_arc_map=True)
    kept = np.asarray(kept, np.int64)
    k_splits = np.concatenate([[0], np.cumsum(lens[kept])])
    k_ids = ids[np.repeat(splits[kept] - k_splits[:-1], lens[kept]) + np.arange(k_splits[-1])]
    return core.replace(attrs=attrs_from_arc_paths(fsa, k_splits, k_ids, zero_free, remove_filler))


def remove_epsilon(fsa: Fsa, log_semiring: bool = False) -> Fsa:
    """Remove epsilon arcs (label 0); see the module docstring. Single Fsa or batch: [B, A] in, [B, A'] out."""
    fsa = as_numpy(fsa)
    if not fsa.is_batch:
        return _remove_epsilon_one(fsa, log_semiring)
    return create_fsa_vec([_remove_epsilon_one(f, log_semiring) for f in fsa])


def remove_epsilon_and_add_self_loops(fsa: Fsa, remove_filler: bool = True, log_semiring: bool = False) -> Fsa:
    """remove_epsilon, then an epsilon self-loop on every non-final state, placed first (k2; prepares an FSA
    for intersection with treat_epsilons_specially=False). As k2: an input without epsilon arcs (every FSA
    of a batch) only gets the self-loops, its attributes unchanged; otherwise attributes turn ragged as in
    `remove_epsilon`, keeping 1-D integer attributes' fillers if not `remove_filler` and the 0s of a Ragged
    aux_labels. The self-loops' ragged attributes are empty rows (0 for float ones)."""
    fsa = as_numpy(fsa)
    if not _any_real_epsilon(fsa):
        return add_epsilon_self_loops(fsa)
    if not fsa.is_batch:
        return add_epsilon_self_loops(_remove_epsilon_one(fsa, log_semiring, remove_filler, ()))
    return add_epsilon_self_loops(create_fsa_vec([_remove_epsilon_one(f, log_semiring, remove_filler, ())
                                                  for f in fsa]))


def _any_real_epsilon(fsa: Fsa) -> bool:
    """Whether some real (not padding) arc has label 0."""
    if not fsa.is_batch:
        return bool(np.any(fsa.label == 0))
    real = np.arange(fsa.label.shape[1])[None, :] < np.asarray(fsa.num_arcs)[:, None]
    return bool(np.any((fsa.label == 0) & real))
