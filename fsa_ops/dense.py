"""k2's DenseFsaVec and intersect_dense: scoring decoding graphs against network outputs.

Semantics (k2's ``intersect_dense``): for supervision segment ``b`` with ``D_b`` frames, a lattice
path is a path through the graph that takes exactly one arc with label ``>= 0`` per frame (label 0
is the CTC blank here, not epsilon: it consumes a frame too), then the arc with label ``-1`` into
the graph's final state, which consumes the extra frame ``D_b`` that k2 appends to every segment
(log-prob 0 for label -1, ``-inf`` for the others).  An arc taken on frame ``t`` scores
``graph_score + log_probs[t, label]``.  Lattice states are (frame, graph state) pairs.

Hot path (``dense_tot_scores``, used by ``ctc_loss``): a loop over frames whose per-frame work is
vectorised over (segments, arcs) -- ``alpha_{t+1}[d] = (+) over arcs into d of alpha_t[src] +
w_t(arc)`` -- without materialising the lattice.  The log-probs stay batch-major ``[B, T, C]``
(frame t is sliced inside the loop); the forward scores are stored as ``[B, T+1, S]``, each frame
shifted to max 0 (offsets kept apart).  Two layouts of the arcs, same results:

- ``table`` (graphs whose structure is concrete, also when the loss runs inside a user's ``jit``):
  arcs grouped by destination (forward) / source (backward) in padded ``[B, S, K]`` tables built
  on the host-known degree ``K``; each step is a gather + a reduction over ``K`` (no scatter);
- ``segment`` (graph structure traced): arcs in their own order, the per-state reduction is a
  segment max/sum (scatter).

State-labelled graphs (concrete structure; every arc into a state carries the same label: CTC
graphs and topologies) skip the per-arc log-prob lookups: the frame weight of entering state s,
``e_t[s] = log_probs[t, label(s)]``, is gathered once for all frames, the loops reduce only the
arc scores, and ``d tot / d log_probs`` is the state occupancy summed per label after the loops
(gathered by a host-side `label_gather_plan`, no scatter into a ``[B, T, C]`` buffer).  If their arcs also have at most four distinct ``dst - src`` offsets (CTC graphs: 0, 1, 2)
and no parallel arcs, the steps are shifted state vectors (band layout), and an exact total runs
forward and backward scores in one loop over ``[2B, S]``, as ``fsa_ops.ctc`` does.

The total score has an analytic ``custom_vjp``: one backward loop computes ``beta_t`` and the arc
posteriors of each frame, ``exp(alpha_t[src] + w + beta_{t+1}[dst])`` normalised over the frame's
arcs (every path takes exactly one arc per frame, so they sum to 1): no division by the total
score, whose float32 rounding (~1e-3 nats at a few thousand nats) would otherwise enter every
gradient.  The posteriors are scatter-added onto ``d tot / d log_probs[t, label]`` and summed over
frames into ``d tot / d graph scores``.  Memory: the forward scores ``[B, T+1, S]``; nothing of
size frames x arcs is kept.

``output_beam`` (as k2): arcs whose best (Viterbi) path is worse than the best path by more than
the beam are removed before the log-semiring total is taken.  It costs a Viterbi forward and
backward pass; ``output_beam=float('inf')`` skips it (exact total).

``intersect_dense`` returns the lattice itself as a batched :class:`~fsa_ops.fsa.Fsa` with static
shapes: state ``t * S + s`` is graph state ``s`` at frame ``t`` (``t <= D_b``) and state
``(D_b + 1) * S`` is final; arc ``t * A + a`` is graph arc ``a`` taken on frame ``t``.  Arcs that
cannot be taken on that frame, and arcs removed by ``output_beam``, stay in place with score
``-inf`` (so they never change scores or best paths); ``num_arcs = (D_b + 1) * A``.  Unlike k2's
the lattice is therefore not compacted (``connect`` on the host removes the dead parts).
Its arc scores are differentiable w.r.t. the log-probs and graph scores (autodiff of a gather,
k2's arc_map_a/arc_map_b index_add).
"""
from __future__ import annotations

import functools
import math
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax, tree_util

from fsa_ops.fsa import Fsa
from fsa_ops.scores import (NEG_INF, arc_table, fsa_arrays, is_traced, max_degree, score_dtype,
                            valid_arcs)

__all__ = ["DenseFsaVec", "intersect_dense", "dense_tot_scores", "dense_frame_weights"]


# --------------------------------------------------------------------------------------------
# DenseFsaVec
# --------------------------------------------------------------------------------------------


@tree_util.register_pytree_node_class
class DenseFsaVec:
    """Network output for a list of supervision segments (k2's ``DenseFsaVec``).

    Args:
      log_probs: ``[N, T, C]`` float log-probabilities (C symbols; symbol 0 is blank).
      supervision_segments: ``[S, 3]`` int rows ``(sequence_index, start_frame, duration)``.
        Unlike k2, the rows need not be sorted by duration.
      allow_truncate: as k2: a segment may run past ``T`` by at most this many frames (truncated).

    Holds ``scores`` ``[S, T, C]`` (segment ``s``'s frames from its start, ``-inf`` past its
    duration) and ``duration`` ``int32[S]``; a pytree, usable inside jit (the checks on segment
    bounds run only when the segments are concrete).  Gradients flow back to ``log_probs``.
    """

    def __init__(self, log_probs, supervision_segments, allow_truncate: int = 0):
        log_probs = jnp.asarray(log_probs)
        if log_probs.ndim != 3:
            raise ValueError(f"log_probs: expected [N, T, C], got shape {log_probs.shape}")
        if not jnp.issubdtype(log_probs.dtype, jnp.floating):
            raise ValueError(f"log_probs: expected a float array, got {log_probs.dtype}")
        N, T, C = log_probs.shape
        if allow_truncate < 0:
            raise ValueError(f"allow_truncate must be >= 0, got {allow_truncate}")
        seg = supervision_segments
        if not is_traced(seg):
            s = np.asarray(seg)
            if s.ndim != 2 or s.shape[1] != 3 or s.dtype.kind not in "iu":
                raise ValueError("supervision_segments: expected an int [S, 3] array of "
                                 f"(sequence_index, start_frame, duration), got {s.dtype} {s.shape}")
            for i, (n, st, d) in enumerate(s.tolist()):
                if not 0 <= n < N:
                    raise ValueError(f"supervision_segments[{i}]: sequence_index {n} not in [0, {N})")
                if not 0 <= st < T:
                    raise ValueError(f"supervision_segments[{i}]: start_frame {st} not in [0, {T})")
                if d <= 0:
                    raise ValueError(f"supervision_segments[{i}]: duration {d} must be > 0")
                if st + d > T + allow_truncate:
                    raise ValueError(f"supervision_segments[{i}]: start_frame + duration = {st + d} "
                                     f"> T + allow_truncate = {T + allow_truncate}")
        identity = False
        if not is_traced(seg):
            s = np.asarray(seg)
            identity = s.shape[0] == N and np.array_equal(s[:, 0], np.arange(N)) and not s[:, 1].any()
        seg = jnp.asarray(seg, jnp.int32)
        idx, start, dur = seg[:, 0], seg[:, 1], seg[:, 2]
        dur = jnp.minimum(dur, T - start)
        t = jnp.arange(T, dtype=jnp.int32)
        if identity:      # one segment per sequence from frame 0: no gather (nor scatter in backprop)
            scores = log_probs
        else:
            frames = jnp.clip(start[:, None] + t[None, :], 0, T - 1)
            scores = log_probs[idx[:, None], frames]                          # [S, T, C]
        self.scores = jnp.where((t[None, :] < dur[:, None])[..., None], scores, NEG_INF)
        self.duration = dur.astype(jnp.int32)

    @classmethod
    def from_scores(cls, scores, duration):
        obj = object.__new__(cls)
        obj.scores, obj.duration = scores, duration
        return obj

    def tree_flatten(self):
        return (self.scores, self.duration), None

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls.from_scores(*children)

    def dim0(self) -> int:
        return int(self.scores.shape[0])

    def __len__(self):
        return self.dim0()

    @property
    def num_symbols(self) -> int:
        return int(self.scores.shape[2])

    def __repr__(self):
        return f"DenseFsaVec(segments={self.scores.shape[0]}, max_frames={self.scores.shape[1]}, " \
               f"symbols={self.scores.shape[2]})"


