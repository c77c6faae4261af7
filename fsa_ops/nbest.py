"""k2's ``Nbest`` (k2/python/k2/nbest.py, and the methods icefall's ``icefall/decode.py`` adds): n-best lists of
linear paths sampled from lattices.

Fields: ``fsa`` (an FsaVec of N linear FSAs, one per path; arrays ``[N, W]``), ``shape`` (`NbestShape`, k2's
RaggedShape ``[utt][path]``: ``row_splits(1)``, ``row_ids(1)``, ``dim0``, ``tot_size(1)``) and ``kept_path``
(a `fsa_ops.ragged.Ragged` ``[path][arc]``: the lattice arc behind each arc of ``fsa``, indices within the
path's utterance lattice). The structure is built on the host (numpy); ``fsa.score`` is a JAX gather of the
lattice's ``score`` (``lattice.score[utt, kept_path]``), so path scores (`Nbest.tot_scores`) are differentiable
w.r.t. ``lattice.score``, also when the lattice's score is traced by ``jax.grad`` (the host work reads its
value through ``lax.stop_gradient``; under ``jit`` it raises a TypeError: the paths are data-dependent).

Word sequences: ``aux_labels`` when the lattice has them (1-D ints, or a `Ragged` attribute with several words
per arc as from an LG graph), else ``labels`` (a word acceptor), with 0 and -1 dropped. A path's FSA keeps
everything of its lattice arcs: labels (tokens), aux_labels (words, the final -1 included), scores and the
other attributes (e.g. ``lm_scores``).

Differences from k2: sampling needs a PRNG key (or k2's fixed positions, see `fsa_ops.random_paths`); unique
word sequences keep their first sampled path, in order of first occurrence (k2 orders by a hash);
`Nbest.intersect` matches word sequences (icefall's version: the best lattice path with the same words).
"""
from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from fsa_ops.connect import connect
from fsa_ops.fsa import Fsa, create_fsa_vec
from fsa_ops.graphs import levenshtein_graph, linear_fsa
from fsa_ops.host import build
from fsa_ops.intersect import intersect
from fsa_ops.ragged import Ragged, is_ragged
from fsa_ops.random_paths import random_paths
from fsa_ops.scores import is_traced
from fsa_ops.shortest_path import shortest_path
from fsa_ops.sort import arc_sort, top_sort

__all__ = ["Nbest", "NbestShape", "PathScores"]

_ARC = "__nbest_lattice_arc"


class NbestShape:
    """k2's two-axis RaggedShape ``[utt][path]``, from ``row_splits`` (int[U + 1], 0 .. N nondecreasing)."""

    num_axes = 2

    def __init__(self, row_splits):
        rs = np.asarray(row_splits, np.int64).reshape(-1)
        if rs.size == 0 or rs[0] != 0 or np.any(np.diff(rs) < 0):
            raise ValueError(f"row_splits: expected nondecreasing ints from 0, got {rs[:8].tolist()}")
        self._splits = rs.astype(np.int32)

    @classmethod
    def regular(cls, dim0: int, dim1: int) -> "NbestShape":
        """k2's ``regular_ragged_shape``: `dim0` utterances with `dim1` paths each."""
        return cls(np.arange(dim0 + 1) * dim1)

    @property
    def dim0(self) -> int:
        return len(self._splits) - 1

    def row_splits(self, axis: int = 1) -> np.ndarray:
        self._axis(axis)
        return self._splits.copy()

    def row_ids(self, axis: int = 1) -> np.ndarray:
        """int32[N]: the utterance of each path."""
        self._axis(axis)
        return np.repeat(np.arange(self.dim0, dtype=np.int32), np.diff(self._splits))

    def tot_size(self, axis: int) -> int:
        """axis 0: the number of utterances; axis 1: the number of paths."""
        self._axis(axis)
        return self.dim0 if axis == 0 else int(self._splits[-1])

    def max_size(self, axis: int = 1) -> int:
        self._axis(axis)
        return int(np.diff(self._splits).max(initial=0))

    @staticmethod
    def _axis(axis):
        if axis not in (0, 1):
            raise ValueError(f"axis: an NbestShape has axes 0 (utterances) and 1 (paths), got {axis}")

    def __eq__(self, other):
        return isinstance(other, NbestShape) and np.array_equal(self._splits, other._splits)

    __hash__ = None

    def __repr__(self):
        return f"NbestShape(row_splits={self._splits.tolist()})"


