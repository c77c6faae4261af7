"""k2's ``intersect_dense_pruned``: frame-synchronous beam search producing a pruned lattice.

A ``lax.scan`` over frames keeps, per segment, a fixed-size set of active graph states
(``K = min(max_active_states, graph states)`` slots, so that it jit-compiles with static shapes).
On each frame every arc leaving an active state is expanded (``[K, Kout]`` candidates, ``Kout`` =
the graph's largest out-degree), candidate scores are max-combined per destination state (Viterbi,
as k2's pruned search), and the next active set is the top-``K`` destination states whose score is
within ``search_beam`` of the frame's best -- but at least the best ``min_active_states`` of them
(when they are reachable at all), as in k2's dynamic beam.  Frames are consumed as in
:mod:`fsa_ops.dense` (labels ``>= 0`` take one frame, the final ``-1`` arc the extra end frame).

The recorded arcs form the lattice; a Viterbi backward pass over it removes arcs whose best path
is more than ``output_beam`` below the best path (their score becomes ``-inf``).  Layout (static
shapes): state ``t * K + k`` is slot ``k`` at frame ``t`` (``t <= D_b``), state ``(D_b + 1) * K``
is final; arc ``(t * K + k) * Kout + j`` is the ``j``-th arc leaving slot ``k``'s state on frame
``t``.  Arcs keep the graph's per-arc attributes, arrays or ``Ragged`` (0 / an empty row on slots
without a graph arc); ``frame_idx_name`` adds the frame index.
The frame step (`pruned_frame_step`) and the lattice builder (`pruned_lattice`) are shared with
:mod:`fsa_ops.online` (k2's ``OnlineDenseIntersecter``, the same search fed chunk by chunk).

Memory is ``O(frames x K x Kout)`` per segment: suited to CTC topologies / modest graphs; for
HLG-size graphs with very uneven out-degrees choose ``max_active_states`` accordingly.
The lattice's arc scores are differentiable w.r.t. the log-probs (autodiff through the scan).
A segment with a NaN or +inf log-prob in a valid frame (or graph score) gets a lattice whose arcs
all score NaN (as ``fsa_ops.dense.intersect_dense``), never a finite or empty lattice.
"""
from __future__ import annotations

import functools
import math
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from fsa_ops.dense import DenseFsaVec, bad_segments, broadcast_attrs, prepare_dense
from fsa_ops.dense_arcs import arc_layout
from fsa_ops.fsa import Fsa
from fsa_ops.scores import NEG_INF, valid_arcs

__all__ = ["intersect_dense_pruned", "PrunedConfig", "pruned_frame_step", "pruned_tables", "pruned_lattice",
           "final_frame_arcs", "check_search_args"]


class PrunedConfig(NamedTuple):
    """Static settings of the beam search (S graph states, kout out-degree table width, K active slots)."""
    S: int
    kout: int
    K: int
    search_beam: float
    output_beam: float
    min_active: int
    dtype: object


def pruned_frame_step(act, sc, lp_t, is_final, tab, cfg: PrunedConfig):
    """One frame of the beam search.

    act [B, K] active graph states (-1 empty), sc [B, K] their Viterbi scores, lp_t [B, C].
    Returns the next (act, sc) and the frame's candidate arcs (w, dst_slot) [B, K, Kout].
    """
    out_arc, out_dst, out_label, out_score = tab
    B, K = act.shape
    S = cfg.S
    a0 = jnp.maximum(act, 0)[:, :, None]
    c_arc = jnp.take_along_axis(out_arc, a0, axis=1)                     # [B, K, Kout]
    c_dst = jnp.take_along_axis(out_dst, a0, axis=1)
    c_lab = jnp.take_along_axis(out_label, a0, axis=1)
    c_sc = jnp.take_along_axis(out_score, a0, axis=1)
    lpl = jnp.take_along_axis(lp_t, jnp.maximum(c_lab, 0).reshape(B, -1), axis=1).reshape(c_lab.shape)
    fin = jnp.where(is_final, 0.0, NEG_INF).astype(lp_t.dtype)[:, None, None]
    w = c_sc + jnp.where(c_lab >= 0, lpl, fin)
    w = jnp.where((act >= 0)[:, :, None] & (c_arc >= 0), w, NEG_INF)
    cand = sc[:, :, None] + w
    seg = (jnp.arange(B, dtype=jnp.int32)[:, None, None] * S + c_dst).reshape(-1)
    full = jax.ops.segment_max(cand.reshape(-1), seg, num_segments=B * S).reshape(B, S)
    top_sc, top_st = lax.top_k(full, K)
    best = top_sc[:, :1]
    rank = jnp.arange(K, dtype=jnp.int32)[None]
    keep = jnp.isfinite(top_sc) & ((top_sc >= best - cfg.search_beam) | (rank < cfg.min_active))
    new_act = jnp.where(keep, top_st, -1).astype(jnp.int32)
    new_sc = jnp.where(keep, top_sc, NEG_INF)
    b_idx = jnp.broadcast_to(jnp.arange(B)[:, None], (B, K))
    slot = jnp.full((B, S + 1), -1, jnp.int32).at[b_idx, jnp.where(keep, top_st, S)].set(
        jnp.broadcast_to(rank, (B, K)))[:, :S]
    dst_slot = jnp.take_along_axis(slot, c_dst.reshape(B, -1), axis=1).reshape(c_dst.shape)
    w = jnp.where(dst_slot >= 0, w, NEG_INF)
    return new_act, new_sc, w, dst_slot, c_arc, c_lab