# --------------------------------------------------------------------------------------------
# arc layouts
# --------------------------------------------------------------------------------------------


class _Layout(NamedTuple):
    """Arcs of each graph arranged for a reduction into `group` states.

    All arrays [B, X]: X = S*K (table mode, row-major [S, K], `group` is implicit) or A (segment
    mode).  `arc` is the original arc index (-1: empty slot); `other` the state at the other end.
    """
    arc: jax.Array
    group: jax.Array
    other: jax.Array
    label: jax.Array
    score: jax.Array


class _Graph(NamedTuple):
    fwd: _Layout            # grouped by dst (forward)
    bwd: _Layout            # grouped by src (backward)
    num_states: jax.Array   # [B]
    band: Optional[jax.Array] = None   # [B, D, S] scores by dst - src offset (`_band_scores`)


def _layout(arcs, valid, key, other, S, K, dtype):
    B, A = arcs.src.shape
    score = jnp.where(valid, arcs.score.astype(dtype), NEG_INF)
    other = jnp.clip(other, 0, S - 1)        # in range for the gathers (invalid arcs score -inf)
    if K is None:
        return _Layout(jnp.where(valid, jnp.arange(A, dtype=jnp.int32)[None], -1),
                       jnp.clip(key, 0, S - 1), other, arcs.label, score)
    table = arc_table(key, valid, S, K).reshape(B, S * K)
    ok = table >= 0
    t0 = jnp.maximum(table, 0)

    def g(x, fill):
        return jnp.where(ok, jnp.take_along_axis(x, t0, axis=1), jnp.asarray(fill, x.dtype))

    group = jnp.broadcast_to(jnp.repeat(jnp.arange(S, dtype=jnp.int32), K)[None], (B, S * K))
    return _Layout(table, group, g(other, 0), g(arcs.label, 0), g(score, NEG_INF))


def _make_graph(arcs, S, kin, kout, dtype):
    valid = valid_arcs(arcs)
    return _Graph(_layout(arcs, valid, arcs.dst, arcs.src, S, kin, dtype),
                  _layout(arcs, valid, arcs.src, arcs.dst, S, kout, dtype),
                  arcs.num_states)


# --------------------------------------------------------------------------------------------
# per-frame steps (a GPU kernel may replace these)
# --------------------------------------------------------------------------------------------


def dense_frame_weights(lay: _Layout, lp_t, t, dur):
    """Arc weights on frame ``t`` (0..T): graph score + log-prob of the label, which an arc with
    label >= 0 may only take on a frame ``t < dur`` and label -1 only on the segment's extra final
    frame ``t == dur`` (log-prob 0).  lp_t [B, C] (frame ``min(t, T-1)``); dur [B] -> [B, X]."""
    B, C = lp_t.shape
    flat = jnp.arange(B, dtype=jnp.int32)[:, None] * C + jnp.clip(lay.label, 0, C - 1)
    lpl = jnp.take(lp_t.reshape(-1), flat, mode="clip")
    emit = jnp.where((t < dur)[:, None], lpl, NEG_INF)
    fin = jnp.where(t == dur, 0.0, NEG_INF).astype(lp_t.dtype)[:, None]
    return lay.score + jnp.where(lay.label >= 0, emit, fin)


_UNROLLED_K = 16


def _over_k(x, op):
    """Reduces the last (degree) axis of [B, S, K] with `op` (jnp.maximum / jnp.add). Small K is
    unrolled into elementwise ops that fuse with their producers: XLA:CPU hands reduce ops to a
    library call that costs more than the arithmetic at these sizes (measured 1.5x per frame)."""
    K = x.shape[-1]
    if K > _UNROLLED_K:
        return jnp.max(x, axis=-1) if op is jnp.maximum else jnp.sum(x, axis=-1)
    return functools.reduce(op, [x[..., k] for k in range(K)])


def _logsumexp_k(v):
    """log-sum-exp over the degree axis of [B, S, K] (-inf where all are -inf) -> (lse, max, exps)."""
    m = _over_k(v, jnp.maximum)
    m = jnp.where(jnp.isfinite(m), m, 0.0)
    e = jnp.exp(v - m[..., None])
    ssum = _over_k(e, jnp.add)
    return jnp.where(ssum > 0, jnp.log(jnp.where(ssum > 0, ssum, 1.0)) + m, NEG_INF), m, e


def _take(x, idx):
    """x[b, idx[b, i]] for [B, N] x and [B, M] idx (clamped: measured no slower than unchecked)."""
    return jnp.take_along_axis(x, idx, axis=1, mode="clip")


def _reduce(vals, lay: _Layout, S: int, K: Optional[int], log_semiring: bool):
    """(+)-reduce [B, X] values into their group states -> [B, S]."""
    B = vals.shape[0]
    if K is not None:
        v = vals.reshape(B, S, K)
        return _logsumexp_k(v)[0] if log_semiring else _over_k(v, jnp.maximum)
    seg = (jnp.arange(B, dtype=jnp.int32)[:, None] * S + lay.group).reshape(-1)
    flat = vals.reshape(-1)
    m = jax.ops.segment_max(flat, seg, num_segments=B * S)
    if not log_semiring:
        return m.reshape(B, S)
    m = lax.stop_gradient(jnp.where(jnp.isfinite(m), m, 0.0))
    s = jax.ops.segment_sum(jnp.exp(flat - m[seg]), seg, num_segments=B * S)
    out = jnp.where(s > 0, jnp.log(jnp.where(s > 0, s, 1.0)) + m, NEG_INF)
    return out.reshape(B, S)


def _keep_mask(lay: _Layout, K, w, amax_t, bmax_next, cut, forward: bool):
    """Arcs within output_beam of the best path (Viterbi forward + arc + Viterbi backward)."""
    if forward:   # group = dst, other = src
        fb = _take(amax_t, lay.other) + w + _group_take(bmax_next, lay, K)
    else:         # group = src, other = dst
        fb = _group_take(amax_t, lay, K) + w + _take(bmax_next, lay.other)
    return fb > cut[:, None]


def _group_take(x, lay: _Layout, K: Optional[int]):
    """x[b, group] for [B, S] x: a broadcast in table mode, a gather in segment mode."""
    if K is not None:
        B, S = x.shape
        return jnp.broadcast_to(x[:, :, None], (B, S, K)).reshape(B, S * K)
    return _take(x, lay.group)


def _pruned_weights(lay, K, lp_t, t, dur, prune, forward: bool):
    w = dense_frame_weights(lay, lp_t, t, dur)
    if prune is not None:
        w = jnp.where(_keep_mask(lay, K, w, *prune, forward=forward), w, NEG_INF)
    return w


def dense_forward_step(alpha, lp_t, t, dur, lay, S, K, log_semiring, prune=None):
    """alpha_t [B, S] -> alpha_{t+1} [B, S] for frame t."""
    w = _pruned_weights(lay, K, lp_t, t, dur, prune, forward=True)
    vals = _take(alpha, lay.other) + w
    return _reduce(vals, lay, S, K, log_semiring)


def dense_backward_step(beta_next, lp_t, t, dur, lay, S, K, log_semiring, prune=None):
    """beta_{t+1} [B, S] -> beta_t [B, S] for frame t."""
    w = _pruned_weights(lay, K, lp_t, t, dur, prune, forward=False)
    vals = w + _take(beta_next, lay.other)
    return _reduce(vals, lay, S, K, log_semiring)


