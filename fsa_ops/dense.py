"""k2's DenseFsaVec and intersect_dense: scoring decoding graphs against network outputs.

Semantics (k2's ``intersect_dense``): for supervision segment ``b`` with ``D_b`` frames, a lattice
path is a path through the graph that takes exactly one arc with label ``>= 0`` per frame (label 0
is the CTC blank here, not epsilon: it consumes a frame too), then the arc with label ``-1`` into
the graph's final state, which consumes the extra frame ``D_b`` that k2 appends to every segment
(log-prob 0 for label -1, ``-inf`` for the others).  An arc taken on frame ``t`` scores
``graph_score + log_probs[t, label]``.  Lattice states are (frame, graph state) pairs.

``dense_tot_scores`` (used by ``ctc_loss``) computes the log-semiring total without materialising
the lattice: a loop over frames whose per-frame work is vectorised over (segments, arcs) --
``alpha_{t+1}[d] = (+) over arcs into d of alpha_t[src] + w_t(arc)``.  The log-probs stay
batch-major ``[B, T, C]``.  The graph's structure, inspected on the host, picks one of three
layouts, each in a module of its own (same results):

- `fsa_ops.dense_arcs`: any graph; per-arc frame weights, arcs in degree tables or segments;
- `fsa_ops.dense_labelled`: state-labelled graphs (every arc into a state carries one label: CTC
  graphs and topologies); per-state emissions gathered once, gradients from state occupancies;
- `fsa_ops.dense_band`: state-labelled graphs with at most four ``dst - src`` offsets and no
  parallel arcs (CTC graphs); steps are shifted state vectors, forward and backward in one loop.

The loops over frames and the gradients are in `fsa_ops.dense_loops`; ``implementation='pallas'``
(the default on GPU) runs each loop as one Pallas kernel launch over slot tables built from any of
these layouts (`fsa_ops.pallas_dense`), with the same numbers.  The total score has an
analytic ``custom_vjp`` (here): the backward pass takes per-frame normalised arc posteriors or
state occupancies (every path takes exactly one arc per frame, so they sum to 1 over a frame): no
division by the total score, whose float32 rounding (~1e-3 nats at a few thousand nats) would
otherwise enter every gradient.  Memory: the forward scores ``[B, T+1, S]``; nothing of size
frames x arcs is kept.

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

Non-finite inputs: a segment with a NaN or +inf log-prob anywhere in a valid frame (any symbol,
used by its graph or not) or a NaN or +inf score on a real arc of its graph has a NaN total score
(NaN gradient on its valid frames and real arcs, or 0 where its cotangent is 0: a segment masked
out of the loss with ``jnp.where(jnp.isnan(tot), 0, tot)``) and, from ``intersect_dense``, a
lattice whose real arcs all score NaN -- never a finite value computed around the bad entry (the
check is one reduction over the log-probs, ~1 ms at [16, 500, 500] on CPU); frames past a
segment's duration are ignored, and ``-inf`` log-probs (probability 0) are legitimate.  A segment
that no path fits has total ``-inf`` (zero gradient).
"""
from __future__ import annotations

import functools
import math
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax, tree_util

from fsa_ops.dense_band import band_offsets
from fsa_ops.dense_labelled import is_state_labelled, label_gather_plan
from fsa_ops.dense_loops import (DenseConfig, arcs_tot_grads, band_fused_loop, dense_graph, forward_loop,
                                 labelled_tot_grads, loop_input, prune_info)
from fsa_ops.fsa import Fsa
from fsa_ops.pallas_dense import pallas_available, resolve_implementation, slot_sizes
from fsa_ops.scores import (NEG_INF, bad_fsas, fsa_arrays, is_traced, max_degree, nonfinite_sum, score_dtype,
                            valid_arcs)

__all__ = ["DenseFsaVec", "intersect_dense", "dense_tot_scores", "bad_segments", "broadcast_attrs"]


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
# total score with analytic VJP
# --------------------------------------------------------------------------------------------


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _dense_tot(cfg: DenseConfig, arcs, lp, dur, plan=None):
    return _dense_tot_fwd(cfg, arcs, lp, dur, plan)[0]


def bad_segments(arcs, lp, dur):
    """[B] bool: segments with a NaN or +inf log-prob in a valid frame (any symbol) or a NaN or
    +inf score on a real arc of their graph (one reduction over the log-probs)."""
    frame_valid = jnp.arange(lp.shape[1])[None, :] < dur[:, None]
    frames = nonfinite_sum(jnp.where(frame_valid[:, :, None], lp, 0.0), axis=2)
    return jnp.any(frames, axis=1) | bad_fsas(arcs)