def _time_major(lp, dtype):
    """[B, T, C] -> [T+1, B, C] with an extra all -inf row (the final frame of full segments)."""
    B, T, C = lp.shape
    lp = jnp.moveaxis(lp.astype(dtype), 1, 0)
    return jnp.concatenate([lp, jnp.full((1, B, C), NEG_INF, dtype)], axis=0)


def pruned_tables(cfg: PrunedConfig, arcs):
    """The graph's out-arc tables for `pruned_frame_step`: (arc, dst, label, score), each [B, S, kout]."""
    B = arcs.src.shape[0]
    lay = arc_layout(arcs, valid_arcs(arcs), arcs.src, arcs.dst, cfg.S, cfg.kout, cfg.dtype)
    return tuple(x.reshape(B, cfg.S, cfg.kout) for x in (lay.arc, lay.other, lay.label, lay.score))


def final_frame_arcs(act, sc, tab, allow_partial: bool):
    """The final frame's arcs from the active slots (act/sc [N, K]): label -1 arcs (log-prob 0) into the final
    state, or, with `allow_partial` for a stream without any, every arc (graph score only, label -1, no graph
    arc).  Returns the records (W, DS, CA, CL) [N, K, kout]; every arc enters the final state's slot 0."""
    out_arc, _, out_label, out_score = tab
    a0 = jnp.maximum(act, 0)[:, :, None]
    c_arc = jnp.take_along_axis(out_arc, a0, axis=1)
    c_lab = jnp.take_along_axis(out_label, a0, axis=1)
    c_sc = jnp.take_along_axis(out_score, a0, axis=1)
    real = (act >= 0)[:, :, None] & (c_arc >= 0)
    partial = jnp.zeros(act.shape[:1], bool)
    if allow_partial:
        partial = ~jnp.any(real & (c_lab == -1), axis=(1, 2))
    p3 = partial[:, None, None]
    w = jnp.where(real & ((c_lab == -1) | p3), c_sc, NEG_INF)
    ds = jnp.where(jnp.isfinite(w), 0, -1).astype(jnp.int32)
    return w, ds, jnp.where(p3, -1, c_arc), jnp.where(p3, -1, c_lab)


@functools.partial(jax.jit, static_argnums=(0, 1))
def _pruned_core(cfg: PrunedConfig, allow_partial: bool, arcs, attrs, lp, dur):
    B = arcs.src.shape[0]
    K, dtype = cfg.K, cfg.dtype
    tab = pruned_tables(cfg, arcs)
    lpT = _time_major(lp, dtype)
    Tp1 = lpT.shape[0]
    ns = arcs.num_states
    act0 = jnp.full((B, K), -1, jnp.int32).at[:, 0].set(jnp.where(ns > 0, 0, -1))
    sc0 = jnp.full((B, K), NEG_INF, dtype).at[:, 0].set(jnp.where(ns > 0, 0.0, NEG_INF))

    def step(carry, xs):
        act, sc = carry
        t, lp_t = xs
        nact, nsc, *rec = pruned_frame_step(act, sc, lp_t, t == dur, tab, cfg)
        if allow_partial:        # the final frame's arcs, partial for a segment whose active states have no -1 arc
            fin = (t == dur)[:, None, None]
            rec = [jnp.where(fin, a, b) for a, b in zip(final_frame_arcs(act, sc, tab, True), rec)]
        return (nact, nsc), (sc, *rec)

    (_, _), (fwd, W, DS, CA, CL) = lax.scan(step, (act0, sc0), (jnp.arange(Tp1, dtype=jnp.int32), lpT))
    return pruned_lattice(cfg, (fwd, W, DS, CA, CL), dur, ns > 0, bad_segments(arcs, lp, dur), attrs)


