"""Loops over frames and the gradients of ``dense_tot_scores``, shared by its arc layouts.

Tables are batch-major: the forward scores ``alphas [B, T+1, S]`` (``alpha_t`` for t = 0..T) and
backward scores ``bnext [B, T+1, S]`` (``beta_{t+1}``), each frame's row shifted to max 0 (the
offsets are kept apart, which keeps float32's absolute precision for long segments), log semiring
or max (Viterbi).  `forward_loop` / `backward_loop` run one ``lax.fori_loop`` over frames 0..T and
pick the step of the layout that the `DenseConfig` names: general arcs (`fsa_ops.dense_arcs`,
reading log-probs ``[B, T, C]``), state-labelled (`fsa_ops.dense_labelled`) or band
(`fsa_ops.dense_band`), both reading state emissions ``[B, T+1, S]``.  Band graphs run both
directions in one loop (`band_fused_loop`).  `prune_info` makes the Viterbi tables of
``output_beam``.  The gradients (`arcs_tot_grads`, `labelled_tot_grads`) are what the custom VJP of
``fsa_ops.dense`` returns: per-frame normalised arc posteriors (general arcs) or state occupancies
gathered per label (labelled graphs); memory is the score tables, nothing of size frames x arcs.
A `DenseConfig` with ``slots`` set (the Pallas path) runs `forward_loop` / `backward_loop` as one
kernel launch each (`fsa_ops.pallas_dense`; no fused band loop), and the general arcs' gradient
from both tables, a chunk of frames at a time (`_posterior_grads`).
"""
from __future__ import annotations

import functools
import math
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
from jax import lax

from fsa_ops.dense_arcs import (ArcLayout, arc_grads, arc_layout, dense_backward_post_step,
                                dense_backward_step, dense_forward_step, frame_posteriors, group_take, take_per_row)
from fsa_ops.dense_band import (band_reduce, band_scores, dense_band_backward_step,
                                dense_band_forward_step)
from fsa_ops.dense_labelled import (dense_labelled_backward_step, dense_labelled_forward_step,
                                    state_emissions, state_labels)
from fsa_ops.pallas_dense import pad_states, pallas_frame_scores, slot_tables
from fsa_ops.scores import NEG_INF, exp_flushed, shift_states, valid_arcs

__all__ = ["DenseConfig", "DenseGraph", "dense_graph", "loop_input", "forward_loop", "backward_loop",
           "band_fused_loop", "prune_info", "arcs_tot_grads", "labelled_tot_grads"]


class DenseConfig(NamedTuple):
    """Static configuration of one scoring call (hashable: a static argument of the jitted code)."""
    S: int                   # graph states (padded)
    kin: Optional[int]       # table width grouped by dst (forward), None: segment form
    kout: Optional[int]      # table width grouped by src (backward), None: segment form
    beam: float              # output_beam (inf: exact total)
    dtype: object            # score dtype
    labelled: bool = False   # state-labelled graph: frame weights per state (see `state_emissions`)
    band: Optional[tuple] = None   # labelled graphs with few dst - src offsets: those offsets
    slots: Optional[tuple] = None  # the Pallas kernels' padded table sizes (`slot_sizes`); None: the XLA loops
    interpret: bool = False        # run the Pallas kernels in interpret mode (any backend)


class DenseGraph(NamedTuple):
    """A batch of graphs laid out for the loops (`dense_graph`)."""
    fwd: ArcLayout          # grouped by dst (forward)
    bwd: ArcLayout          # grouped by src (backward)
    num_states: jax.Array   # [B]
    band: Optional[jax.Array] = None   # [B, D, S] scores by dst - src offset (`band_scores`)
    slots: Optional[tuple] = None      # (forward, backward) `SlotTables` of the Pallas kernels


def dense_graph(cfg: DenseConfig, arcs) -> DenseGraph:
    """The graph's arcs in the layouts that `cfg` chose (arc layouts in both directions, and the
    band scores of a band-layout graph)."""
    valid = valid_arcs(arcs)
    S, dtype = cfg.S, cfg.dtype
    G = DenseGraph(arc_layout(arcs, valid, arcs.dst, arcs.src, S, cfg.kin, dtype),
                   arc_layout(arcs, valid, arcs.src, arcs.dst, S, cfg.kout, dtype),
                   arcs.num_states)
    if cfg.band is not None:
        G = G._replace(band=band_scores(arcs, cfg.band, S, dtype))
    if cfg.slots is not None:
        G = G._replace(slots=slot_tables(arcs, cfg.slots, dtype))
    return G