def dense_backward_post_step(beta_next, lp_t, t, dur, lay, S, K, alpha_t, prune=None):
    """Log-semiring backward step that also returns the arc posteriors of frame t.

    beta_{t+1} [B, S] -> (beta_t [B, S], post [B, X]) with
    ``post[x] = exp(alpha_t[src] + w + beta_{t+1}[dst]) / (sum of that over the frame's arcs)``:
    every path takes exactly one arc per frame (t <= dur), so the frame's posteriors sum to 1 and
    this normalisation replaces the division by the total score.  alpha_t and beta_{t+1} may
    therefore carry any per-row offset (the loops keep them shifted to max 0, which keeps
    float32's precision for long segments).  In table mode the exponentials of the log-sum-exp
    are reused (one exp per arc, one per state).  post is 0 on frames past ``dur``.
    """
    w = _pruned_weights(lay, K, lp_t, t, dur, prune, forward=False)
    B = w.shape[0]
    vals = w + _take(beta_next, lay.other)
    if K is not None:
        beta, m, e = _logsumexp_k(vals.reshape(B, S, K))
        c = alpha_t + m
        cmax = jnp.max(c, axis=-1, keepdims=True)
        coef = jnp.exp(c - jnp.where(jnp.isfinite(cmax), cmax, 0.0))
        un = (e * coef[..., None]).reshape(B, S * K)
    else:
        beta = _reduce(vals, lay, S, None, True)
        a = _group_take(alpha_t, lay, None) + vals
        amax = jnp.max(a, axis=-1, keepdims=True)
        un = jnp.exp(a - jnp.where(jnp.isfinite(amax), amax, 0.0))
    z = jnp.sum(un, axis=-1, keepdims=True)
    return beta, un * jnp.where(z > 0, 1.0 / jnp.where(z > 0, z, 1.0), 0.0)


# --------------------------------------------------------------------------------------------
# state-labelled graphs: every arc into a state carries the same label (CTC graphs and topologies,
# HMM-like graphs with labels on states).  The frame weight then belongs to the destination state,
# ``w_t(arc) = score(arc) + e_t[dst]``, and ``e`` [B, T+1, S] is gathered once before the loops:
# the per-frame steps touch no log-probs, and d tot / d log_probs is the state occupancy
# ``alpha_{t+1}[s] * beta_{t+1}[s] / Z`` summed per label after the loops (`label_gather_plan`).
# --------------------------------------------------------------------------------------------


def _state_labels(arcs, S: int):
    """[B, S] label of the arcs entering each state; -2 for states without any.  A scatter-max
    over the arcs (no arc sort, which XLA:CPU runs slowly: ~1.7 ms for 16 x 500 arcs)."""
    B, A = arcs.src.shape
    valid = valid_arcs(arcs)
    b_idx = jnp.broadcast_to(jnp.arange(B, dtype=jnp.int32)[:, None], (B, A))
    lab = jnp.where(valid, jnp.asarray(arcs.label, jnp.int32), -2)
    dst = jnp.clip(jnp.asarray(arcs.dst, jnp.int32), 0, S - 1)
    return jnp.full((B, S), -2, jnp.int32).at[b_idx, dst].max(lab)


def state_emissions(state_label, lp, dur):
    """e [B, T+1, S]: the weight of entering state s on frame t -- ``lp[t, label(s)]`` for t < dur,
    0 on the extra final frame t == dur for states entered by label -1, -inf otherwise."""
    B, T, C = lp.shape
    S = state_label.shape[1]
    ids = jnp.broadcast_to(jnp.clip(state_label, 0, C - 1)[:, None, :], (B, T, S))
    g = jnp.take_along_axis(lp, ids, axis=2, mode="promise_in_bounds")
    g = jnp.concatenate([g, jnp.full((B, 1, S), NEG_INF, lp.dtype)], axis=1)
    t = jnp.arange(T + 1, dtype=jnp.int32)[None, :, None]
    d = dur[:, None, None]
    lab = state_label[:, None, :]
    return jnp.where((t < d) & (lab >= 0), g,
                     jnp.where((t == d) & (lab == -1), 0.0, NEG_INF).astype(lp.dtype))


# Band layout (labelled graphs whose arcs have at most `_MAX_BAND` distinct offsets dst - src and
# no two arcs with the same src and dst, e.g. CTC graphs: offsets 0, 1, 2): band[b, j, s] is the
# score of the arc s - offsets[j] -> s (-inf if none), and a step is a few shifted copies of the
# state vector instead of a gather through the arc table.
_MAX_BAND = 4


def band_offsets(arcs, S: int) -> Optional[tuple]:
    """Sorted distinct dst - src offsets if the graph fits the band layout, else None (host-side)."""
    if is_traced(arcs.src, arcs.dst, arcs.num_arcs):
        return None
    valid = np.asarray(valid_arcs(arcs))
    if not valid.any():
        return None
    src, dst = np.asarray(arcs.src)[valid], np.asarray(arcs.dst)[valid]
    offsets = np.unique(dst - src)
    if len(offsets) > _MAX_BAND:
        return None
    b_idx = np.broadcast_to(np.arange(valid.shape[0])[:, None], valid.shape)[valid].astype(np.int64)
    pair = (b_idx * S + src) * S + dst
    if len(np.unique(pair)) != len(pair):          # parallel arcs: one band slot cannot hold both
        return None
    return tuple(int(o) for o in offsets)


def _band_scores(arcs, offsets, S, dtype):
    """[B, D, S]: band[b, j, s] = score of arc (s - offsets[j] -> s) of graph b, -inf if none."""
    B, A = arcs.src.shape
    valid = valid_arcs(arcs)
    off = jnp.asarray(arcs.dst) - jnp.asarray(arcs.src)
    j = jnp.searchsorted(jnp.asarray(offsets, jnp.int32), off).astype(jnp.int32)
    j = jnp.where(valid, j, len(offsets))                              # out of range: dropped
    b_idx = jnp.broadcast_to(jnp.arange(B, dtype=jnp.int32)[:, None], (B, A))
    band = jnp.full((B, len(offsets), S), NEG_INF, dtype)
    return band.at[b_idx, j, jnp.clip(jnp.asarray(arcs.dst), 0, S - 1)].set(
        jnp.asarray(arcs.score).astype(dtype), mode="drop")


def _shift_states(x, by: int):
    """x[:, s - by] along the last axis (-inf shifted in); `by` static, either sign."""
    if by == 0:
        return x
    n = x.shape[-1]
    if abs(by) >= n:
        return jnp.full_like(x, NEG_INF)
    pad = jnp.full(x.shape[:-1] + (abs(by),), NEG_INF, x.dtype)
    if by > 0:
        return jnp.concatenate([pad, x[..., :n - by]], axis=-1)
    return jnp.concatenate([x[..., -by:], pad], axis=-1)


def _band_reduce(terms, log_semiring):
    """(+) over a list of [B, S] terms (log-sum-exp or max), -inf where all are -inf."""
    m = functools.reduce(jnp.maximum, terms)
    if not log_semiring:
        return m
    m0 = jnp.where(jnp.isfinite(m), m, 0.0)
    # the largest term contributes exp(0) = 1, so ssum >= 1 unless all terms are -inf (then
    # log(0) = -inf, the right answer; the callers' gradients are analytic, no NaN through it)
    return m0 + jnp.log(functools.reduce(jnp.add, [_exp_flushed(v - m0) for v in terms]))


def _exp_flushed(x):
    """exp(x) for x <= 0 with results below exp(-80) flushed to 0: float32 subnormals are ~50x
    slower on x86 and cannot change a sum that contains exp(0) = 1."""
    return jnp.where(x > -80.0, jnp.exp(jnp.maximum(x, -80.0)), 0.0)