class PathScores:
    """Per-path values grouped by utterance (k2's RaggedTensor ``[utt][path]``): `values` [N] (jax, possibly
    differentiable) and `shape` (`NbestShape`)."""

    def __init__(self, shape: NbestShape, values):
        if np.shape(values) != (shape.tot_size(1),):
            raise ValueError(f"values: expected shape ({shape.tot_size(1)},), got {np.shape(values)}")
        self.shape, self.values = shape, values

    def _seg(self):
        return jnp.asarray(self.shape.row_ids(1)), self.shape.dim0

    def sum(self):
        """[U]: the sum over each utterance's paths (0 for none)."""
        seg, u = self._seg()
        return jax.ops.segment_sum(self.values, seg, num_segments=u)

    def max(self):
        """[U]: the largest value of each utterance (-inf for none)."""
        seg, u = self._seg()
        return jax.ops.segment_max(self.values, seg, num_segments=u)

    def argmax(self) -> np.ndarray:
        """int32[U]: the path index (idx01, into ``nbest.fsa``) of each utterance's largest value (the first
        on ties), -1 for an utterance without paths (k2's ``RaggedTensor.argmax``)."""
        v = np.asarray(lax.stop_gradient(self.values))
        rs = self.shape.row_splits(1)
        return np.array([rs[u] + int(np.argmax(v[rs[u]:rs[u + 1]])) if rs[u + 1] > rs[u] else -1
                         for u in range(self.shape.dim0)], np.int32)

    def tolist(self) -> list:
        v = np.asarray(lax.stop_gradient(self.values)).tolist()
        rs = self.shape.row_splits(1)
        return [v[rs[u]:rs[u + 1]] for u in range(self.shape.dim0)]

    def __repr__(self):
        return f"PathScores({self.tolist()})"


# ------------------------------------------------------------------ host helpers
def concrete_scores(fsa: Fsa, what: str) -> np.ndarray:
    """The value of ``fsa.score`` as numpy (through stop_gradient, so it works under ``jax.grad``)."""
    s = lax.stop_gradient(fsa.score)
    if is_traced(s):
        raise TypeError(f"{what}: the lattice's scores are traced (under jit or vmap); n-best lists are built on "
                        "the host from concrete scores (jax.grad is fine: call it outside jit)")
    return np.asarray(s)


def _batch(fsa, name: str) -> Fsa:
    if not isinstance(fsa, Fsa):
        raise TypeError(f"{name}: expected an fsa_ops Fsa (FsaVec), got {type(fsa).__name__}")
    if not fsa.is_batch:
        raise ValueError(f"{name}: expected an FsaVec (a batch, k2's 3 axes), got a single Fsa; use "
                         "create_fsa_vec([fsa])")
    return fsa


def word_reader(fsa: Fsa):
    """A host function ``(b, arcs) -> list of words (> 0)`` along arcs `arcs` of FSA `b` of a batch: aux_labels
    (1-D or Ragged) or, for an acceptor, labels (the arrays are copied to numpy once)."""
    aux = fsa.attrs.get("aux_labels")
    if is_ragged(aux):
        vals, lens = np.asarray(aux.values), np.asarray(aux.lengths)
        cols = np.arange(vals.shape[-1])

        def read(b, arcs):
            arcs = np.asarray(arcs, np.int64)
            w = vals[b, arcs][cols[None, :] < lens[b, arcs][:, None]]
            return [int(x) for x in w if x > 0]
        return read
    lab = np.asarray(fsa.label if aux is None else aux)

    def read(b, arcs):
        w = lab[b, np.asarray(arcs, np.int64)]
        return [int(x) for x in w[w > 0]]
    return read


