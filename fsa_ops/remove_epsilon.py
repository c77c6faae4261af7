"""remove_epsilon (host-side): an equivalent epsilon-free FSA.

Tropical semiring (default, k2's remove_epsilon): for every state s and every state t in its epsilon
closure, each non-epsilon arc t -> u becomes an arc s -> u whose score adds the best epsilon path s ~> t;
epsilon cycles must have score <= 0 (as k2). Log semiring (`log_semiring=True`): the epsilon paths' scores
are log-summed, keeping paths with different integer attributes (e.g. aux_labels) apart, so the weighted
relation is preserved exactly; needs an epsilon-acyclic input. The result is connected.

Attributes follow the arcs as in k2: integer attributes (aux_labels ...) become the concatenation of their
values along the epsilon path and the arc, with 0 (and -1) removed ("ragged" in k2). If every arc then has
at most one value (and final arcs none), the attribute stays 1-D (0 where empty, -1 on final arcs for
aux_labels); otherwise it becomes a 2-D [num_arcs, max_len] array padded with 0 (k2 would return a
RaggedTensor). Float attributes are summed along the path.
"""
from __future__ import annotations

from collections import deque

import numpy as np

from fsa_ops.connect import connect
from fsa_ops.fsa import Fsa, create_fsa_vec
from fsa_ops.host import as_numpy, build, empty_like
from fsa_ops.unary import add_epsilon_self_loops

__all__ = ["remove_epsilon", "remove_epsilon_and_add_self_loops"]


def _closure_tropical(s, eps_out, e_dst, e_sc, ns):
    """Best epsilon path from s to each reachable t: {t: (score, tuple of eps arc ids)}."""
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


def _closure_log(s, eps_out, e_dst, e_sc, int_vals, max_paths=100_000):
    """All epsilon paths from s grouped by (t, integer-attribute sequences): {t: [(logsum, best path)]}."""
    groups = {}
    stack = [(s, 0.0, ())]
    n = 0
    while stack:
        t, v, path = stack.pop()
        n += 1
        if n > max_paths:
            raise ValueError("remove_epsilon: too many epsilon paths (log semiring enumerates them)")
        key = (t,) + tuple(tuple(x for x in (vals[e] for e in path) if x not in (0, -1)) for vals in int_vals)
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


def _remove_epsilon_one(fsa: Fsa, log_semiring: bool) -> Fsa:
    ns = int(fsa.num_states)
    if ns == 0:
        return fsa
    label = fsa.label
    is_eps = label == 0
    if not is_eps.any():
        return fsa
    src, dst, sc = fsa.src.tolist(), fsa.dst.tolist(), fsa.score.astype(np.float64).tolist()
    int_names = [k for k, v in fsa.attrs.items() if v.dtype.kind in "iu"]
    for k in int_names:
        if fsa.attrs[k].ndim != 1:
            raise ValueError(f"remove_epsilon: attribute {k!r} is already 2-D (ragged); not supported")
    float_names = [k for k, v in fsa.attrs.items() if v.dtype.kind == "f"]
    int_vals = [fsa.attrs[k].tolist() for k in int_names]
    flt_vals = [fsa.attrs[k].astype(np.float64).tolist() for k in float_names]
    eps_ids = np.nonzero(is_eps)[0]
    eps_out = [[] for _ in range(ns)]
    for e in eps_ids.tolist():
        eps_out[src[e]].append(e)
    if log_semiring and not _eps_acyclic(ns, fsa.src[eps_ids], fsa.dst[eps_ids]):
        raise ValueError("remove_epsilon: log_semiring=True needs an input without epsilon cycles")
    leaving = [[] for _ in range(ns)]
    for i in np.nonzero(~is_eps)[0].tolist():
        leaving[src[i]].append(i)
    o_src, o_dst, o_lab, o_sc, o_int, o_flt = [], [], [], [], [[] for _ in int_names], [[] for _ in float_names]
    for s in range(ns):
        if s == ns - 1:
            break
        clo = (_closure_log(s, eps_out, dst, sc, int_vals) if log_semiring
               else _closure_tropical(s, eps_out, dst, sc, ns))
        for t in sorted(clo):
            for v, path in clo[t]:
                for a in leaving[t]:
                    o_src.append(s)
                    o_dst.append(dst[a])
                    o_lab.append(label[a])
                    o_sc.append(v + sc[a])
                    for j, vals in enumerate(int_vals):
                        o_int[j].append(tuple(x for x in [vals[e] for e in path] + [vals[a]] if x not in (0, -1)))
                    for j, vals in enumerate(flt_vals):
                        o_flt[j].append(sum(vals[e] for e in path) + vals[a])
    if not o_src:
        return empty_like(fsa)
    o_lab = np.array(o_lab, np.int32)
    o_dst_arr = np.array(o_dst, np.int64)
    into_final = o_dst_arr == ns - 1
    attrs = {}
    for j, k in enumerate(int_names):
        seqs = o_int[j]
        lens = np.array([len(q) for q in seqs])
        K = int(lens.max()) if len(lens) else 0
        final_minus1 = np.all(np.asarray(fsa.attrs[k])[fsa.dst == ns - 1] == -1)
        if K <= 1 and not np.any(lens[into_final] > 0):
            col = np.array([q[0] if q else 0 for q in seqs], np.int32)
            if final_minus1:
                col[into_final] = -1
            attrs[k] = col
        else:
            arr = np.zeros((len(seqs), K), np.int32)
            for i, q in enumerate(seqs):
                arr[i, :len(q)] = q
            attrs[k] = arr
    for j, k in enumerate(float_names):
        attrs[k] = np.array(o_flt[j], fsa.attrs[k].dtype)
    out = build(o_src, o_dst, o_lab, o_sc, ns, attrs)
    return connect(out)


def remove_epsilon(fsa: Fsa, log_semiring: bool = False) -> Fsa:
    """Remove epsilon arcs (label 0); see the module docstring. Single Fsa or batch (in a batch, an integer
    attribute that is 2-D for one FSA is made 2-D for all)."""
    fsa = as_numpy(fsa)
    if not fsa.is_batch:
        return _remove_epsilon_one(fsa, log_semiring)
    outs = [_remove_epsilon_one(f, log_semiring) for f in fsa]
    for k in (outs[0].attrs if outs else {}):
        if any(o.attrs[k].ndim == 2 for o in outs):
            for o in outs:
                v = o.attrs[k]
                if v.ndim == 1:
                    o.attrs[k] = np.where(v == -1, 0, v)[:, None].astype(v.dtype)
    return create_fsa_vec(outs)


def remove_epsilon_and_add_self_loops(fsa: Fsa, log_semiring: bool = False) -> Fsa:
    """remove_epsilon, then an epsilon self-loop on every non-final state (k2; prepares an FSA for
    intersection with treat_epsilons_specially=False)."""
    return add_epsilon_self_loops(remove_epsilon(fsa, log_semiring=log_semiring))