def _pallas_loop(cfg: DenseConfig, G: DenseGraph, x, dur, log_semiring, prune, true_values, forward):
    """`forward_loop` / `backward_loop` as one Pallas kernel launch (`fsa_ops.pallas_dense`)."""
    Sp = cfg.slots[0]
    T = _num_frames(cfg, x)
    if cfg.labelled:
        x = pad_states(x, Sp)
    if prune is not None:
        amax, bmax_next, cut = prune
        prune = (pad_states(amax, Sp), pad_states(bmax_next, Sp), cut)
    tot, table = pallas_frame_scores(G.slots[0 if forward else 1], x, dur, G.num_states, prune, num_frames=T,
                                     forward=forward, log_semiring=log_semiring, state_mode=cfg.labelled,
                                     true_values=true_values, interpret=cfg.interpret, slot_block=cfg.slots[4])
    return tot, table[:, :, :cfg.S]


def loop_input(cfg: DenseConfig, arcs, lp, dur):
    """What the frame loops read: log-probs [B, T, C], or for a labelled graph its state
    emissions [B, T+1, S] (`state_emissions`)."""
    if cfg.labelled:
        return state_emissions(state_labels(arcs, cfg.S), lp, dur)
    return lp


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


def _num_frames(cfg: DenseConfig, x):
    """T from the loops' input: log-probs [B, T, C], or state emissions [B, T+1, S] (labelled)."""
    return x.shape[1] - 1 if cfg.labelled else x.shape[1]


def _forward_step(cfg: DenseConfig, G: DenseGraph, x, dur, log_semiring, prune, alpha, t):
    if cfg.band is not None:
        return dense_band_forward_step(alpha, _frame(x, t), G.band, cfg.band, log_semiring,
                                       _prune_at(prune, t))
    if cfg.labelled:
        return dense_labelled_forward_step(alpha, _frame(x, t), G.fwd, cfg.S, cfg.kin, log_semiring,
                                           _prune_at(prune, t))
    return dense_forward_step(alpha, _frame(x, t), t, dur, G.fwd, cfg.S, cfg.kin, log_semiring,
                              _prune_at(prune, t))


def _backward_step(cfg: DenseConfig, G: DenseGraph, x, dur, log_semiring, prune, beta_next, t):
    if cfg.band is not None:
        return dense_band_backward_step(beta_next, _frame(x, t), G.band, cfg.band, log_semiring,
                                        _prune_at(prune, t))
    if cfg.labelled:
        return dense_labelled_backward_step(beta_next, _frame(x, t), G.bwd, cfg.S, cfg.kout,
                                            log_semiring, _prune_at(prune, t))
    return dense_backward_step(beta_next, _frame(x, t), t, dur, G.bwd, cfg.S, cfg.kout, log_semiring,
                               _prune_at(prune, t))


def forward_loop(cfg: DenseConfig, G: DenseGraph, x, dur, log_semiring, prune=None, true_values=False):
    """Forward scores alpha_0..alpha_T of every segment.

    x: log-probs [B, T, C], or the state emissions [B, T+1, S] of a labelled graph.  Returns
    (tot [B], alphas [B, T+1, S]): each frame's row shifted to max 0 (what the posteriors need;
    keeps float32's precision), or with `true_values` the scores themselves (the running offsets
    added back; for the Viterbi pruning tables)."""
    if cfg.slots is not None:
        return _pallas_loop(cfg, G, x, dur, log_semiring, prune, true_values, forward=True)
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


def backward_loop(cfg: DenseConfig, G: DenseGraph, x, dur, log_semiring, prune=None, true_values=True):
    """Backward scores beta_{t+1} for t = 0..T: [B, T+1, S] (x as in `forward_loop`); true values,
    or each frame's row shifted to max 0 (`true_values=False`)."""
    if cfg.slots is not None:
        return _pallas_loop(cfg, G, x, dur, log_semiring, prune, true_values, forward=False)[1]
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


