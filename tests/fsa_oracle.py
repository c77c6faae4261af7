"""Brute-force reference for FSA tests: enumerate accepting paths of small FSAs, and hypothesis strategies.

Independent of fsa_ops' algorithms (it only reads the arc arrays of an `Fsa`), so tests compare ops against it.

API (single FSAs; for a batch, apply per `fsavec[i]`):

- `Path`: namedtuple (arcs: tuple of arc indices, labels: tuple incl. the final -1, attrs: dict name -> tuple of
  per-arc values along the path, score: float (float64 sum of arc scores)).
- `enumerate_paths(fsa, max_labels=None, max_arcs=None, count_attr=None, max_paths=200_000) -> list[Path]`:
  every path from state 0 to the final state. Paths stop being extended once they carry more than `max_labels`
  non-epsilon labels (of `label`, or of attribute `count_attr`) or more than `max_arcs` arcs. For a cyclic FSA
  give a bound; with `max_labels` and no epsilon cycles the result is exact for every label sequence of length
  <= max_labels. Raises RuntimeError beyond `max_paths` paths (and if a cyclic FSA gets no bound).
- `total_score(fsa, log_semiring=True, **bounds)`: logsumexp (log) or max (tropical) of path scores; -inf if none,
  NaN if any path's score is NaN.
- `arc_post(fsa, log_semiring=True, **bounds) -> float64[A]`: per arc, logsumexp/max over the paths through it
  (counted once per occurrence) minus the total score, as k2's `get_arc_post`; -inf for arcs on no path.
- `best_path(fsa, **bounds) -> Path or None`: the highest-scoring path (first found on ties).
- `weighted_language(fsa, log_semiring=True, key='labels', **bounds) -> dict`: label sequence -> combined score,
  epsilons (0) and the final -1 removed. key: 'labels', 'aux_labels' (or any attribute name), or 'both'
  (pairs (labels_seq, aux_seq)). A `Ragged` attribute (several values per arc; or a 2-D 0-padded array) is
  flattened along the path; 0 and -1 are dropped either way.
- `languages_close(a, b, atol=1e-4, rtol=1e-4) -> (bool, message)`: compares two weighted languages (same keys,
  close scores).
- Strategies: `random_fsas(min_states=2, max_states=5, max_arcs=10, num_labels=4, acyclic=True, epsilons=True,
  epsilon_cycles=False, aux_labels=False, ensure_path=True, score_range=(-2., 2.))` draws a valid single Fsa:
  acyclic means top-sorted with dst > src; otherwise arcs may go anywhere (self loops too), but epsilon arcs go
  forward only unless `epsilon_cycles`. `aux_labels=True` adds one aux label per arc (-1 into the final state),
  `aux_labels='ragged'` a `Ragged` of 0 to 2 per arc ([-1] into the final state).
  `random_fsa_vecs(min_size=1, max_size=3, **kw)` draws batches.
"""
from __future__ import annotations

import math
from collections import namedtuple

import numpy as np
from hypothesis import strategies as st

from fsa_ops.fsa import Fsa, create_fsa_vec
from fsa_ops.ragged import Ragged

Path = namedtuple("Path", ["arcs", "labels", "attrs", "score"])


def _arrays(fsa):
    if fsa.is_batch:
        raise ValueError("oracle functions take a single Fsa; index the batch first")
    src = np.asarray(fsa.src).tolist()
    dst = np.asarray(fsa.dst).tolist()
    lab = np.asarray(fsa.label).tolist()
    sc = np.asarray(fsa.score, np.float64).tolist()
    return int(fsa.num_states), src, dst, lab, sc


def _is_acyclic(ns, src, dst):
    adj = [[] for _ in range(ns)]
    indeg = [0] * ns
    for a, d in zip(src, dst):
        adj[a].append(d)
        indeg[d] += 1
    stack = [s for s in range(ns) if indeg[s] == 0]
    seen = 0
    while stack:
        s = stack.pop()
        seen += 1
        for d in adj[s]:
            indeg[d] -= 1
            if indeg[d] == 0:
                stack.append(d)
    return seen == ns