def dense_band_forward_step(alpha, e_t, band, offsets, log_semiring, prune=None):
    """Band layout: alpha_{t+1}[s] = e_t[s] + (+)_j (alpha_t[s - o_j] + band[j, s])."""
    terms = [_shift_states(alpha, o) + band[:, j] for j, o in enumerate(offsets)]
    if prune is not None:
        amax_t, bmax_next, cut = prune
        after = e_t + bmax_next
        terms = [jnp.where(_shift_states(amax_t, o) + band[:, j] + after > cut[:, None], terms[j], NEG_INF)
                 for j, o in enumerate(offsets)]
    return e_t + _band_reduce(terms, log_semiring)


def dense_band_backward_step(beta_next, e_t, band, offsets, log_semiring, prune=None):
    """Band layout: beta_t[s] = (+)_j (band[j, s + o_j] + e_t[s + o_j] + beta_{t+1}[s + o_j])."""
    g = [_shift_states(band[:, j] + e_t + beta_next, -o) for j, o in enumerate(offsets)]
    if prune is not None:
        amax_t, bmax_next, cut = prune
        h = [_shift_states(band[:, j] + e_t + bmax_next, -o) for j, o in enumerate(offsets)]
        g = [jnp.where(amax_t + hj > cut[:, None], gj, NEG_INF) for gj, hj in zip(g, h)]
    return _band_reduce(g, log_semiring)


def dense_labelled_forward_step(alpha, e_t, lay, S, K, log_semiring, prune=None):
    """State-labelled graphs: alpha_t [B, S] -> alpha_{t+1} = e_t + (+)_{arcs} (alpha_t[src] + score)."""
    vals = _take(alpha, lay.other) + lay.score
    if prune is not None:
        amax_t, bmax_next, cut = prune
        fb = _take(amax_t, lay.other) + lay.score + _group_take(e_t + bmax_next, lay, K)
        vals = jnp.where(fb > cut[:, None], vals, NEG_INF)
    return e_t + _reduce(vals, lay, S, K, log_semiring)


def dense_labelled_backward_step(beta_next, e_t, lay, S, K, log_semiring, prune=None):
    """State-labelled graphs: beta_{t+1} [B, S] -> beta_t = (+)_{arcs} (score + e_t[dst] + beta_{t+1}[dst])."""
    vals = _take(e_t + beta_next, lay.other) + lay.score
    if prune is not None:
        amax_t, bmax_next, cut = prune
        fb = _group_take(amax_t, lay, K) + lay.score + _take(e_t + bmax_next, lay.other)
        vals = jnp.where(fb > cut[:, None], vals, NEG_INF)
    return _reduce(vals, lay, S, K, log_semiring)


# --------------------------------------------------------------------------------------------
# loops over frames (batch-major tables, values kept shifted to max 0 per frame)
# --------------------------------------------------------------------------------------------


class _Cfg(NamedTuple):
    S: int
    kin: Optional[int]
    kout: Optional[int]
    beam: float
    dtype: object
    labelled: bool = False   # state-labelled graph: frame weights per state (see `state_emissions`)
    band: Optional[tuple] = None   # labelled graphs with few dst - src offsets: those offsets


def _frame(lp, t):
    """lp[:, min(t, T-1)] -> [B, C] (frame T, the segments' extra final frame, reads frame T-1:
    `dense_frame_weights` gives it no label >= 0)."""
    return lax.dynamic_index_in_dim(lp, jnp.minimum(t, lp.shape[1] - 1), axis=1, keepdims=False)


def _shift_max(x):
    """Shifts every row of [B, S] to max 0: (x - off, off [B]) (off 0 for rows without mass)."""
    off = jnp.max(x, axis=-1)
    off = jnp.where(jnp.isfinite(off), off, 0.0)
    return x - off[:, None], off


def _put(table, t, row):
    return lax.dynamic_update_index_in_dim(table, row.astype(table.dtype), t, axis=1)


def _start_vec(ns, S, dtype):
    return jnp.where((jnp.arange(S)[None] == 0) & (ns[:, None] > 0), 0.0, NEG_INF).astype(dtype)


def _final_vec(ns, S, dtype):
    return jnp.where(jnp.arange(S)[None] == (ns[:, None] - 1), 0.0, NEG_INF).astype(dtype)


def _prune_at(prune, t):
    if prune is None:
        return None
    amax, bmax_next, cut = prune
    return (lax.dynamic_index_in_dim(amax, t, axis=1, keepdims=False),
            lax.dynamic_index_in_dim(bmax_next, t, axis=1, keepdims=False), cut)


def _num_frames(cfg: _Cfg, x):
    """T from the loops' input: log-probs [B, T, C], or state emissions [B, T+1, S] (labelled)."""
    return x.shape[1] - 1 if cfg.labelled else x.shape[1]


def _forward_step(cfg: _Cfg, G: _Graph, x, dur, log_semiring, prune, alpha, t):
    if cfg.band is not None:
        return dense_band_forward_step(alpha, _frame(x, t), G.band, cfg.band, log_semiring,
                                       _prune_at(prune, t))
    if cfg.labelled:
        return dense_labelled_forward_step(alpha, _frame(x, t), G.fwd, cfg.S, cfg.kin, log_semiring,
                                           _prune_at(prune, t))
    return dense_forward_step(alpha, _frame(x, t), t, dur, G.fwd, cfg.S, cfg.kin, log_semiring,
                              _prune_at(prune, t))


def _backward_step(cfg: _Cfg, G: _Graph, x, dur, log_semiring, prune, beta_next, t):
    if cfg.band is not None:
        return dense_band_backward_step(beta_next, _frame(x, t), G.band, cfg.band, log_semiring,
                                        _prune_at(prune, t))
    if cfg.labelled:
        return dense_labelled_backward_step(beta_next, _frame(x, t), G.bwd, cfg.S, cfg.kout,
                                            log_semiring, _prune_at(prune, t))
    return dense_backward_step(beta_next, _frame(x, t), t, dur, G.bwd, cfg.S, cfg.kout, log_semiring,
                               _prune_at(prune, t))


def _forward_loop(cfg: _Cfg, G: _Graph, x, dur, log_semiring, prune=None, true_values=False):
    """Forward scores alpha_0..alpha_T of every segment.

    x: log-probs [B, T, C], or the state emissions [B, T+1, S] of a labelled graph.  Returns
    (tot [B], alphas [B, T+1, S]): each frame's row shifted to max 0 (what the posteriors need;
    keeps float32's precision), or with `true_values` the scores themselves (the running offsets
    added back; for the Viterbi pruning tables)."""
    S, dtype = cfg.S, cfg.dtype
    B, T = x.shape[0], _num_frames(cfg, x)
    ns = G.num_states
    final = jnp.maximum(ns - 1, 0)

    def body(t, carry):
        alpha, cum, tot, alphas = carry
        alphas = _put(alphas, t, alpha + cum[:, None] if true_values else alpha)
        nxt = _forward_step(cfg, G, x, dur, log_semiring, prune, alpha, t)
        fin = jnp.take_along_axis(nxt, final[:, None], axis=1)[:, 0]
        tot = jnp.where((t == dur) & (ns > 0), cum + fin, tot)
        nxt, off = _shift_max(nxt)
        return nxt, cum + off, tot, alphas

    init = (_start_vec(ns, S, dtype), jnp.zeros((B,), dtype), jnp.full((B,), NEG_INF, dtype),
            jnp.zeros((B, T + 1, S), dtype))
    _, _, tot, alphas = lax.fori_loop(0, T + 1, body, init)
    return tot, alphas


