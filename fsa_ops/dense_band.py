"""The band layout of ``dense_tot_scores``: state-labelled graphs with few ``dst - src`` offsets.

A state-labelled graph (`fsa_ops.dense_labelled`) whose arcs have at most `MAX_BAND` distinct
offsets ``dst - src`` and no two arcs with the same source and destination (CTC graphs: offsets
0, 1, 2) is held as ``band [B, D, S]``: ``band[b, j, s]`` is the score of the arc
``s - offsets[j] -> s`` of graph ``b`` (``-inf`` if none).  A step is then a few shifted copies of
the state vector instead of a gather through an arc table:

    alpha_{t+1}[s] = e_t[s] + (+)_j (alpha_t[s - o_j] + band[j, s])

with ``e_t [B, S]`` the state emissions of frame ``t`` (log semiring or max, ``-inf`` = no path).
`band_offsets` decides on the host whether a graph fits; `fsa_ops.dense_loops` runs these steps,
and with an exact total its fused loop runs forward and backward scores as one ``[2B, S]`` array
(backward rows state-reversed, as ``fsa_ops.ctc`` does).
"""
from __future__ import annotations

import functools
from typing import Optional

import jax.numpy as jnp
import numpy as np

from fsa_ops.scores import NEG_INF, exp_flushed, is_traced, shift_states, valid_arcs

__all__ = ["MAX_BAND", "band_offsets", "band_scores", "band_reduce", "dense_band_forward_step",
           "dense_band_backward_step"]

# the most distinct dst - src offsets a band-layout graph may have
MAX_BAND = 4


def band_offsets(arcs, S: int) -> Optional[tuple]:
    """Sorted distinct dst - src offsets if the graph fits the band layout, else None (host-side)."""
    if is_traced(arcs.src, arcs.dst, arcs.num_arcs):
        return None
    valid = np.asarray(valid_arcs(arcs))
    if not valid.any():
        return None
    src, dst = np.asarray(arcs.src)[valid], np.asarray(arcs.dst)[valid]
    offsets = np.unique(dst - src)
    if len(offsets) > MAX_BAND:
        return None
    b_idx = np.broadcast_to(np.arange(valid.shape[0])[:, None], valid.shape)[valid].astype(np.int64)
    pair = (b_idx * S + src) * S + dst
    if len(np.unique(pair)) != len(pair):          # parallel arcs: one band slot cannot hold both
        return None
    return tuple(int(o) for o in offsets)


def band_scores(arcs, offsets, S, dtype):
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


def band_reduce(terms, log_semiring):
    """(+) over a list of [B, S] terms (log-sum-exp or max), -inf where all are -inf."""
    m = functools.reduce(jnp.maximum, terms)
    if not log_semiring:
        return m
    m0 = jnp.where(jnp.isfinite(m), m, 0.0)
    # the largest term contributes exp(0) = 1, so ssum >= 1 unless all terms are -inf (then
    # log(0) = -inf, the right answer; the callers' gradients are analytic, no NaN through it)
    return m0 + jnp.log(functools.reduce(jnp.add, [exp_flushed(v - m0) for v in terms]))


def dense_band_forward_step(alpha, e_t, band, offsets, log_semiring, prune=None):
    """alpha_{t+1}[s] = e_t[s] + (+)_j (alpha_t[s - o_j] + band[j, s]).

    prune: None, or frame t's output-beam tables (Viterbi amax_t [B, S], bmax_{t+1} [B, S],
    cut [B]): arcs whose best path through them is not above `cut` weigh -inf."""
    terms = [shift_states(alpha, o) + band[:, j] for j, o in enumerate(offsets)]
    if prune is not None:
        amax_t, bmax_next, cut = prune
        after = e_t + bmax_next
        terms = [jnp.where(shift_states(amax_t, o) + band[:, j] + after > cut[:, None], terms[j], NEG_INF)
                 for j, o in enumerate(offsets)]
    return e_t + band_reduce(terms, log_semiring)


def dense_band_backward_step(beta_next, e_t, band, offsets, log_semiring, prune=None):
    """beta_t[s] = (+)_j (band[j, s + o_j] + e_t[s + o_j] + beta_{t+1}[s + o_j]) (prune as in
    `dense_band_forward_step`)."""
    g = [shift_states(band[:, j] + e_t + beta_next, -o) for j, o in enumerate(offsets)]
    if prune is not None:
        amax_t, bmax_next, cut = prune
        h = [shift_states(band[:, j] + e_t + bmax_next, -o) for j, o in enumerate(offsets)]
        g = [jnp.where(amax_t + hj > cut[:, None], gj, NEG_INF) for gj, hj in zip(g, h)]
    return band_reduce(g, log_semiring)