def path_fsas(lattice: Fsa, utt: np.ndarray, arcs: Sequence[Sequence[int]]) -> Fsa:
    """A batch of linear FSAs, path n following lattice FSA ``utt[n]``'s arcs ``arcs[n]`` (labels, scores and
    all attributes gathered; scores with jnp so they stay differentiable). Empty arc lists give empty FSAs."""
    N = len(arcs)
    lengths = np.array([len(a) for a in arcs], np.int32)
    W = max(int(lengths.max(initial=0)), 1)
    idx = np.zeros((N, W), np.int64)
    for n, a in enumerate(arcs):
        idx[n, :len(a)] = a
    real = np.arange(W)[None, :] < lengths[:, None]
    u = np.asarray(utt, np.int64)[:, None]
    pos = np.arange(W, dtype=np.int32)[None, :]
    src = np.where(real, pos, 0).astype(np.int32)
    label = np.where(real, np.asarray(lattice.label)[u, idx], 0).astype(np.int32)
    score = jnp.where(jnp.asarray(real), jnp.asarray(lattice.score)[u, idx], -jnp.inf)
    attrs = {}
    for k, v in lattice.attrs.items():
        if is_ragged(v):
            vals = np.where(real[..., None], np.asarray(v.values)[u, idx], 0).astype(np.int32)
            attrs[k] = Ragged(vals, np.where(real, np.asarray(v.lengths)[u, idx], 0).astype(np.int32))
        elif np.asarray(lax.stop_gradient(v)).dtype.kind == "f":
            attrs[k] = jnp.where(jnp.asarray(real), jnp.asarray(v)[u, idx], 0)
        else:
            attrs[k] = np.where(real, np.asarray(v)[u, idx], 0).astype(np.asarray(v).dtype)
    ns = np.where(lengths > 0, lengths + 1, 0).astype(np.int32)
    return Fsa(src, np.where(real, pos + 1, 0).astype(np.int32), label, score, ns, lengths, attrs,
               max_states=int(ns.max(initial=0)))


def take_paths(fsa: Fsa, index) -> Fsa:
    """FSAs `index` of a batch whose arrays all share one padded width (as `path_fsas` makes): a gather that
    keeps scores differentiable (``fsa[index]`` goes through the host)."""
    index = np.asarray(index, np.int64)

    def take(x):
        if is_ragged(x):
            return Ragged(np.asarray(x.values)[index], np.asarray(x.lengths)[index])
        return jnp.asarray(x)[index] if not isinstance(x, np.ndarray) else x[index]
    ns = np.asarray(fsa.num_states)[index]
    return Fsa(take(fsa.src), take(fsa.dst), take(fsa.label), take(fsa.score), ns,
               np.asarray(fsa.num_arcs)[index], {k: take(v) for k, v in fsa.attrs.items()},
               max_states=int(ns.max(initial=0)))


def _word_acceptor(fsa: Fsa, b: int, score: np.ndarray) -> Fsa:
    """FSA `b` of `fsa` as an acceptor on words (aux_labels or labels > 0; 0 on arcs without a word; arcs with
    several words become chains), attribute `_ARC`: the original arc (-1 on added chain arcs)."""
    na, ns = int(np.asarray(fsa.num_arcs)[b]), int(np.asarray(fsa.num_states)[b])
    src, dst = np.asarray(fsa.src)[b, :na].astype(np.int64), np.asarray(fsa.dst)[b, :na].astype(np.int64)
    lab = np.asarray(fsa.label)[b, :na]
    sc = score[b, :na].astype(np.float32)
    aux = fsa.attrs.get("aux_labels")
    if aux is None or not is_ragged(aux):
        w = lab if aux is None else np.asarray(aux)[b, :na]
        word = np.where(lab == -1, -1, np.where(w > 0, w, 0))
        return build(src, dst, word, sc, ns, {_ARC: np.arange(na)})
    extra = 0
    o_src, o_dst, o_lab, o_sc, o_arc = [], [], [], [], []
    read = word_reader(fsa)
    for i in range(na):
        words = read(b, [i])
        seq = words + [-1] if lab[i] == -1 else (words or [0])
        cur = int(src[i])
        for j, w in enumerate(seq):
            nxt = int(dst[i]) if j + 1 == len(seq) else ns + extra    # chain states: ns, ns + 1, ...
            extra += j + 1 < len(seq)
            o_src.append(cur), o_dst.append(nxt), o_lab.append(w)
            o_sc.append(sc[i] if j == 0 else 0.0), o_arc.append(i if j == 0 else -1)
            cur = nxt
    final = ns - 1                      # the final state moves after the chain states: ns + j -> ns - 1 + j

    def renum(x):
        x = np.array(x, np.int64)
        return np.where(x < final, x, np.where(x == final, final + extra, x - 1))
    return Fsa.from_arcs(renum(o_src), renum(o_dst), np.array(o_lab, np.int32), np.array(o_sc, np.float32),
                         num_states=ns + extra, attrs={_ARC: np.array(o_arc, np.int32)})