def _backward_loop(cfg: _Cfg, G: _Graph, x, dur, log_semiring, prune=None, true_values=True):
    """Backward scores beta_{t+1} for t = 0..T: [B, T+1, S] (x as in `_forward_loop`); true values,
    or each frame's row shifted to max 0 (`true_values=False`)."""
    S, dtype = cfg.S, cfg.dtype
    B, T = x.shape[0], _num_frames(cfg, x)
    fvec = _final_vec(G.num_states, S, dtype)

    def body(i, carry):
        beta, cum, out = carry
        t = T - i
        at_end = (t == dur)[:, None]
        beta_next = jnp.where(at_end, fvec, beta)
        cum = jnp.where(at_end[:, 0], 0.0, cum)
        out = _put(out, t, beta_next + cum[:, None] if true_values else beta_next)
        b = _backward_step(cfg, G, x, dur, log_semiring, prune, beta_next, t)
        b, off = _shift_max(b)
        return b, cum + off, out

    init = (jnp.full(fvec.shape, NEG_INF, dtype), jnp.zeros((B,), dtype), jnp.zeros((B, T + 1, S), dtype))
    return lax.fori_loop(0, T + 1, body, init)[2]


def _band_fused_loop(cfg: _Cfg, G: _Graph, e, dur, log_semiring=True, prune=None, true_values=False):
    """Forward and backward scores of a band-layout graph in ONE loop over frames, on a [2B, S]
    array: rows 0..B-1 run alpha over frames 0..T, rows B..2B-1 run ``g_t = e_t + beta_{t+1}``
    over frames T..0 with their states reversed, so that both take
    ``new = e + (+)_j (shift(x, o_j) + band_j)`` (the backward band holds the arc s -> s + o_j at
    s, reversed).  Halves the serial steps of two loops.

    e [B, T+1, S] (`state_emissions`); log_semiring False: the Viterbi (max) scores; prune: the
    output-beam masks' tables (amax, bmax_next, cut) as `_prune_info` makes them, applied to both
    directions (the arcs of the pruned lattice).  Returns (tot [B], alphas [B, T+1, S],
    bnext [B, T+1, S]) in the conventions of `_forward_loop` / `_backward_loop`: each frame's row
    shifted by some per-frame offset, or with `true_values` the scores themselves."""
    S, dtype, offsets = cfg.S, cfg.dtype, cfg.band
    B, T = e.shape[0], e.shape[1] - 1
    ns = G.num_states
    final = jnp.maximum(ns - 1, 0)
    fvec = _final_vec(ns, S, dtype)
    back = jnp.stack([_shift_states(G.band[:, j], -o) for j, o in enumerate(offsets)], axis=1)
    band = jnp.moveaxis(jnp.concatenate([G.band, back[..., ::-1]], axis=0), 1, 0)   # [D, 2B, S]
    if prune is not None:
        amax, bmax_next, cut = prune
        h = e + bmax_next                       # best completion from entering (t, s)
        cut2 = jnp.concatenate([cut, cut])[:, None]

    def restart(x, cum, tb):
        """Backward rows whose segment ends at frame tb start there: g_dur = e_dur + final."""
        at_end = tb == dur
        g_end = (lax.dynamic_index_in_dim(e, jnp.maximum(tb, 0), axis=1, keepdims=False) + fvec)[:, ::-1]
        return (jnp.concatenate([x[:B], jnp.where(at_end[:, None], g_end, x[B:])], axis=0),
                jnp.concatenate([cum[:B], jnp.where(at_end, 0.0, cum[B:])]))

    def kept(i):
        """[D] masks [2B, S] of the arcs inside the output beam: the forward rows' arcs into
        frame i, the backward rows' arcs out of frame T - i (states reversed)."""
        a_f, h_f = (lax.dynamic_index_in_dim(v, i, axis=1, keepdims=False) for v in (amax, h))
        a_b, h_b = (lax.dynamic_index_in_dim(v, T - i, axis=1, keepdims=False) for v in (amax, h))
        return [jnp.concatenate([_shift_states(a_f, o) + G.band[:, j] + h_f,
                                 (a_b + _shift_states(G.band[:, j] + h_b, -o))[:, ::-1]], axis=0) > cut2
                for j, o in enumerate(offsets)]

    def body(i, carry):
        x, cum, tot, tab, ctab = carry
        terms = [_shift_states(x, o) + band[j] for j, o in enumerate(offsets)]
        if prune is not None:
            terms = [jnp.where(k, v, NEG_INF) for k, v in zip(kept(i), terms)]
        inc = _band_reduce(terms, log_semiring)
        tab = lax.dynamic_update_index_in_dim(tab, inc, i, axis=0)
        if true_values:
            ctab = lax.dynamic_update_index_in_dim(ctab, cum, i, axis=0)
        e_next = jnp.concatenate([lax.dynamic_index_in_dim(e, i, axis=1, keepdims=False),
                                  lax.dynamic_index_in_dim(e, jnp.maximum(T - i - 1, 0), axis=1,
                                                           keepdims=False)[:, ::-1]], axis=0)
        new = inc + e_next
        fin = jnp.take_along_axis(new[:B], final[:, None], axis=1)[:, 0]
        tot = jnp.where((i == dur) & (ns > 0), cum[:B] + fin, tot)
        new, off = _shift_max(new)
        new, cum = restart(new, cum + off, T - i - 1)    # (reset at the end: the step reads its carry)
        return new, cum, tot, tab, ctab

    start = jnp.concatenate([_start_vec(ns, S, dtype), jnp.full((B, S), NEG_INF, dtype)], axis=0)
    x0, cum0 = restart(start, jnp.zeros((2 * B,), dtype), jnp.asarray(T, jnp.int32))
    ctab = jnp.zeros((T + 1, 2 * B) if true_values else (0, 2 * B), dtype)
    init = (x0, cum0, jnp.full((B,), NEG_INF, dtype), jnp.zeros((T + 1, 2 * B, S), dtype), ctab)
    _, _, tot, tab, ctab = lax.fori_loop(0, T + 1, body, init)
    if true_values:            # step i's rows were computed from a carry offset by ctab[i]
        tab = tab + ctab[:, :, None]
    # step i stored alpha_{i+1} - e_i (forward rows) and beta_{T-i} (backward rows, reversed)
    inc_f = jnp.moveaxis(tab[:, :B], 0, 1)                                   # [B, T+1, S]
    beta = jnp.moveaxis(tab[::-1, B:, ::-1], 0, 1)                           # beta_t, t = 0..T
    alphas = jnp.concatenate([_start_vec(ns, S, dtype)[:, None], (inc_f + e)[:, :T]], axis=1)
    t = jnp.arange(T + 1, dtype=jnp.int32)[None, :, None]
    bnext = jnp.concatenate([beta[:, 1:], jnp.full((B, 1, S), NEG_INF, dtype)], axis=1)
    bnext = jnp.where(t == dur[:, None, None], fvec[:, None, :], bnext)
    return tot, alphas, bnext


def _prune_info(cfg: _Cfg, G: _Graph, lp, dur):
    """Viterbi tables for output_beam: (amax [B, T+1, S], bmax_next [B, T+1, S], cut [B])."""
    if not math.isfinite(cfg.beam):
        return None
    best, amax = _forward_loop(cfg, G, lp, dur, False, true_values=True)
    bmax_next = _backward_loop(cfg, G, lp, dur, False)
    cut = best - jnp.asarray(cfg.beam, cfg.dtype)          # -inf when there is no path
    return amax, bmax_next, lax.stop_gradient(cut)