def pruned_lattice(cfg: PrunedConfig, records, dur, nonempty, bad, attrs):
    """The lattice arrays from the search's per-frame records, pruned with ``cfg.output_beam``.

    records: (fwd [T+1, B, K] slot forward scores, W [T+1, B, K, kout] arc scores, DS dest slots (-1: none),
    CA graph arc indices (-1: none, attributes get the filler 0), CL labels), frame-major; frame ``dur[b]`` is
    segment b's final frame.  nonempty / bad [B] bool (bad: all arcs score NaN); attrs: name -> [B, A, ...] or Ragged.
    Returns ((src, dst, label, score) [B, (T+1)*K*kout], attrs, frame index, num_states, num_arcs).
    """
    fwd, W, DS, CA, CL = records
    Tp1, B, K, Ko = W.shape
    dtype = fwd.dtype
    # best (Viterbi) total: slot 0 after the segment's final frame
    t_idx = jnp.arange(Tp1, dtype=jnp.int32)
    best = jnp.max(jnp.where((t_idx[:, None] == dur[None])[:, :, None, None], fwd[:, :, :, None] + W
                             + jnp.where(DS >= 0, 0.0, NEG_INF), NEG_INF), axis=(0, 2, 3))

    # Viterbi backward over the recorded lattice
    e0 = jnp.where(jnp.arange(K)[None] == 0, 0.0, NEG_INF).astype(dtype)

    def bstep(beta, xs):
        t, w, ds = xs
        beta_next = jnp.where((t == dur)[:, None], e0, beta)
        nb = jnp.take_along_axis(beta_next, jnp.maximum(ds, 0).reshape(B, -1), axis=1).reshape(ds.shape)
        vals = w + jnp.where(ds >= 0, nb, NEG_INF)
        return jnp.max(vals, axis=-1), nb

    _, BN = lax.scan(bstep, jnp.full((B, K), NEG_INF, dtype), (t_idx, W, DS), reverse=True)
    keep = (fwd[..., None] + W + BN) > (best - cfg.output_beam)[None, :, None, None]
    keep &= jnp.isfinite(W)

    # lattice arrays, frame-major [T+1, B, K, Ko] -> [B, (T+1)*K*Ko]
    t4 = t_idx[:, None, None, None]
    d4 = dur[None, :, None, None]
    k4 = jnp.arange(K, dtype=jnp.int32)[None, None, :, None]
    is_final = t4 == d4
    final_id = (d4 + 1) * K
    src = t4 * K + k4
    dst = jnp.where(keep, jnp.where(is_final, final_id, (t4 + 1) * K + DS),
                    jnp.where(is_final, final_id, (t4 + 1) * K + k4))
    label = jnp.where(keep, CL, jnp.where(is_final, -1, 0))
    score = jnp.where(keep, W, NEG_INF)
    # a segment with a NaN / +inf log-prob in a valid frame or graph score: all its arcs score NaN
    # (the search's comparisons would otherwise drop or keep them silently)
    score = jnp.where(bad[None, :, None, None], jnp.nan, score)
    in_range = t4 <= d4

    def flat(x, fill):
        x = jnp.broadcast_to(x, (Tp1, B, K, Ko) + x.shape[4:])
        x = jnp.where(in_range.reshape(in_range.shape + (1,) * (x.ndim - 4)), x, jnp.asarray(fill, x.dtype))
        x = jnp.moveaxis(x, 1, 0)
        return x.reshape((B, Tp1 * K * Ko) + x.shape[4:])

    ca = jnp.maximum(CA, 0)
    b4 = jnp.arange(B)[None, :, None, None]

    def gather(v):                       # [B, A, ...] -> [B, (T+1)*K*Ko, ...], 0 on slots without a graph arc
        g = v[b4, ca]
        return flat(jnp.where((CA >= 0).reshape(CA.shape + (1,) * (g.ndim - 4)), g, jnp.zeros((), g.dtype)), 0)
    out_attrs = {name: jax.tree_util.tree_map(gather, v) for name, v in attrs.items()}   # Ragged: empty rows
    frame = flat(jnp.broadcast_to(t4, (Tp1, B, K, Ko)), 0)
    lat = (flat(src, 0).astype(jnp.int32), flat(dst, 0).astype(jnp.int32), flat(label, 0).astype(jnp.int32),
           flat(score, NEG_INF).astype(jnp.float32))
    num_states = jnp.where(nonempty, (dur + 1) * K + 1, 0).astype(jnp.int32)
    num_arcs = ((dur + 1) * K * Ko).astype(jnp.int32)
    return lat, out_attrs, frame, num_states, num_arcs