def band_fused_loop(cfg: DenseConfig, G: DenseGraph, e, dur, log_semiring=True, prune=None, true_values=False):
    """Forward and backward scores of a band-layout graph in ONE loop over frames, on a [2B, S]
    array: rows 0..B-1 run alpha over frames 0..T, rows B..2B-1 run ``g_t = e_t + beta_{t+1}``
    over frames T..0 with their states reversed, so that both take
    ``new = e + (+)_j (shift(x, o_j) + band_j)`` (the backward band holds the arc s -> s + o_j at
    s, reversed).  Halves the serial steps of two loops.

    e [B, T+1, S] (`state_emissions`); log_semiring False: the Viterbi (max) scores; prune: the
    output-beam masks' tables (amax, bmax_next, cut) as `prune_info` makes them, applied to both
    directions (the arcs of the pruned lattice).  Returns (tot [B], alphas [B, T+1, S],
    bnext [B, T+1, S]) in the conventions of `forward_loop` / `backward_loop`: each frame's row
    shifted by some per-frame offset, or with `true_values` the scores themselves."""
    S, dtype, offsets = cfg.S, cfg.dtype, cfg.band
    B, T = e.shape[0], e.shape[1] - 1
    ns = G.num_states
    final = jnp.maximum(ns - 1, 0)
    fvec = _final_vec(ns, S, dtype)
    back = jnp.stack([shift_states(G.band[:, j], -o) for j, o in enumerate(offsets)], axis=1)
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
        return [jnp.concatenate([shift_states(a_f, o) + G.band[:, j] + h_f,
                                 (a_b + shift_states(G.band[:, j] + h_b, -o))[:, ::-1]], axis=0) > cut2
                for j, o in enumerate(offsets)]

    def body(i, carry):
        x, cum, tot, tab, ctab = carry
        terms = [shift_states(x, o) + band[j] for j, o in enumerate(offsets)]
        if prune is not None:
            terms = [jnp.where(k, v, NEG_INF) for k, v in zip(kept(i), terms)]
        inc = band_reduce(terms, log_semiring)
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


def prune_info(cfg: DenseConfig, G: DenseGraph, lp, dur):
    """Viterbi tables for output_beam: (amax [B, T+1, S], bmax_next [B, T+1, S], cut [B])."""
    if not math.isfinite(cfg.beam):
        return None
    best, amax = forward_loop(cfg, G, lp, dur, False, true_values=True)
    bmax_next = backward_loop(cfg, G, lp, dur, False)
    cut = best - jnp.asarray(cfg.beam, cfg.dtype)          # -inf when there is no path
    return amax, bmax_next, lax.stop_gradient(cut)


def _grad_loop(cfg: DenseConfig, G: DenseGraph, lp, dur, alphas, tot, g, prune):
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


# frames per vectorised chunk of `_posterior_grads`
POSTERIOR_CHUNK = 16


