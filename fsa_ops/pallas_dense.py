"""Pallas kernels for the frame loops of ``dense_tot_scores``: forward or backward scores of a batch of graphs
against dense log-probs, all frames in ONE kernel launch.

One program per batch row (grid ``(B,)``) runs ``lax.fori_loop`` over the frames; the row's state vector, running
offset and total are the loop's carry (registers), so nothing but the score table rows leaves the program.  A step
reads the row's arcs as slot tables ``[S, K]`` grouped by the state they reduce into (by destination for the forward
scores, by source for the backward scores: CTC/band graphs, state-labelled graphs and general graphs all become such
tables, `slot_tables`) and gathers the other end's scores from a two-slot row buffer that the program writes once per
frame behind a barrier (Pallas' Triton backend gathers through memory, not registers: the buffer is a few KiB per
row and stays in L1/L2).  Two weight modes:

- ``'state'`` (state-labelled graphs): ``x`` is the state emissions ``e [B, T+1, S]`` and an arc into ``d`` weighs
  ``score + e_t[d]``;
- ``'arc'`` (any graph): ``x`` is the log-probs ``[B, T, C]`` and an arc weighs ``score + w_t(label)`` with
  ``w_t(l) = lp[t, l]`` for ``l >= 0`` and ``t < dur``, ``0`` for ``l == -1`` and ``t == dur``, ``-inf`` otherwise.

Forward: ``alpha_{t+1}[d] = (+)_{arcs s -> d} (alpha_t[s] + w_t(arc))``; arcs into the final state are a separate
slot list (``fin``), so that a final state entered from every state (denominator graphs) does not widen the table.
Backward: ``beta_t[s] = (+)_{arcs s -> d} (w_t(arc) + beta_{t+1}[d])``.  Semirings: log (log-sum-exp) or tropical
(max), ``-inf`` = no path, accumulation in the dtype of the scores (float32, or float64 with x64).  Each frame's row
is shifted to max 0 and the offsets summed separately (as `fsa_ops.dense_loops`), so the tables carry the same
conventions as the XLA loops: ``table [B, T+1, S]`` holds ``alpha_t`` (forward) or ``beta_{t+1}`` (backward, with
``beta_{dur+1}`` the final vector) for ``t = 0..T``, each row shifted, or with ``true_values`` the scores themselves.
``prune`` applies ``output_beam``'s masks (Viterbi tables ``amax``, ``bmax_next`` [B, T+1, S] and ``cut`` [B]).

On GPU the kernels lower through Pallas' Triton backend (loaded tensors are powers of two: tables are padded),
chosen by passing its ``CompilerParams`` explicitly (JAX 0.11 documents Mosaic GPU as Pallas' GPU default and keeps
Triton, deprecated, behind that choice); ``interpret=True`` runs the same kernels on any backend (CPU tests).
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pl_triton   # the GPU (Triton) backend's barrier and parameters

from fsa_ops.scores import NEG_INF, arc_table, is_traced, valid_arcs

__all__ = ["SlotTables", "pallas_frame_scores", "next_pow2", "pallas_available", "IMPLEMENTATIONS",
           "resolve_implementation", "slot_sizes", "slot_tables", "pad_states"]

IMPLEMENTATIONS = ("auto", "pallas", "xla")


def next_pow2(n: int) -> int:
    """Smallest power of two >= max(n, 1)."""
    return 1 << (max(int(n), 1) - 1).bit_length()


def pallas_available() -> bool:
    """Whether the default backend is a GPU (where the Pallas kernels compile)."""
    return jax.default_backend() == "gpu"


def resolve_implementation(implementation: str) -> str:
    """'auto' | 'pallas' | 'xla' -> 'pallas' or 'xla' ('auto': Pallas on GPU, XLA elsewhere)."""
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"implementation must be one of {IMPLEMENTATIONS}, got {implementation!r}")
    if implementation == "auto":
        return "pallas" if pallas_available() else "xla"
    return implementation


class SlotTables(NamedTuple):
    """A batch of graphs as per-state slot tables for one direction (padded: S, K, F powers of two).

    other int32 [B, S, K]: the state at the other end of each slot's arc; score float [B, S, K] (-inf: empty slot);
    label int32 [B, S, K] (read in 'arc' mode); fin_other / fin_score / fin_label [B, F]: the arcs into the final
    state (forward direction only; F = 1 with an empty slot for the backward direction)."""
    other: jax.Array
    score: jax.Array
    label: jax.Array
    fin_other: jax.Array
    fin_score: jax.Array
    fin_label: jax.Array


def _reduce(v, axis, log_semiring):
    """(+) over `axis`: log-sum-exp or max; -inf where every term is -inf."""
    m = jnp.max(v, axis=axis)
    if not log_semiring:
        return m
    m0 = jnp.where(m > NEG_INF, m, 0.0)
    s = jnp.sum(jnp.exp(v - jnp.expand_dims(m0, axis)), axis=axis)
    return jnp.where(s > 0, jnp.log(jnp.where(s > 0, s, 1.0)) + m0, NEG_INF)


# the most slots (states x degree) one gather-reduce step holds at once: a step runs over blocks of states
SLOT_BLOCK = 1024


def _kernel(dur_ref, ns_ref, other_ref, score_ref, label_ref, fo_ref, fs_ref, fl_ref, x_ref, amax_ref, bmax_ref,
            cut_ref, tot_ref, table_ref, buf_ref, *, T, C, forward, log_semiring, state_mode, prune, true_values,
            barrier, slot_block):
    b = pl.program_id(0)
    dur = dur_ref[b]
    ns = ns_ref[b]
    final = jnp.maximum(ns - 1, 0)
    S, K = other_ref.shape[1], other_ref.shape[2]
    SB = max(1, min(S, slot_block // K))            # states per block (powers of two: SB divides S)
    iota = lax.broadcasted_iota(jnp.int32, (S,), 0)
    dtype = table_ref.dtype
    ninf = jnp.asarray(NEG_INF, dtype)
    zero = jnp.asarray(0.0, dtype)

    def sync():
        if barrier:
            pl_triton.debug_barrier()

    def arc_weight(label, t):
        """w_t(label) for 'arc' mode (frame min(t, T-1) of the log-probs)."""
        lpl = x_ref[b, jnp.minimum(t, T - 1), jnp.clip(label, 0, C - 1)]
        return jnp.where(label >= 0, jnp.where(t < dur, lpl, ninf), jnp.where((label == -1) & (t == dur), zero, ninf))

    def gather_reduce(src, t):
        """(+)_k over each state's slots of buf[src][other] + w (pruned) -> buf slot 1 (all states, block by block);
        returns the vector read back."""
        buf_ref[b, 0, :] = src
        sync()

        def block(c, _):
            rows = pl.ds(c * SB, SB)
            other = other_ref[b, rows, :]
            w = score_ref[b, rows, :]
            if not state_mode:
                w = w + arc_weight(label_ref[b, rows, :], t)
            v = buf_ref[b, 0, other] + w
            if prune:
                if forward:      # slot arc: other -> row state, entered on frame t
                    after = bmax_ref[b, t, rows] + x_ref[b, t, rows] if state_mode else bmax_ref[b, t, rows]
                    fb = amax_ref[b, t, other] + w + after[:, None]
                else:            # slot arc: row state -> other
                    after = bmax_ref[b, t, other] + x_ref[b, t, other] if state_mode else bmax_ref[b, t, other]
                    fb = amax_ref[b, t, rows][:, None] + w + after
                v = jnp.where(fb > cut_ref[b], v, ninf)
            buf_ref[b, 1, rows] = _reduce(v, 1, log_semiring)
            return 0

        lax.fori_loop(0, S // SB, block, 0)
        sync()
        return buf_ref[b, 1, :]

    def shift(new):
        m = jnp.max(new)
        off = jnp.where(m > NEG_INF, m, 0.0).astype(dtype)
        return new - off, off

    if forward:
        def body(t, carry):
            alpha, cum, tot = carry
            table_ref[b, t, :] = alpha + cum if true_values else alpha
            new = gather_reduce(alpha, t)
            # arcs into the final state: their own slot list (buf slot 0 still holds alpha)
            fo = fo_ref[b]
            wf = fs_ref[b]
            if not state_mode:
                wf = wf + arc_weight(fl_ref[b], t)
            vf = buf_ref[b, 0, fo] + wf
            if prune:
                after = bmax_ref[b, t, :] + x_ref[b, t, :] if state_mode else bmax_ref[b, t, :]
                after_fin = jnp.max(jnp.where(iota == final, after, ninf))
                vf = jnp.where(amax_ref[b, t, fo] + wf + after_fin > cut_ref[b], vf, ninf)
            new = jnp.where(iota == final, _reduce(vf, 0, log_semiring), new)
            if state_mode:
                new = new + x_ref[b, t, :]
            fin = jnp.max(jnp.where(iota == final, new, ninf))
            tot = jnp.where((t == dur) & (ns > 0), cum + fin, tot)
            new, off = shift(new)
            sync()                      # every read of buf slot 0 is done before the next frame writes it
            return new, cum + off, tot

        start = jnp.where((iota == 0) & (ns > 0), 0.0, NEG_INF).astype(dtype)
        _, _, tot = lax.fori_loop(0, T + 1, body, (start, zero, ninf))
        tot_ref[b] = tot
    else:
        fvec = jnp.where(iota == ns - 1, 0.0, NEG_INF).astype(dtype)

        def body(i, carry):
            beta, cum = carry
            t = T - i
            at_end = t == dur
            beta_next = jnp.where(at_end, fvec, beta)
            cum = jnp.where(at_end, zero, cum)
            table_ref[b, t, :] = beta_next + cum if true_values else beta_next
            src = x_ref[b, t, :] + beta_next if state_mode else beta_next
            new, off = shift(gather_reduce(src, t))
            return new, cum + off

        lax.fori_loop(0, T + 1, body, (jnp.full((S,), NEG_INF, dtype), zero))
        tot_ref[b] = zero


@functools.partial(jax.jit, static_argnames=("num_frames", "forward", "log_semiring", "state_mode", "true_values",
                                             "interpret", "slot_block"))
def pallas_frame_scores(tables: SlotTables, x, dur, num_states, prune=None, *, num_frames: int, forward: bool,
                        log_semiring: bool, state_mode: bool, true_values: bool = False, interpret: bool = False,
                        slot_block: int = SLOT_BLOCK):
    """Forward or backward scores of every frame in one Pallas launch (see the module docstring).

    tables: `SlotTables` (states padded to a power of two Sp); x: state emissions [B, T+1, Sp] ('state' mode) or
    log-probs [B, T, C] ('arc' mode); dur, num_states int32 [B]; prune: None or (amax, bmax_next [B, T+1, Sp], cut
    [B]); slot_block: the most slots a step reduces at once (a power of two; blocks of states loop).  Returns
    (tot [B] -- the forward total, 0 for the backward direction --, table [B, T+1, Sp])."""
    B, Sp, _ = tables.other.shape
    T = int(num_frames)
    dtype = tables.score.dtype
    C = x.shape[2]
    if prune is None:
        amax = bmax = jnp.zeros((B, 1, Sp), dtype)
        cut = jnp.zeros((B,), dtype)
    else:
        amax, bmax, cut = (jnp.asarray(p, dtype) for p in prune)
    kernel = functools.partial(_kernel, T=T, C=C, forward=forward, log_semiring=log_semiring, state_mode=state_mode,
                               prune=prune is not None, true_values=true_values, barrier=not interpret,
                               slot_block=next_pow2(slot_block))
    params = {}
    if not interpret:
        params["compiler_params"] = pl_triton.CompilerParams(num_warps=4, num_stages=1)
    tot, table, _ = pl.pallas_call(
        kernel,
        out_shape=(jax.ShapeDtypeStruct((B,), dtype), jax.ShapeDtypeStruct((B, T + 1, Sp), dtype),
                   jax.ShapeDtypeStruct((B, 2, Sp), dtype)),
        grid=(B,),
        interpret=interpret,
        name="dense_forward" if forward else "dense_backward",
        **params,
    )(jnp.asarray(dur, jnp.int32), jnp.asarray(num_states, jnp.int32), tables.other, tables.score, tables.label,
      tables.fin_other, tables.fin_score, tables.fin_label, x.astype(dtype), amax, bmax, cut)
    return tot, table


def slot_sizes(arcs, S: int):
    """Host-side: (Sp, Kin, Kout, F, block), the padded sizes of a batch's slot tables -- states, the largest
    in-degree over arcs not into the final state, the largest out-degree, the most arcs into the final state (each a
    power of two) -- and the kernels' `SLOT_BLOCK`.  None when the structure is traced (the Pallas path needs it on
    the host)."""
    if is_traced(arcs.src, arcs.dst, arcs.num_arcs, arcs.num_states):
        return None
    src, dst = np.asarray(arcs.src), np.asarray(arcs.dst)
    valid = np.asarray(valid_arcs(arcs))
    B = src.shape[0]
    into_final = dst == (np.asarray(arcs.num_states)[:, None] - 1)
    rows = np.broadcast_to(np.arange(B)[:, None], src.shape).astype(np.int64)

    def degree(key, keep):
        if not keep.any():
            return 1
        return int(np.bincount(rows[keep] * (S + 1) + np.clip(key[keep], 0, S)).max())

    fin = int(np.bincount(rows[valid & into_final], minlength=1).max(initial=0))
    return (next_pow2(S), next_pow2(degree(dst, valid & ~into_final)), next_pow2(degree(src, valid)),
            next_pow2(fin), SLOT_BLOCK)


def _gather(table, values, fill):
    B = table.shape[0]
    flat = table.reshape(B, -1)
    g = jnp.take_along_axis(values, jnp.maximum(flat, 0), axis=1)
    return jnp.where(flat >= 0, g, jnp.asarray(fill, values.dtype)).reshape(table.shape)


def slot_tables(arcs, sizes, dtype):
    """(forward, backward) `SlotTables` of a batch of graphs (jnp; `sizes` from `slot_sizes`).  Forward slots are
    grouped by destination without the arcs into the final state, which form the final slot list; backward slots
    are grouped by source."""
    Sp, Kin, Kout, F = sizes[:4]
    B = arcs.src.shape[0]
    valid = jnp.asarray(valid_arcs(arcs))
    src, dst = jnp.asarray(arcs.src, jnp.int32), jnp.asarray(arcs.dst, jnp.int32)
    label = jnp.asarray(arcs.label, jnp.int32)
    score = jnp.where(valid, jnp.asarray(arcs.score).astype(dtype), NEG_INF)
    into_final = dst == (jnp.asarray(arcs.num_states, jnp.int32)[:, None] - 1)

    def build(key, other, keep, groups, K):
        tab = arc_table(key, keep, groups, K)
        return (_gather(tab, jnp.clip(other, 0, Sp - 1), 0), _gather(tab, score, NEG_INF), _gather(tab, label, 0))

    fwd = build(dst, src, valid & ~into_final, Sp, Kin)
    fin = build(jnp.zeros_like(dst), src, valid & into_final, 1, F)
    bwd = build(src, dst, valid, Sp, Kout)
    empty = (jnp.zeros((B, 1), jnp.int32), jnp.full((B, 1), NEG_INF, dtype), jnp.zeros((B, 1), jnp.int32))
    return (SlotTables(*fwd, *(f[:, 0] for f in fin)), SlotTables(*bwd, *empty))


def pad_states(x, Sp: int, fill=NEG_INF):
    """[B, T, S] -> [B, T, Sp] padded with `fill`."""
    S = x.shape[-1]
    if S == Sp:
        return x
    return jnp.concatenate([x, jnp.full(x.shape[:-1] + (Sp - S,), fill, x.dtype)], axis=-1)