def check_search_args(search_beam, output_beam, min_active_states, max_active_states, allow_partial) -> None:
    """The beams and active-state bounds of a pruned search (ValueError / TypeError naming the bad one)."""
    if not search_beam > 0 or not output_beam > 0:
        raise ValueError(f"search_beam and output_beam must be > 0, got {search_beam}, {output_beam}")
    if max_active_states < 1 or min_active_states < 0 or min_active_states > max_active_states:
        raise ValueError(f"need 0 <= min_active_states <= max_active_states and max_active_states >= 1, "
                         f"got {min_active_states}, {max_active_states}")
    if not isinstance(allow_partial, (bool, np.bool_)):
        raise TypeError(f"allow_partial: expected a bool, got {type(allow_partial).__name__}")


def intersect_dense_pruned(a_fsas, b_fsas: DenseFsaVec, search_beam: float, output_beam: float,
                           min_active_states: int, max_active_states: int,
                           seqframe_idx_name: Optional[str] = None,
                           frame_idx_name: Optional[str] = None, allow_partial: bool = False) -> Fsa:
    """Pruned intersection for decoding (k2's ``intersect_dense_pruned``); see the module doc.

    ``a_fsas``: one graph shared by all segments, or one per segment.  ``search_beam`` prunes the
    active states on each frame relative to that frame's best; ``max_active_states`` is the fixed
    size of the active set; ``min_active_states`` keeps at least that many (reachable) states
    whatever the beam.  ``output_beam`` prunes the returned lattice relative to its best path.
    ``allow_partial`` (as k2): a segment none of whose active states on its last frame has a ``-1``
    arc gets every arc leaving them redirected into the final state (graph score only, label ``-1``,
    attributes 0) instead of no path.
    """
    check_search_args(search_beam, output_beam, min_active_states, max_active_states, allow_partial)
    cfg0, arcs, lp, dur = prepare_dense(a_fsas, b_fsas, None, math.inf, True, sparse_tables_as_segments=False,
                                        warn=False)
    if cfg0.kout is None:
        raise ValueError("intersect_dense_pruned: a_fsas must be concrete (the out-degree table is built "
                         "on the host); call it outside jit or close over the graph")
    S = cfg0.S
    K = min(int(max_active_states), S)
    cfg = PrunedConfig(S, cfg0.kout, K, float(search_beam), float(output_beam),
                min(int(min_active_states), K), cfg0.dtype)
    B = arcs.src.shape[0]
    a_batch = jnp.ndim(a_fsas.src) == 2
    attrs = broadcast_attrs(a_fsas.attrs, a_batch, B)
    (src, dst, label, score), out_attrs, frame, ns, na = _pruned_core(cfg, bool(allow_partial), arcs, attrs, lp, dur)
    if frame_idx_name is not None:
        out_attrs[frame_idx_name] = frame
    if seqframe_idx_name is not None:
        offs = jnp.concatenate([jnp.zeros(1, jnp.int32), jnp.cumsum(b_fsas.duration + 1)[:-1]])
        out_attrs[seqframe_idx_name] = (offs[:, None] + frame).astype(jnp.int32)
    T = lp.shape[1]
    return Fsa(src, dst, label, score, ns, na, out_attrs, max_states=(T + 1) * K + 1)