def _nan_gradient(grad, tot, g, valid):
    """grad where the segment's total is finite or infinite; where it is NaN, NaN on `valid`
    (broadcast to grad) when the cotangent g [B] is nonzero and 0 when it is 0 (a segment masked
    out of the loss: whatever the loops made of its NaNs must not reach the gradient)."""
    if grad is None:
        return None

    def rows(x):
        return x.reshape(x.shape + (1,) * (grad.ndim - 1))
    return jnp.where(rows(jnp.isnan(tot)) & valid, rows(jnp.where(g != 0, jnp.nan, 0.0)).astype(grad.dtype), grad)


def _dense_tot_fwd(cfg: DenseConfig, arcs, lp, dur, plan=None):
    tot, res = _dense_tot_finite_fwd(cfg, arcs, lp, dur, plan)
    tot = jnp.where(bad_segments(arcs, lp, dur), jnp.nan, tot)
    return tot, res[:5] + (tot,) + res[6:]       # (res[5] is the total)


def _dense_tot_finite_fwd(cfg: DenseConfig, arcs, lp, dur, plan=None):
    G = dense_graph(cfg, arcs)
    x = loop_input(cfg, arcs, lp.astype(cfg.dtype), dur)
    e = x if cfg.labelled else None          # the labelled backward reads the emissions again
    if cfg.band is not None:       # forward and backward in one loop, Viterbi pass too
        prune = None
        if math.isfinite(cfg.beam):
            best, amax, bmax_next = band_fused_loop(cfg, G, x, dur, log_semiring=False, true_values=True)
            prune = (amax, bmax_next, lax.stop_gradient(best - jnp.asarray(cfg.beam, cfg.dtype)))
        tot, alphas, bnext = band_fused_loop(cfg, G, x, dur, prune=prune)
        return tot, (arcs, lp, dur, e, (alphas, bnext), tot, prune, plan)
    prune = prune_info(cfg, G, x, dur)
    tot, alphas = forward_loop(cfg, G, x, dur, True, prune)
    return tot, (arcs, lp, dur, e, (alphas,), tot, prune, plan)


def _dense_tot_bwd(cfg: DenseConfig, res, g):
    arcs, lp, dur, e, tables, tot, prune, plan = res
    if cfg.labelled:
        glp, gscore = labelled_tot_grads(cfg, arcs, lp, dur, e, tables, tot, prune, g, plan)
    else:
        glp, gscore = arcs_tot_grads(cfg, arcs, lp, dur, tables, tot, prune, g)
    # segments whose total is NaN (`bad_segments`) get NaN on their valid frames and real arcs,
    # or 0 where their cotangent is 0 (masked out of the loss)
    glp = _nan_gradient(glp, tot, g, (jnp.arange(lp.shape[1])[None, :] < dur[:, None])[:, :, None])
    gscore = _nan_gradient(gscore, tot, g, valid_arcs(arcs))
    z = jax.tree.map(lambda x: None, arcs._replace(score=None))
    return z._replace(score=gscore), glp, None, jax.tree.map(lambda x: None, plan)


_dense_tot.defvjp(_dense_tot_fwd, _dense_tot_bwd)


@functools.partial(jax.jit, static_argnums=(0,))
def _dense_tot_jit(cfg, arcs, lp, dur, plan=None):
    return _dense_tot(cfg, arcs, lp, dur, plan)


# --------------------------------------------------------------------------------------------
# public entry points
# --------------------------------------------------------------------------------------------


# a direction takes the table layout only while S * K <= this many times the number of arcs
TABLE_PADDING = 4


def _check_dense(b_fsas):
    if not isinstance(b_fsas, DenseFsaVec):
        raise TypeError(f"b_fsas: expected a DenseFsaVec, got {type(b_fsas).__name__}")


def prepare_dense(a_fsas, b_fsas, a_to_b_map, output_beam, use_double_scores, name="a_fsas",
                  sparse_tables_as_segments: bool = True, warn: bool = True):
    """Checks the inputs of the dense ops; returns (cfg, arcs, lp, dur): the `DenseConfig`, the
    graph arcs batched to one graph per segment, and the segments' log-probs [B, T, C] and
    durations [B].

    cfg.kin / cfg.kout: the in/out degree for the table layout, None for the segment layout
    (traced structure, or -- unless `sparse_tables_as_segments` is False -- a table that would be
    mostly padding, see `TABLE_PADDING`); cfg.labelled / cfg.band are left for the caller."""
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
        kin, kout = (k if S * k <= TABLE_PADDING * max(A, 1) or not sparse_tables_as_segments else None
                     for k in (max_degree(arcs.dst, valid, S, A), max_degree(arcs.src, valid, S, A)))
    cfg = DenseConfig(S, kin, kout, output_beam, score_dtype(use_double_scores, warn=warn))
    return cfg, arcs, lp, dur