class Nbest:
    """An n-best list: ``fsa`` (FsaVec of linear paths), ``shape`` ([utt][path]), ``kept_path`` (lattice arcs of
    each path, a `Ragged`, or None); see the module docstring."""

    def __init__(self, fsa: Fsa, shape: NbestShape, kept_path: Ragged = None):
        _batch(fsa, "fsa")
        if not isinstance(shape, NbestShape):
            raise TypeError(f"shape: expected an NbestShape, got {type(shape).__name__}")
        if len(fsa) != shape.tot_size(1):
            raise ValueError(f"fsa has {len(fsa)} paths but shape has {shape.tot_size(1)}")
        self.fsa, self.shape, self.kept_path = fsa, shape, kept_path

    def __str__(self) -> str:
        return f"Nbest(num_seqs:{self.shape.dim0}, num_fsas:{len(self.fsa)})"

    __repr__ = __str__

    @staticmethod
    def from_lattice(lattice: Fsa, num_paths: int, key=None, use_double_scores: bool = True,
                     nbest_scale: float = 0.5, positions=None) -> "Nbest":
        """Sample `num_paths` paths per utterance (`fsa_ops.random_paths` on ``lattice.score * nbest_scale``,
        with `key` or k2's `positions`) and keep one path per distinct word sequence (its first sample).
        Utterances without a successful path get no paths. The paths carry the lattice's (unscaled) scores."""
        lattice = _batch(lattice, "lattice")
        score = concrete_scores(lattice, "Nbest.from_lattice")
        scaled = lattice.replace(score=score * np.asarray(nbest_scale, score.dtype))
        paths, lengths = random_paths(scaled, use_double_scores, num_paths, key=key, positions=positions)
        paths, lengths = np.asarray(paths), np.asarray(lengths)
        utt, kept, splits = [], [], [0]
        read = word_reader(lattice)
        for b in range(len(lattice)):
            seen = set()
            for i in range(paths.shape[1]):
                n = int(lengths[b, i])
                if n == 0:
                    continue
                arcs = paths[b, i, :n].tolist()
                words = tuple(read(b, arcs))
                if words not in seen:
                    seen.add(words)
                    utt.append(b)
                    kept.append(arcs)
            splits.append(len(kept))
        return Nbest(path_fsas(lattice, np.array(utt, np.int64), kept), NbestShape(splits),
                     Ragged.from_lists(kept, width=max(1, max((len(a) for a in kept), default=1))))

    def words(self) -> list:
        """The word sequence of each path (aux_labels or, for acceptors, labels; 0 and -1 dropped)."""
        na = np.asarray(self.fsa.num_arcs)
        read = word_reader(self.fsa)
        return [read(n, np.arange(na[n])) for n in range(len(self.fsa))]

    def intersect(self, lattice: Fsa, use_double_scores: bool = True) -> "Nbest":
        """Score each path's word sequence with `lattice` (icefall's ``Nbest.intersect``): the best path of
        `lattice` (of the path's utterance; a single FSA or a batch of one serves all) among those with the same
        words. Returns an Nbest of the same shape whose paths follow those lattice arcs (labels, aux_labels,
        attributes and differentiable scores from `lattice`); a word sequence `lattice` lacks gives an empty
        FSA (total score -inf). Needs top-sorted results: `lattice` without epsilon cycles."""
        if not isinstance(lattice, Fsa):
            raise TypeError(f"lattice: expected an fsa_ops Fsa, got {type(lattice).__name__}")
        lat = lattice if lattice.is_batch else create_fsa_vec([lattice])
        utt = self.shape.row_ids(1)
        if len(lat) == 1:
            utt = np.zeros_like(utt)
        elif len(lat) != self.shape.dim0:
            raise ValueError(f"lattice has {len(lat)} FSAs but the n-best list has {self.shape.dim0} utterances")
        score = concrete_scores(lat, "Nbest.intersect")
        word_lats = [arc_sort(_word_acceptor(lat, b, score)) for b in range(len(lat))]
        words = self.words()
        kept = [[] for _ in words]
        todo = np.flatnonzero(np.asarray(self.fsa.num_states) > 0).tolist()     # empty FSAs stay empty
        if todo:
            a = create_fsa_vec([word_lats[utt[n]] for n in todo])
            res = intersect(a, linear_fsa([words[n] for n in todo]), treat_epsilons_specially=True)
            res = top_sort(connect(res))
            best = shortest_path(res, use_double_scores=use_double_scores)
            amap, na = np.asarray(best.attrs[_ARC]), np.asarray(best.num_arcs)
            for j, n in enumerate(todo):
                kept[n] = [int(x) for x in amap[j, :na[j]] if x >= 0]
        fsa = path_fsas(lat, utt, kept)
        return Nbest(fsa, self.shape, Ragged.from_lists(kept, width=max(1, max(map(len, kept), default=1))))

    def tot_scores(self) -> PathScores:
        """Each path's total score (the sum of its arc scores; -inf for an empty FSA), grouped ``[utt][path]``
        (icefall's ``tot_scores``, k2's ``total_scores``); differentiable w.r.t. the lattice scores."""
        real = jnp.arange(self.fsa.score.shape[1])[None, :] < jnp.asarray(self.fsa.num_arcs)[:, None]
        s = jnp.sum(jnp.where(real, self.fsa.score, 0.0), axis=1)
        return PathScores(self.shape, jnp.where(jnp.asarray(self.fsa.num_states) > 0, s, -jnp.inf))

    total_scores = tot_scores

    def _attr_sums(self, name: str):
        if name not in self.fsa.attrs:
            raise ValueError(f"the n-best FSAs have no {name!r} attribute")
        real = jnp.arange(self.fsa.score.shape[1])[None, :] < jnp.asarray(self.fsa.num_arcs)[:, None]
        return jnp.sum(jnp.where(real, jnp.asarray(self.fsa.attrs[name]), 0.0), axis=1), real

    def compute_lm_scores(self) -> PathScores:
        """icefall: each path's sum of ``lm_scores``."""
        return PathScores(self.shape, self._attr_sums("lm_scores")[0])

    def compute_am_scores(self) -> PathScores:
        """icefall: each path's sum of ``score - lm_scores``."""
        lm, real = self._attr_sums("lm_scores")
        return PathScores(self.shape, jnp.sum(jnp.where(real, self.fsa.score, 0.0), axis=1) - lm)

    def top_k(self, k: int) -> "Nbest":
        """The `k` best paths of each utterance by total score (descending, stable), k2's ``top_k``: an
        utterance with fewer paths repeats its last (worst) one, so every utterance has exactly `k`; an
        utterance without paths is a ValueError (k2 asserts)."""
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
            raise ValueError(f"k: expected an int >= 1, got {k!r}")
        scores = np.asarray(lax.stop_gradient(self.tot_scores().values))
        rs = self.shape.row_splits(1)
        index = []
        for u in range(self.shape.dim0):
            if rs[u + 1] == rs[u]:
                raise ValueError(f"top_k: utterance {u} has no paths (k2 asserts the same)")
            order = rs[u] + np.argsort(-scores[rs[u]:rs[u + 1]], kind="stable")
            index.extend(order[:k].tolist() + [int(order[-1])] * max(0, k - len(order)))
        kept = None
        if self.kept_path is not None:
            kept = Ragged(np.asarray(self.kept_path.values)[index], np.asarray(self.kept_path.lengths)[index])
        return Nbest(take_paths(self.fsa, index), NbestShape.regular(self.shape.dim0, int(k)), kept)

    def build_levenshtein_graphs(self) -> Fsa:
        """`levenshtein_graph` of each path's word sequence: an FsaVec with one FSA per path."""
        return levenshtein_graph(self.words())
