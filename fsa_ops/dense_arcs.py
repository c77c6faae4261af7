"""The general arc layout of ``dense_tot_scores``: per-arc frame weights, any graph.

A graph's arcs are arranged for a reduction into states (`ArcLayout`): grouped by destination for
the forward scores, by source for the backward scores.  Two forms, same results:

- table (graph structure concrete, also inside a user's ``jit``): padded ``[B, S, K]`` tables of
  arc slots on the host-known degree ``K``, flattened to ``[B, S*K]``; a step is a gather and a
  reduction over ``K`` (no scatter);
- segment (structure traced, or a mostly-padding table): the arcs in their own order ``[B, A]``;
  the per-state reduction is a segment max / sum (a scatter).

Semiring: log (log-sum-exp) or tropical (max) on float scores, ``-inf`` = no path.  The per-frame
steps take frame ``t``'s log-probs ``[B, C]`` and look up every arc's label
(`dense_frame_weights`): ``alpha_{t+1}[d] = (+) over arcs into d of alpha_t[src] + w_t(arc)``.
They are the unit that a device kernel may replace; `fsa_ops.dense_loops` runs them over frames,
and the state-labelled layout (`fsa_ops.dense_labelled`) reuses the gathers and reductions here.
"""
from __future__ import annotations

import functools
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
from jax import lax

from fsa_ops.scores import NEG_INF, arc_table

__all__ = ["ArcLayout", "arc_layout", "dense_frame_weights", "take_per_row", "group_take", "reduce_to_states",
           "dense_forward_step", "dense_backward_step", "dense_backward_post_step", "frame_posteriors", "arc_grads"]


class ArcLayout(NamedTuple):
    """Arcs of each graph arranged for a reduction into `group` states.

    All arrays [B, X]: X = S*K (table form, row-major [S, K], `group` is implicit) or A (segment
    form).  `arc` is the original arc index (-1: empty slot); `other` the state at the other end.
    """
    arc: jax.Array
    group: jax.Array
    other: jax.Array
    label: jax.Array
    score: jax.Array


def arc_layout(arcs, valid, key, other, S, K, dtype) -> ArcLayout:
    """Arcs grouped by `key` (dst: forward, src: backward) with `other` the state at the other end;
    K: the table width (>= the largest degree), or None for the segment form.  Invalid arcs score
    -inf."""
    B, A = arcs.src.shape
    score = jnp.where(valid, arcs.score.astype(dtype), NEG_INF)
    other = jnp.clip(other, 0, S - 1)        # in range for the gathers (invalid arcs score -inf)
    if K is None:
        return ArcLayout(jnp.where(valid, jnp.arange(A, dtype=jnp.int32)[None], -1),
                         jnp.clip(key, 0, S - 1), other, arcs.label, score)
    table = arc_table(key, valid, S, K).reshape(B, S * K)
    ok = table >= 0
    t0 = jnp.maximum(table, 0)

    def g(x, fill):
        return jnp.where(ok, jnp.take_along_axis(x, t0, axis=1), jnp.asarray(fill, x.dtype))

    group = jnp.broadcast_to(jnp.repeat(jnp.arange(S, dtype=jnp.int32), K)[None], (B, S * K))
    return ArcLayout(table, group, g(other, 0), g(arcs.label, 0), g(score, NEG_INF))


def dense_frame_weights(lay: ArcLayout, lp_t, t, dur):
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
    library call that costs more than the arithmetic at these sizes."""
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


def take_per_row(x, idx):
    """x[b, idx[b, i]] for [B, N] x and [B, M] idx (indices clamped into range)."""
    return jnp.take_along_axis(x, idx, axis=1, mode="clip")


def reduce_to_states(vals, lay: ArcLayout, S: int, K: Optional[int], log_semiring: bool):
    """(+)-reduce [B, X] values of `lay`'s slots into their group states -> [B, S]."""
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


def group_take(x, lay: ArcLayout, K: Optional[int]):
    """x[b, group] for [B, S] x: a broadcast in table form, a gather in segment form."""
    if K is not None:
        B, S = x.shape
        return jnp.broadcast_to(x[:, :, None], (B, S, K)).reshape(B, S * K)
    return take_per_row(x, lay.group)


def _keep_mask(lay: ArcLayout, K, w, amax_t, bmax_next, cut, forward: bool):
    """Arcs within output_beam of the best path (Viterbi forward + arc + Viterbi backward)."""
    if forward:   # group = dst, other = src
        fb = take_per_row(amax_t, lay.other) + w + group_take(bmax_next, lay, K)
    else:         # group = src, other = dst
        fb = group_take(amax_t, lay, K) + w + take_per_row(bmax_next, lay.other)
    return fb > cut[:, None]