def _per_arc(value):
    """Per-arc Python values of an attribute: ints, or lists for a Ragged / 2-D attribute."""
    return value.tolist() if isinstance(value, Ragged) else np.asarray(value).tolist()


def _n_symbols(x):
    if isinstance(x, list):
        return sum(y not in (0, -1) for y in x)
    return int(x not in (0, -1))


def enumerate_paths(fsa: Fsa, max_labels=None, max_arcs=None, count_attr=None, max_paths=200_000):
    ns, src, dst, lab, sc = _arrays(fsa)
    if ns == 0:
        return []
    if max_labels is None and max_arcs is None and not _is_acyclic(ns, src, dst):
        raise RuntimeError("cyclic FSA: give max_labels or max_arcs")
    cnt = lab if count_attr is None else _per_arc(fsa.attrs[count_attr])
    names = sorted(fsa.attrs)
    attr_vals = {n: _per_arc(fsa.attrs[n]) for n in names}
    leaving = [[] for _ in range(ns)]
    for i, a in enumerate(src):
        leaving[a].append(i)
    final = ns - 1
    out = []
    # iterative DFS: (state, arcs-so-far, num labels so far, score)
    stack = [(0, (), 0, 0.0)]
    while stack:
        s, arcs, nl, score = stack.pop()
        if s == final:
            out.append(Path(arcs, tuple(lab[i] for i in arcs),
                            {n: tuple(attr_vals[n][i] for i in arcs) for n in names}, score))
            if len(out) > max_paths:
                raise RuntimeError(f"more than {max_paths} paths; tighten the bounds")
            continue
        if max_arcs is not None and len(arcs) >= max_arcs:
            continue
        for i in reversed(leaving[s]):
            nl2 = nl + _n_symbols(cnt[i])
            if max_labels is not None and nl2 > max_labels:
                continue
            stack.append((dst[i], arcs + (i,), nl2, score + sc[i]))
    return out


def _combine(vals, log_semiring):
    if any(math.isnan(v) for v in vals):    # (Python's max would drop a NaN that is not first)
        return math.nan
    vals = [v for v in vals if v != -math.inf]
    if not vals:
        return -math.inf
    m = max(vals)
    if not log_semiring or m == math.inf:
        return m
    return m + math.log(sum(math.exp(v - m) for v in vals))


def total_score(fsa: Fsa, log_semiring=True, **bounds) -> float:
    return _combine([p.score for p in enumerate_paths(fsa, **bounds)], log_semiring)


def arc_post(fsa: Fsa, log_semiring=True, **bounds) -> np.ndarray:
    paths = enumerate_paths(fsa, **bounds)
    tot = _combine([p.score for p in paths], log_semiring)
    per_arc = [[] for _ in range(np.shape(fsa.label)[0])]
    for p in paths:
        for i in p.arcs:
            per_arc[i].append(p.score)
    return np.array([_combine(v, log_semiring) - tot if v and tot != -math.inf else -math.inf
                     for v in per_arc], np.float64)


def best_path(fsa: Fsa, **bounds):
    best = None
    for p in enumerate_paths(fsa, **bounds):
        if best is None or p.score > best.score:
            best = p
    return best


def _strip(seq):
    """Drop 0 and -1; per-arc rows of a 2-D (ragged, 0-padded) attribute are flattened."""
    out = []
    for x in seq:
        out.extend(x if isinstance(x, list) else [x])
    return tuple(x for x in out if x not in (0, -1))


def path_key(p: Path, key="labels"):
    if key == "labels":
        return _strip(p.labels)
    if key == "both":
        return (_strip(p.labels), _strip(p.attrs["aux_labels"]))
    return _strip(p.attrs[key])


def weighted_language(fsa: Fsa, log_semiring=True, key="labels", **bounds) -> dict:
    groups = {}
    for p in enumerate_paths(fsa, **bounds):
        groups.setdefault(path_key(p, key), []).append(p.score)
    return {k: _combine(v, log_semiring) for k, v in groups.items()}