def _grad_loop(cfg: _Cfg, G: _Graph, lp, dur, alphas, tot, g, prune):
    """Backward loop: d tot / d log_probs [B, T, C] and d tot / d arc (bwd layout) [B, X]."""
    S, dtype = cfg.S, cfg.dtype
    B, T, C = lp.shape
    ns = G.num_states
    lay = G.bwd
    fvec = _final_vec(ns, S, dtype)
    scale = jnp.where(jnp.isfinite(tot), g.astype(dtype), 0.0)[:, None]
    lab_seg = (jnp.arange(B, dtype=jnp.int32)[:, None] * C + jnp.maximum(lay.label, 0)).reshape(-1)
    lab_ok = lay.label >= 0

    def body(i, carry):
        beta, acc, glp = carry
        t = T - i
        beta_next = jnp.where((t == dur)[:, None], fvec, beta)
        alpha_t = lax.dynamic_index_in_dim(alphas, t, axis=1, keepdims=False)
        b, post = dense_backward_post_step(beta_next, _frame(lp, t), t, dur, lay, S, cfg.kout, alpha_t,
                                           _prune_at(prune, t))
        post = post * scale
        glp_t = jax.ops.segment_sum(jnp.where(lab_ok, post, 0.0).reshape(-1), lab_seg,
                                    num_segments=B * C).reshape(B, C)
        # frame T (no label >= 0 arcs: glp_t = 0) writes row T-1, which frame T-1 then overwrites
        glp = _put(glp, jnp.minimum(t, T - 1), glp_t)
        return _shift_max(b)[0], acc + post, glp

    init = (jnp.full(fvec.shape, NEG_INF, dtype), jnp.zeros(lay.score.shape, dtype),
            jnp.zeros((B, T, C), dtype))
    _, acc, glp = lax.fori_loop(0, T + 1, body, init)
    return glp, acc


# --------------------------------------------------------------------------------------------
# total score with analytic VJP
# --------------------------------------------------------------------------------------------


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _dense_tot(cfg: _Cfg, arcs, lp, dur, plan=None):
    return _dense_tot_fwd(cfg, arcs, lp, dur, plan)[0]


def _graph(cfg, arcs):
    G = _make_graph(arcs, cfg.S, cfg.kin, cfg.kout, cfg.dtype)
    if cfg.band is not None:
        G = G._replace(band=_band_scores(arcs, cfg.band, cfg.S, cfg.dtype))
    return G


def _loop_input(cfg: _Cfg, arcs, lp, dur):
    """What the frame loops read: log-probs [B, T, C], or for a labelled graph its state
    emissions [B, T+1, S] (`state_emissions`)."""
    if cfg.labelled:
        return state_emissions(_state_labels(arcs, cfg.S), lp, dur)
    return lp


def _dense_tot_fwd(cfg: _Cfg, arcs, lp, dur, plan=None):
    G = _graph(cfg, arcs)
    x = _loop_input(cfg, arcs, lp.astype(cfg.dtype), dur)
    e = x if cfg.labelled else None          # the labelled backward reads the emissions again
    if cfg.band is not None:       # forward and backward in one loop, Viterbi pass too
        prune = None
        if math.isfinite(cfg.beam):
            best, amax, bmax_next = _band_fused_loop(cfg, G, x, dur, log_semiring=False, true_values=True)
            prune = (amax, bmax_next, lax.stop_gradient(best - jnp.asarray(cfg.beam, cfg.dtype)))
        tot, alphas, bnext = _band_fused_loop(cfg, G, x, dur, prune=prune)
        return tot, (arcs, lp, dur, e, (alphas, bnext), tot, prune, plan)
    prune = _prune_info(cfg, G, x, dur)
    tot, alphas = _forward_loop(cfg, G, x, dur, True, prune)
    return tot, (arcs, lp, dur, e, (alphas,), tot, prune, plan)


def _dense_tot_bwd(cfg: _Cfg, res, g):
    arcs, lp, dur, e, tables, tot, prune, plan = res
    if cfg.labelled:
        glp, gscore = _labelled_tot_grads(cfg, arcs, lp, dur, e, tables, tot, prune, g, plan)
    else:
        glp, gscore = _dense_tot_grads(cfg, arcs, lp, dur, tables, tot, prune, g)
    z = jax.tree.map(lambda x: None, arcs._replace(score=None))
    return z._replace(score=gscore), glp, None, jax.tree.map(lambda x: None, plan)


@functools.partial(jax.jit, static_argnums=(0,))
def _dense_tot_grads(cfg, arcs, lp, dur, tables, tot, prune, g):
    (alphas,) = tables
    G = _graph(cfg, arcs)
    glp, acc = _grad_loop(cfg, G, lp.astype(cfg.dtype), dur, alphas, tot, g, prune)
    return glp.astype(lp.dtype), _arc_grads(cfg, arcs, G.bwd, acc)


def _arc_grads(cfg, arcs, lay: _Layout, acc):
    """[B, X] values of `lay`'s slots -> [B, A] per arc (in the graph's dtype)."""
    B, A = arcs.src.shape
    idx = jnp.where(lay.arc >= 0, lay.arc, A)
    b_idx = jnp.broadcast_to(jnp.arange(B)[:, None], idx.shape)
    gscore = jnp.zeros((B, A), cfg.dtype).at[b_idx, idx].add(acc, mode="drop")
    return gscore.astype(arcs.score.dtype)


@functools.partial(jax.jit, static_argnums=(0,))
def _labelled_tot_grads(cfg, arcs, lp, dur, e, tables, tot, prune, g, plan):
    """Gradients for a state-labelled graph: one backward loop for beta (unless the fused loop
    gave it: tables = (alphas, bnext)), then
    d tot / d lp[t, c] = sum over states s labelled c of the occupancy of (t+1, s), and
    d tot / d score = the arc posteriors summed over frames (a separate loop, dropped by XLA when
    the graph scores need no gradient).  d tot / d lp is read off the occupancies by the gathers
    of `label_gather_plan` (which XLA fuses into whatever consumes it), not scattered into zeros."""
    S, dtype = cfg.S, cfg.dtype
    B, T, C = lp.shape
    G = _graph(cfg, arcs)
    lab = _state_labels(arcs, S)
    if len(tables) == 2:
        alphas, bnext = tables
    else:
        (alphas,) = tables
        bnext = _backward_loop(cfg, G, e, dur, True, prune, true_values=False)     # [B, T+1, S]
    scale = jnp.where(jnp.isfinite(tot), g.astype(dtype), 0.0)
    # occupancy of the states entered on frame t < dur (each frame's rows carry any offset:
    # normalising over the states, through which every path passes once, removes it)
    x = alphas[:, 1:] + bnext[:, :T]                                           # [B, T, S]
    m = jnp.max(x, axis=-1, keepdims=True)
    occ = _exp_flushed(x - jnp.where(jnp.isfinite(m), m, 0.0))
    z = jnp.sum(occ, axis=-1, keepdims=True)
    live = (jnp.arange(T)[None, :, None] < dur[:, None, None]) & (z > 0) & (lab[:, None, :] >= 0)
    occ = jnp.where(live, occ * (scale[:, None, None] / jnp.where(z > 0, z, 1.0)), 0.0)
    major, first, fold_src, fold_dst = plan
    occ_major = jnp.sum(jnp.where((lab == major[:, None])[:, None, :], occ, 0.0), axis=-1)       # [B, T]
    occ = jnp.concatenate([occ, jnp.zeros((B, T, 1), dtype)], axis=2)            # column S: 0
    b_idx = jnp.arange(B)[:, None]
    occ = occ.at[b_idx, :, fold_dst].add(jnp.take_along_axis(occ, fold_src[:, None, :], axis=2).transpose(0, 2, 1),
                                         mode="promise_in_bounds")       # padding adds column S to itself: 0
    glp = jnp.where(jnp.arange(C)[None, None, :] == major[:, None, None], occ_major[..., None],
                    jnp.take_along_axis(occ, jnp.broadcast_to(first[:, None, :], (B, T, C)), axis=2,
                                        mode="promise_in_bounds"))
    lay = G.fwd

    def arc_post(t, acc):
        e_t, a_t = _frame(e, t), lax.dynamic_index_in_dim(alphas, t, axis=1, keepdims=False)
        b_t = lax.dynamic_index_in_dim(bnext, t, axis=1, keepdims=False)
        v = _take(a_t, lay.other) + lay.score + _group_take(e_t + b_t, lay, cfg.kin)
        if prune is not None:
            amax_t, bmax_next, cut = _prune_at(prune, t)
            fb = _take(amax_t, lay.other) + lay.score + _group_take(e_t + bmax_next, lay, cfg.kin)
            v = jnp.where(fb > cut[:, None], v, NEG_INF)
        vmax = jnp.max(v, axis=-1, keepdims=True)
        p = jnp.exp(v - jnp.where(jnp.isfinite(vmax), vmax, 0.0))
        zt = jnp.sum(p, axis=-1, keepdims=True)
        return acc + p * jnp.where(zt > 0, scale[:, None] / jnp.where(zt > 0, zt, 1.0), 0.0)

    acc = lax.fori_loop(0, T + 1, arc_post, jnp.zeros(lay.score.shape, dtype))
    return glp.astype(lp.dtype), _arc_grads(cfg, arcs, lay, acc)