def dense_tot_scores(a_fsas, b_fsas: DenseFsaVec, output_beam: float = math.inf,
                     use_double_scores: bool = True, a_to_b_map=None, implementation: str = "auto"):
    """Log-semiring total score of ``intersect_dense(a_fsas, b_fsas, output_beam)`` per segment,
    computed frame-synchronously without building the lattice.

    Differentiable w.r.t. ``b_fsas.scores`` (hence the log-probs given to DenseFsaVec) and
    ``a_fsas.score`` with an analytic backward pass.  ``-inf`` (gradient 0) where no path fits;
    NaN (NaN gradient) for a segment with a NaN or +inf log-prob in a valid frame or graph score
    (see the module docstring).  ``use_double_scores``: accumulate in float64 when
    ``jax_enable_x64`` is on; float32 otherwise, with a warning the first time
    (`fsa_ops.scores.Float32ScoresWarning`; ``jax.config.update("jax_enable_x64", True)`` turns
    x64 on, ``use_double_scores=False`` asks for float32 without the warning).

    ``implementation``: ``'xla'`` (the loops of `fsa_ops.dense_loops`), ``'pallas'`` (the frame loops as one
    kernel launch each, `fsa_ops.pallas_dense`; in interpret mode on a backend other than GPU, for tests; needs
    the graph structure on the host, not traced) or ``'auto'`` (Pallas on GPU when the structure is on the host,
    XLA otherwise).  Both give the same numbers (float rounding) and gradients.
    """
    impl = resolve_implementation(implementation)
    cfg, arcs, lp, dur = prepare_dense(a_fsas, b_fsas, a_to_b_map, output_beam, use_double_scores)
    labelled = is_state_labelled(arcs, cfg.S)
    cfg = cfg._replace(labelled=labelled, band=band_offsets(arcs, cfg.S) if labelled else None)
    sizes = slot_sizes(arcs, cfg.S) if impl == "pallas" else None
    if impl == "pallas" and sizes is None:
        if implementation == "pallas":
            raise ValueError("implementation='pallas' needs the graph structure (src, dst, num_arcs, num_states) "
                             "on the host: close over the graphs instead of passing them as jit arguments, or "
                             "use implementation='xla'")
    elif sizes is not None:    # the Pallas kernels run every layout from slot tables (no fused band loop)
        cfg = cfg._replace(band=None, slots=sizes, interpret=not pallas_available())
    plan = label_gather_plan(arcs, cfg.S, lp.shape[2]) if labelled else None
    return _dense_tot_jit(cfg, arcs, lp, dur, plan)


def broadcast_attrs(attrs, is_batch: bool, B: int):
    """A graph's per-arc attributes (arrays or Ragged) as jnp [B, A, ...]: one graph's broadcast to B."""
    def one(x):
        x = jnp.asarray(x) if is_batch else jnp.asarray(x)[None]
        return x if x.shape[0] == B else jnp.broadcast_to(x, (B,) + x.shape[1:])
    return {k: tree_util.tree_map(one, v) for k, v in attrs.items()}


@functools.partial(jax.jit, static_argnums=(0,))
def _lattice_core(cfg: DenseConfig, arcs, attrs, lp, dur):
    B, A = arcs.src.shape
    S = cfg.S
    dtype = cfg.dtype
    T = lp.shape[1]
    lp = lp.astype(dtype)
    G = dense_graph(cfg, arcs)
    prune = prune_info(cfg, G, lp, dur)
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
    # a segment with a NaN / +inf log-prob or graph score: every arc of its lattice scores NaN
    w = jnp.where(real_arc & bad_segments(arcs, lp, dur)[:, None, None], jnp.nan, w)
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
    out_attrs = {k: tree_util.tree_map(lambda x: flat(x[:, None], 0), v) for k, v in attrs.items()}  # Ragged too
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
    cfg, arcs, lp, dur = prepare_dense(a_fsas, b_fsas, a_to_b_map, output_beam, True, warn=False)
    B, A = arcs.src.shape
    T = lp.shape[1]
    Sl = (T + 1) * cfg.S + 1
    if Sl > max_states or (T + 1) * A > max_arcs:
        raise ValueError(f"intersect_dense: lattice of {Sl} states / {(T + 1) * A} arcs per sequence "
                         f"exceeds max_states={max_states} / max_arcs={max_arcs}")
    attrs = broadcast_attrs(a_fsas.attrs, jnp.ndim(a_fsas.src) == 2, B)
    out, out_attrs, frame, ns, na = _lattice_core(cfg, arcs, attrs, lp, dur)
    if frame_idx_name is not None:
        out_attrs[frame_idx_name] = frame
    if seqframe_idx_name is not None:
        offs = jnp.concatenate([jnp.zeros(1, jnp.int32), jnp.cumsum(b_fsas.duration + 1)[:-1]])
        seg_idx = jnp.arange(B) if a_to_b_map is None else jnp.asarray(a_to_b_map, jnp.int32)
        out_attrs[seqframe_idx_name] = (offs[seg_idx][:, None] + frame).astype(jnp.int32)
    return Fsa(out["src"], out["dst"], out["label"], out["score"].astype(jnp.float32), ns, na,
               out_attrs, max_states=Sl)