def languages_close(a: dict, b: dict, atol=1e-4, rtol=1e-4):
    """(ok, message). Keys whose score is -inf on one side may be absent on the other."""
    keys = set(a) | set(b)
    for k in sorted(keys, key=repr):
        x, y = a.get(k, -math.inf), b.get(k, -math.inf)
        if x == y:
            continue
        if x == -math.inf or y == -math.inf or abs(x - y) > atol + rtol * abs(y):
            return False, f"sequence {k}: {x} vs {y}"
    return True, ""


# ------------------------------------------------------------------ hypothesis strategies
@st.composite
def random_fsas(draw, min_states=2, max_states=5, max_arcs=10, num_labels=4, acyclic=True, epsilons=True,
                epsilon_cycles=False, aux_labels=False, ensure_path=True, score_range=(-2.0, 2.0)):
    ns = draw(st.integers(min_states, max_states))
    if ns == 0:
        z = np.zeros(0, np.int32)
        f = Fsa.from_arcs(z, z, z, np.zeros(0, np.float32), num_states=0, attrs={"aux_labels": z} if aux_labels else {})
        return f.replace(aux_labels=Ragged.from_lists([])) if aux_labels == "ragged" else f
    final = ns - 1
    score_st = st.floats(score_range[0], score_range[1], width=32, allow_nan=False)
    lo_label = 0 if epsilons else 1
    arcs = []  # (src, dst, label, score)

    def add(a, d):
        if d == final:
            lab = -1
        else:
            lab = draw(st.integers(lo_label, num_labels))
            if lab == 0 and not epsilon_cycles and d <= a:
                lab = draw(st.integers(1, num_labels))
        arcs.append((a, d, lab, draw(score_st)))

    if ns >= 2 and ensure_path:
        chain = sorted(draw(st.sets(st.integers(1, final - 1), max_size=final - 1))) if final > 1 else []
        prev = 0
        for s in chain + [final]:
            add(prev, s)
            prev = s
    if ns >= 2:
        n_extra = draw(st.integers(0, max(0, max_arcs - len(arcs))))
        for _ in range(n_extra):
            if acyclic:
                a = draw(st.integers(0, final - 1))
                d = draw(st.integers(a + 1, final))
            else:
                a = draw(st.integers(0, final - 1))
                d = draw(st.integers(0, final))
            add(a, d)
    arcs.sort(key=lambda x: x[0])  # stable: keeps the drawn order within a state
    n = len(arcs)
    src = np.array([a[0] for a in arcs], np.int32)
    dst = np.array([a[1] for a in arcs], np.int32)
    lab = np.array([a[2] for a in arcs], np.int32)
    sc = np.array([a[3] for a in arcs], np.float32)
    attrs = {}
    if aux_labels == "ragged":
        rows = [[-1] if lab[i] == -1 else draw(st.lists(st.integers(0, num_labels), max_size=2)) for i in range(n)]
        attrs["aux_labels"] = Ragged.from_lists(rows)
    elif aux_labels:
        aux = np.array([draw(st.integers(0, num_labels)) for _ in range(n)], np.int32).reshape(n)
        aux[lab == -1] = -1  # k2: aux_labels of arcs into the final state are -1
        attrs["aux_labels"] = aux
    rag = {k: v for k, v in attrs.items() if isinstance(v, Ragged)}   # arcs are sorted already: attach after
    f = Fsa.from_arcs(src, dst, lab, sc, num_states=ns, attrs={k: v for k, v in attrs.items() if k not in rag})
    return f.replace(**rag)


@st.composite
def random_fsa_vecs(draw, min_size=1, max_size=3, **kw):
    n = draw(st.integers(min_size, max_size))
    return create_fsa_vec([draw(random_fsas(**kw)) for _ in range(n)])


# the bounds the structure-op tests enumerate languages under
LANGUAGE_BOUNDS = dict(max_labels=3, max_arcs=12)


def lang(f, log=True, key="labels", **kw):
    """The weighted language of `f` (log or tropical semiring) under `kw`, default :data:`LANGUAGE_BOUNDS`."""
    return weighted_language(f, log_semiring=log, key=key, **(kw or LANGUAGE_BOUNDS))


def assert_same_language(a, b, log=True, key="labels", **kw):
    ok, msg = languages_close(lang(a, log, key, **kw), lang(b, log, key, **kw))
    assert ok, msg