_dense_tot.defvjp(_dense_tot_fwd, _dense_tot_bwd)


@functools.partial(jax.jit, static_argnums=(0,))
def _dense_tot_jit(cfg, arcs, lp, dur, plan=None):
    return _dense_tot(cfg, arcs, lp, dur, plan)


# --------------------------------------------------------------------------------------------
# public entry points
# --------------------------------------------------------------------------------------------


def is_state_labelled(arcs, S: int) -> bool:
    """Whether all arcs into each state carry one label (host-side; False for traced structure).

    Such graphs (CTC graphs and topologies, HMM-like graphs) take the labelled path of the loss:
    frame weights gathered per state once, no per-arc log-prob gathers or scatters per frame."""
    if is_traced(arcs.dst, arcs.label, arcs.num_arcs):
        return False
    valid = np.asarray(valid_arcs(arcs))
    if not valid.any():
        return False
    B = valid.shape[0]
    b_idx = np.broadcast_to(np.arange(B)[:, None], valid.shape)[valid].astype(np.int64)
    key = b_idx * S + np.clip(np.asarray(arcs.dst)[valid], 0, S - 1)
    lab = np.asarray(arcs.label)[valid].astype(np.int64)
    lo = np.full(B * S, np.iinfo(np.int64).max)
    hi = np.full(B * S, np.iinfo(np.int64).min)
    np.minimum.at(lo, key, lab)
    np.maximum.at(hi, key, lab)
    seen = hi >= lo
    return bool(np.all(lo[seen] == hi[seen]))


def label_gather_plan(arcs, S: int, C: int):
    """Host-side: how d tot / d log_probs of a state-labelled graph is read off its state
    occupancies occ [B, T, S] (extended by a zero column S) without a scatter into [B, T, C]:

    * ``major[b]``: the graph's most common state label (the blank of a CTC graph); its column is
      the sum of those states' occupancies;
    * every other label c reads one state, ``first[b, c]`` (S: no state), after the occupancies of
      its further states (``fold_src[b, j]``, a label repeated in a transcript) were added to it
      (``fold_dst[b, j]``); the fold lists are padded with S to a power of two, so that jit sees
      few distinct shapes.

    Returns (major int32 [B], first int32 [B, C], fold_src, fold_dst int32 [B, P]), or None for
    traced structure."""
    if is_traced(arcs.dst, arcs.label, arcs.num_arcs):
        return None
    valid = np.asarray(valid_arcs(arcs))
    B = valid.shape[0]
    b_idx = np.broadcast_to(np.arange(B)[:, None], valid.shape)[valid]
    lab = np.full((B, S), -2, np.int64)
    np.maximum.at(lab, (b_idx, np.clip(np.asarray(arcs.dst)[valid], 0, S - 1)),
                  np.asarray(arcs.label)[valid].astype(np.int64))
    labelled = lab >= 0
    counts = np.zeros((B, C), np.int64)
    rows = np.broadcast_to(np.arange(B)[:, None], lab.shape)
    np.add.at(counts, (rows[labelled], lab[labelled]), 1)
    major = np.argmax(counts, axis=1)
    b_o, s_o = np.nonzero(labelled & (lab != major[:, None]))
    c_o = lab[b_o, s_o]
    order = np.lexsort((s_o, c_o, b_o))                # by graph, label, state
    b_o, s_o, c_o = b_o[order], s_o[order], c_o[order]
    key = b_o * C + c_o
    head = np.searchsorted(key, key, side="left")      # index of each label's first state
    first = np.full((B, C), S, np.int32)
    first[b_o, c_o] = s_o[head]
    rest = np.arange(len(key)) != head
    per_graph = np.bincount(b_o[rest], minlength=B)
    P = 1 << int(max(per_graph.max(initial=0), 1) - 1).bit_length()
    fold_src = np.full((B, P), S, np.int32)
    fold_dst = np.full((B, P), S, np.int32)
    slot = np.arange(int(rest.sum())) - np.searchsorted(b_o[rest], b_o[rest], side="left")
    fold_src[b_o[rest], slot] = s_o[rest]
    fold_dst[b_o[rest], slot] = s_o[head[rest]]
    return tuple(jnp.asarray(x, jnp.int32) for x in (major, first, fold_src, fold_dst))


_TABLE_PADDING = 4   # table layout only while S * K <= this many times the number of arcs


def _check_dense(b_fsas):
    if not isinstance(b_fsas, DenseFsaVec):
        raise TypeError(f"b_fsas: expected a DenseFsaVec, got {type(b_fsas).__name__}")


def _prepare(a_fsas, b_fsas, a_to_b_map, output_beam, use_double_scores, name="a_fsas",
             sparse_tables_as_segments: bool = True):
    """Graph arcs batched to one graph per output sequence, the matching log-probs and config.

    kin / kout: the in/out degree for the table layout, None for the segment layout (traced
    structure, or -- unless `sparse_tables_as_segments` is False -- a mostly-padding table)."""
    _check_dense(b_fsas)
    if output_beam is None:
        output_beam = math.inf
    output_beam = float(output_beam)
    if not output_beam > 0:
        raise ValueError(f"output_beam must be > 0, got {output_beam}")
    arcs, S, _ = fsa_arrays(a_fsas, name)
    S = max(S, 1)
    Bg = arcs.src.shape[0]
    Bd = b_fsas.dim0()
    lp, dur = b_fsas.scores, b_fsas.duration
    if a_to_b_map is not None:
        m = jnp.asarray(a_to_b_map, jnp.int32)
        if m.shape != (Bg,):
            raise ValueError(f"a_to_b_map: expected shape ({Bg},) (one entry per graph), got {m.shape}")
        if not is_traced(m) and (np.asarray(m).min() < 0 or np.asarray(m).max() >= Bd):
            raise ValueError(f"a_to_b_map: entries must be in [0, {Bd})")
        lp, dur = lp[m], dur[m]
    elif Bg == 1 and Bd > 1:
        arcs = jax.tree.map(lambda x: (np if isinstance(x, np.ndarray) else jnp).broadcast_to(
            x, (Bd,) + x.shape[1:]), arcs)
    elif Bg != Bd:
        raise ValueError(f"{name}: {Bg} graphs for {Bd} supervision segments (give one graph per "
                         "segment, a single shared graph, or a_to_b_map)")
    C = lp.shape[2]
    if not is_traced(arcs.label, arcs.num_arcs):
        lab = np.asarray(arcs.label)
        v = np.asarray(valid_arcs(arcs))
        if v.any() and (lab[v].min() < -1 or lab[v].max() >= C):
            raise ValueError(f"{name}: labels must be in [-1, {C}) for log_probs with {C} symbols; "
                             f"got range [{lab[v].min()}, {lab[v].max()}]")
    A = arcs.src.shape[1]
    valid = valid_arcs(arcs)
    if is_traced(arcs.src, arcs.dst, arcs.num_arcs):
        kin = kout = None                                   # segment layout
    else:
        # a direction whose degree table would be mostly padding (e.g. the final state of a
        # denominator graph, entered from every state) uses the segment layout instead
        kin, kout = (k if S * k <= _TABLE_PADDING * max(A, 1) or not sparse_tables_as_segments else None
                     for k in (max_degree(arcs.dst, valid, S, A), max_degree(arcs.src, valid, S, A)))
    cfg = _Cfg(S, kin, kout, output_beam, score_dtype(use_double_scores))
    return cfg, arcs, lp, dur