def _posterior_grads(cfg: DenseConfig, G: DenseGraph, lp, dur, alphas, bnext, tot, g, prune):
    """`_grad_loop`'s results from both score tables (the Pallas path): no recursion left, so the frames'
    posteriors are computed `POSTERIOR_CHUNK` frames at a time (vectorised) and scatter-added onto their labels."""
    dtype = cfg.dtype
    B, T, C = lp.shape
    lay = G.bwd
    scale = jnp.where(jnp.isfinite(tot), g.astype(dtype), 0.0)[:, None]
    lab_seg = (jnp.arange(B, dtype=jnp.int32)[:, None] * C + jnp.maximum(lay.label, 0)).reshape(-1)
    lab_ok = lay.label >= 0
    F = min(POSTERIOR_CHUNK, T + 1)
    n = -(-(T + 1) // F)

    def frame(t):
        def at(x):
            return lax.dynamic_index_in_dim(x, t, axis=1, keepdims=False)
        post = frame_posteriors(lay, cfg.kout, _frame(lp, t), t, dur, at(alphas), at(bnext), _prune_at(prune, t))
        post = post * scale
        glp_t = jax.ops.segment_sum(jnp.where(lab_ok, post, 0.0).reshape(-1), lab_seg,
                                    num_segments=B * C).reshape(B, C)
        return post, glp_t

    def chunk(c, carry):
        acc, glp = carry
        ts = c * F + jnp.arange(F, dtype=jnp.int32)
        post, glp_c = jax.vmap(frame)(jnp.minimum(ts, T))
        acc = acc + jnp.sum(jnp.where((ts <= T)[:, None, None], post, 0.0), axis=0)
        return acc, lax.dynamic_update_slice_in_dim(glp, glp_c, c * F, axis=0)

    init = (jnp.zeros(lay.score.shape, dtype), jnp.zeros((n * F, B, C), dtype))
    acc, glp = lax.fori_loop(0, n, chunk, init)
    # frame T (no label >= 0 arc can be taken) is dropped: rows 0..T-1 are the log-probs' frames
    return jnp.moveaxis(glp[:T], 0, 1), acc


@functools.partial(jax.jit, static_argnums=(0,))
def arcs_tot_grads(cfg, arcs, lp, dur, tables, tot, prune, g):
    """Gradients for the general arc layout: (d tot / d lp [B, T, C], d tot / d score [B, A]) times
    the cotangent g [B], from one backward loop over frames that scatter-adds each frame's
    normalised arc posteriors onto their labels (tables = (alphas,) of `forward_loop`); on the Pallas
    path, from the backward kernel's scores and frame-parallel posteriors (`_posterior_grads`)."""
    (alphas,) = tables
    G = dense_graph(cfg, arcs)
    lp32 = lp.astype(cfg.dtype)
    if cfg.slots is not None:
        bnext = backward_loop(cfg, G, lp32, dur, True, prune, true_values=False)
        glp, acc = _posterior_grads(cfg, G, lp32, dur, alphas, bnext, tot, g, prune)
    else:
        glp, acc = _grad_loop(cfg, G, lp32, dur, alphas, tot, g, prune)
    return glp.astype(lp.dtype), arc_grads(arcs, G.bwd, acc, cfg.dtype)


@functools.partial(jax.jit, static_argnums=(0,))
def labelled_tot_grads(cfg, arcs, lp, dur, e, tables, tot, prune, g, plan):
    """Gradients for a state-labelled graph: one backward loop for beta (unless the fused loop
    gave it: tables = (alphas, bnext)), then
    d tot / d lp[t, c] = sum over states s labelled c of the occupancy of (t+1, s), and
    d tot / d score = the arc posteriors summed over frames (a separate loop, dropped by XLA when
    the graph scores need no gradient).  d tot / d lp is read off the occupancies by the gathers
    of `label_gather_plan` (which XLA fuses into whatever consumes it), not scattered into zeros."""
    S, dtype = cfg.S, cfg.dtype
    B, T, C = lp.shape
    G = dense_graph(cfg, arcs)
    lab = state_labels(arcs, S)
    if len(tables) == 2:
        alphas, bnext = tables
    else:
        (alphas,) = tables
        bnext = backward_loop(cfg, G, e, dur, True, prune, true_values=False)     # [B, T+1, S]
    scale = jnp.where(jnp.isfinite(tot), g.astype(dtype), 0.0)
    # occupancy of the states entered on frame t < dur (each frame's rows carry any offset:
    # normalising over the states, through which every path passes once, removes it)
    x = alphas[:, 1:] + bnext[:, :T]                                           # [B, T, S]
    m = jnp.max(x, axis=-1, keepdims=True)
    occ = exp_flushed(x - jnp.where(jnp.isfinite(m), m, 0.0))
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
        v = take_per_row(a_t, lay.other) + lay.score + group_take(e_t + b_t, lay, cfg.kin)
        if prune is not None:
            amax_t, bmax_next, cut = _prune_at(prune, t)
            fb = take_per_row(amax_t, lay.other) + lay.score + group_take(e_t + bmax_next, lay, cfg.kin)
            v = jnp.where(fb > cut[:, None], v, NEG_INF)
        vmax = jnp.max(v, axis=-1, keepdims=True)
        p = jnp.exp(v - jnp.where(jnp.isfinite(vmax), vmax, 0.0))
        zt = jnp.sum(p, axis=-1, keepdims=True)
        return acc + p * jnp.where(zt > 0, scale[:, None] / jnp.where(zt > 0, zt, 1.0), 0.0)

    acc = lax.fori_loop(0, T + 1, arc_post, jnp.zeros(lay.score.shape, dtype))
    return glp.astype(lp.dtype), arc_grads(arcs, lay, acc, cfg.dtype)