def _pruned_weights(lay, K, lp_t, t, dur, prune, forward: bool):
    w = dense_frame_weights(lay, lp_t, t, dur)
    if prune is not None:
        w = jnp.where(_keep_mask(lay, K, w, *prune, forward=forward), w, NEG_INF)
    return w


def dense_forward_step(alpha, lp_t, t, dur, lay, S, K, log_semiring, prune=None):
    """alpha_t [B, S] -> alpha_{t+1} [B, S] for frame t.

    prune: None, or frame t's output-beam tables (Viterbi amax_t [B, S], bmax_{t+1} [B, S],
    cut [B]): arcs whose best path through them is not above `cut` weigh -inf."""
    w = _pruned_weights(lay, K, lp_t, t, dur, prune, forward=True)
    vals = take_per_row(alpha, lay.other) + w
    return reduce_to_states(vals, lay, S, K, log_semiring)


def dense_backward_step(beta_next, lp_t, t, dur, lay, S, K, log_semiring, prune=None):
    """beta_{t+1} [B, S] -> beta_t [B, S] for frame t (prune as in `dense_forward_step`)."""
    w = _pruned_weights(lay, K, lp_t, t, dur, prune, forward=False)
    vals = w + take_per_row(beta_next, lay.other)
    return reduce_to_states(vals, lay, S, K, log_semiring)


def dense_backward_post_step(beta_next, lp_t, t, dur, lay, S, K, alpha_t, prune=None):
    """Log-semiring backward step that also returns the arc posteriors of frame t.

    beta_{t+1} [B, S] -> (beta_t [B, S], post [B, X]) with
    ``post[x] = exp(alpha_t[src] + w + beta_{t+1}[dst]) / (sum of that over the frame's arcs)``:
    every path takes exactly one arc per frame (t <= dur), so the frame's posteriors sum to 1 and
    this normalisation replaces the division by the total score.  alpha_t and beta_{t+1} may
    therefore carry any per-row offset (the loops keep them shifted to max 0, which keeps
    float32's precision for long segments).  In table form the exponentials of the log-sum-exp
    are reused (one exp per arc, one per state).  post is 0 on frames past ``dur``.
    """
    w = _pruned_weights(lay, K, lp_t, t, dur, prune, forward=False)
    B = w.shape[0]
    vals = w + take_per_row(beta_next, lay.other)
    if K is not None:
        beta, m, e = _logsumexp_k(vals.reshape(B, S, K))
        c = alpha_t + m
        cmax = jnp.max(c, axis=-1, keepdims=True)
        coef = jnp.exp(c - jnp.where(jnp.isfinite(cmax), cmax, 0.0))
        un = (e * coef[..., None]).reshape(B, S * K)
    else:
        beta = reduce_to_states(vals, lay, S, None, True)
        a = group_take(alpha_t, lay, None) + vals
        amax = jnp.max(a, axis=-1, keepdims=True)
        un = jnp.exp(a - jnp.where(jnp.isfinite(amax), amax, 0.0))
    z = jnp.sum(un, axis=-1, keepdims=True)
    return beta, un * jnp.where(z > 0, 1.0 / jnp.where(z > 0, z, 1.0), 0.0)


def frame_posteriors(lay: ArcLayout, K, lp_t, t, dur, alpha_t, beta_next, prune=None):
    """The normalised arc posteriors of frame t [B, X] (lay grouped by src) from the scores on both sides,
    ``exp(alpha_t[src] + w + beta_{t+1}[dst])`` over its sum over the frame's arcs (0 past ``dur``): what
    `dense_backward_post_step` returns, for tables computed elsewhere (any per-row offsets)."""
    w = _pruned_weights(lay, K, lp_t, t, dur, prune, forward=False)
    a = group_take(alpha_t, lay, K) + w + take_per_row(beta_next, lay.other)
    amax = jnp.max(a, axis=-1, keepdims=True)
    un = jnp.exp(a - jnp.where(jnp.isfinite(amax), amax, 0.0))
    z = jnp.sum(un, axis=-1, keepdims=True)
    return un * jnp.where(z > 0, 1.0 / jnp.where(z > 0, z, 1.0), 0.0)


def arc_grads(arcs, lay: ArcLayout, acc, dtype):
    """[B, X] values of `lay`'s slots -> [B, A] per arc (summed in `dtype`, returned in the graph
    scores' dtype)."""
    B, A = arcs.src.shape
    idx = jnp.where(lay.arc >= 0, lay.arc, A)
    b_idx = jnp.broadcast_to(jnp.arange(B)[:, None], idx.shape)
    gscore = jnp.zeros((B, A), dtype).at[b_idx, idx].add(acc, mode="drop")
    return gscore.astype(arcs.score.dtype)
