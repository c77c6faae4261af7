"""The state-labelled layout of ``dense_tot_scores``: every arc into a state carries one label.

CTC graphs and topologies and HMM-like graphs with labels on states are state-labelled
(`is_state_labelled`, decided on the host).  The frame weight of an arc then belongs to its
destination state, ``w_t(arc) = score(arc) + e_t[dst]``, and the state emissions
``e [B, T+1, S]`` (`state_emissions`) are gathered once before the loops: the per-frame steps
(`dense_labelled_forward_step` / `dense_labelled_backward_step`, log semiring or max over the arc
layouts of `fsa_ops.dense_arcs`) touch no log-probs, and ``d tot / d log_probs`` is the state
occupancy ``alpha_{t+1}[s] * beta_{t+1}[s] / Z`` summed per label after the loops, read off by the
gathers of a host-side `label_gather_plan` (no scatter into a ``[B, T, C]`` buffer).  Graphs that
also have few ``dst - src`` offsets take the band layout (`fsa_ops.dense_band`).
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from fsa_ops.dense_arcs import ArcLayout, group_take, reduce_to_states, take_per_row
from fsa_ops.scores import NEG_INF, is_traced, valid_arcs

__all__ = ["is_state_labelled", "label_gather_plan", "state_labels", "state_emissions",
           "dense_labelled_forward_step", "dense_labelled_backward_step"]


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


def state_labels(arcs, S: int):
    """[B, S] label of the arcs entering each state; -2 for states without any.  A scatter-max
    over the arcs (no arc sort, which XLA:CPU runs slowly)."""
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


def dense_labelled_forward_step(alpha, e_t, lay: ArcLayout, S, K, log_semiring, prune=None):
    """alpha_t [B, S] -> alpha_{t+1} = e_t + (+)_{arcs} (alpha_t[src] + score) (lay grouped by dst).

    prune: None, or frame t's output-beam tables (Viterbi amax_t [B, S], bmax_{t+1} [B, S],
    cut [B]): arcs whose best path through them is not above `cut` weigh -inf."""
    vals = take_per_row(alpha, lay.other) + lay.score
    if prune is not None:
        amax_t, bmax_next, cut = prune
        fb = take_per_row(amax_t, lay.other) + lay.score + group_take(e_t + bmax_next, lay, K)
        vals = jnp.where(fb > cut[:, None], vals, NEG_INF)
    return e_t + reduce_to_states(vals, lay, S, K, log_semiring)


def dense_labelled_backward_step(beta_next, e_t, lay: ArcLayout, S, K, log_semiring, prune=None):
    """beta_{t+1} [B, S] -> beta_t = (+)_{arcs} (score + e_t[dst] + beta_{t+1}[dst]) (lay grouped
    by src; prune as in `dense_labelled_forward_step`)."""
    vals = take_per_row(e_t + beta_next, lay.other) + lay.score
    if prune is not None:
        amax_t, bmax_next, cut = prune
        fb = group_take(amax_t, lay, K) + lay.score + take_per_row(e_t + bmax_next, lay.other)
        vals = jnp.where(fb > cut[:, None], vals, NEG_INF)
    return reduce_to_states(vals, lay, S, K, log_semiring)