def dense_tot_scores(a_fsas, b_fsas: DenseFsaVec, output_beam: float = math.inf,
                     use_double_scores: bool = True, a_to_b_map=None):
    """Log-semiring total score of ``intersect_dense(a_fsas, b_fsas, output_beam)`` per segment,
    computed frame-synchronously without building the lattice.

    Differentiable w.r.t. ``b_fsas.scores`` (hence the log-probs given to DenseFsaVec) and
    ``a_fsas.score`` with an analytic backward pass.  ``-inf`` (gradient 0) where no path fits.
    """
    cfg, arcs, lp, dur = _prepare(a_fsas, b_fsas, a_to_b_map, output_beam, use_double_scores)
    labelled = is_state_labelled(arcs, cfg.S)
    cfg = cfg._replace(labelled=labelled, band=band_offsets(arcs, cfg.S) if labelled else None)
    plan = label_gather_plan(arcs, cfg.S, lp.shape[2]) if labelled else None
    return _dense_tot_jit(cfg, arcs, lp, dur, plan)


@functools.partial(jax.jit, static_argnums=(0,))
def _lattice_core(cfg: _Cfg, arcs, attrs, lp, dur):
    B, A = arcs.src.shape
    S = cfg.S
    dtype = cfg.dtype
    T = lp.shape[1]
    lp = lp.astype(dtype)
    G = _graph(cfg, arcs)
    prune = _prune_info(cfg, G, lp, dur)
    valid = valid_arcs(arcs)
    ns = arcs.num_states
    t = jnp.arange(T + 1, dtype=jnp.int32)[None, :, None]         # [1, T+1, 1]
    d = dur[:, None, None]
    is_final = t == d                                             # [B, T+1, 1]
    lab = arcs.label[:, None, :]
    lp_ext = jnp.concatenate([lp, jnp.full((B, 1, lp.shape[2]), NEG_INF, dtype)], axis=1)  # [B,T+1,C]
    lpl = jnp.take_along_axis(lp_ext, jnp.maximum(lab, 0), axis=2)              # [B,T+1,A]
    score = jnp.where(valid, arcs.score.astype(dtype), NEG_INF)[:, None, :]
    w = score + jnp.where(lab >= 0, lpl, jnp.where(is_final, 0.0, NEG_INF))
    if prune is not None:
        amax, bmax_next, cut = prune                              # [B, T+1, S]
        fa = jnp.take_along_axis(amax, arcs.src[:, None, :], axis=2)
        bb = jnp.take_along_axis(bmax_next, arcs.dst[:, None, :], axis=2)
        w = jnp.where(fa + w + bb > cut[:, None, None], w, NEG_INF)
    real_arc = valid[:, None, :] & (((lab >= 0) & (t < d)) | ((lab == -1) & is_final))
    w = jnp.where(real_arc, w, NEG_INF)
    src_g = jnp.where(valid, arcs.src, jnp.maximum(ns - 1, 0)[:, None])[:, None, :]
    final_id = ((d + 1) * S)
    src = t * S + src_g
    dst_real = jnp.where(is_final, final_id, (t + 1) * S + arcs.dst[:, None, :])
    dst_dummy = jnp.where(is_final, final_id, (t + 1) * S + src_g)
    dst = jnp.where(real_arc, dst_real, dst_dummy)
    label = jnp.where(real_arc, lab, jnp.where(is_final, -1, 0))
    in_range = t <= d                                             # arcs of frames <= D_b exist
    shape = (B, (T + 1) * A)

    def flat(x, fill):
        x = jnp.broadcast_to(x, (B, T + 1, A) + x.shape[3:])
        x = jnp.where(in_range.reshape(in_range.shape + (1,) * (x.ndim - 3)), x,
                      jnp.asarray(fill, x.dtype))
        return x.reshape(shape + x.shape[3:])

    out = dict(src=flat(src, 0).astype(jnp.int32), dst=flat(dst, 0).astype(jnp.int32),
               label=flat(label, 0).astype(jnp.int32), score=flat(w, NEG_INF).astype(arcs.score.dtype))
    out_attrs = {k: flat(v[:, None], 0) for k, v in attrs.items()}
    frame = flat(jnp.broadcast_to(t, (B, T + 1, A)), 0)
    num_states = jnp.where(ns > 0, (dur + 1) * S + 1, 0).astype(jnp.int32)
    num_arcs = ((dur + 1) * A).astype(jnp.int32)
    return out, out_attrs, frame, num_states, num_arcs


def intersect_dense(a_fsas, b_fsas: DenseFsaVec, output_beam: float, max_states: int = 15000000,
                    max_arcs: int = 1073741824, a_to_b_map=None, seqframe_idx_name: Optional[str] = None,
                    frame_idx_name: Optional[str] = None) -> Fsa:
    """Intersect decoding graphs with a DenseFsaVec (k2's ``intersect_dense``); see the module doc.

    ``a_fsas``: one graph per segment (a batch), a single graph shared by all segments, or graphs
    mapped to segments by ``a_to_b_map``.  Graph arcs need not be arc-sorted.  ``max_states`` /
    ``max_arcs`` are accepted for k2 compatibility and checked against the (static) lattice size.
    Returns a lattice FsaVec with the graphs' per-arc attributes, plus ``frame_idx_name`` (frame of
    each arc) and ``seqframe_idx_name`` (k2's row into the dense scores: segment offset + frame)
    when asked.
    """
    cfg, arcs, lp, dur = _prepare(a_fsas, b_fsas, a_to_b_map, output_beam, True)
    cfg = cfg._replace(dtype=score_dtype(True))
    B, A = arcs.src.shape
    T = lp.shape[1]
    Sl = (T + 1) * cfg.S + 1
    if Sl > max_states or (T + 1) * A > max_arcs:
        raise ValueError(f"intersect_dense: lattice of {Sl} states / {(T + 1) * A} arcs per sequence "
                         f"exceeds max_states={max_states} / max_arcs={max_arcs}")
    a_batch = jnp.ndim(a_fsas.src) == 2
    attrs = {k: (jnp.asarray(v) if a_batch else jnp.asarray(v)[None]) for k, v in a_fsas.attrs.items()}
    attrs = {k: (jnp.broadcast_to(v, (B,) + v.shape[1:]) if v.shape[0] != B else v)
             for k, v in attrs.items()}
    out, out_attrs, frame, ns, na = _lattice_core(cfg, arcs, attrs, lp, dur)
    if frame_idx_name is not None:
        out_attrs[frame_idx_name] = frame
    if seqframe_idx_name is not None:
        offs = jnp.concatenate([jnp.zeros(1, jnp.int32), jnp.cumsum(b_fsas.duration + 1)[:-1]])
        seg_idx = jnp.arange(B) if a_to_b_map is None else jnp.asarray(a_to_b_map, jnp.int32)
        out_attrs[seqframe_idx_name] = (offs[seg_idx][:, None] + frame).astype(jnp.int32)
    return Fsa(out["src"], out["dst"], out["label"], out["score"].astype(jnp.float32), ns, na,
               out_attrs, max_states=Sl)
