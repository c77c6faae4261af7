"""Plans of jasr.ctc_beam's search: which frames it scans, in how many steps, and the top-k it ranks with.

Blank frames (token_min_logp: no candidate token and the blank the frame's best) are folded into the next scanned
column instead of being scanned. `fold_plan` builds, on device and under jit, each row's columns (its frames with
candidates, gathered to the front) and the blank log-probs folded before each column; its scan length is a traced
number (the most columns of a row), so a batch costs the steps its fullest row needs and no retracing happens per
batch. `compaction` / `chunk_schedule` plan the same on the host, for searches that split frames with many
candidates into several steps (a schedule fixed before tracing).

`top_rows` is an exact top-k over the last axis (ties: lower index first, as jax.lax.top_k) by ranks: on XLA:CPU
it is several times faster than lax.top_k (a sort per row) on short rows (the tokens of a frame, the n-best).
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["FoldPlan", "frame_counts", "first_argmax", "top_rows", "fold_plan", "compaction", "host_fold_plan",
           "chunk_schedule",
           "pow2", "TOP_ROWS_MAX_N"]

TOP_ROWS_MAX_N = 64   # top_rows on longer rows: lax.top_k


class FoldPlan(NamedTuple):
    """Columns of a search over [B, T] frames. orig_t [B, Tc] int32: the frame of each column (padding columns:
    T - 1); cpad [B, Tc] float32: 1.0 = padding column (leaves the beam unchanged); gap [B, Tc + 1] float32: the
    summed blank log-probs of the blank frames folded in before each column (column Tc: after a row's last); has
    [B, Tc + 1] bool: some blank frame is folded there; steps: int32 scalar, the columns to scan (<= Tc)."""
    orig_t: jax.Array
    cpad: jax.Array
    gap: jax.Array
    has: jax.Array
    steps: jax.Array


def first_argmax(x: jax.Array) -> jax.Array:
    """argmax over the last axis (first index of the max, as jnp.argmax) as two plain reductions (XLA:CPU runs
    jnp.argmax's variadic reduction far slower)."""
    n = x.shape[-1]
    return jnp.min(jnp.where(x == x.max(-1, keepdims=True), jnp.arange(n, dtype=jnp.int32), n), -1)


def frame_counts(log_probs: jax.Array, paddings: jax.Array, blank_id: int, min_logp) -> jax.Array:
    """[B, T] int32: the candidate tokens of each frame (non-blank, log-prob >= min_logp, or the frame's best
    token if it is no blank); -1 on padding. A frame with 0 is a blank frame."""
    ok = (log_probs >= min_logp) & (jnp.arange(log_probs.shape[-1]) != blank_id)
    n = jnp.maximum(ok.sum(-1), (first_argmax(log_probs) != blank_id).astype(jnp.int32))
    return jnp.where(paddings < 0.5, n, -1).astype(jnp.int32)


def top_rows(x: jax.Array, k: int) -> tuple[jax.Array, jax.Array]:
    """The k largest entries along the last axis of x [..., n], largest first: (values, int32 indices), exactly as
    jax.lax.top_k (ties: lower index first, -inf entries too). Rows of up to TOP_ROWS_MAX_N entries: by ranks
    (an [..., n, n] comparison and an [..., k, n] one-hot pick, two fused loops); longer rows: lax.top_k."""
    n = x.shape[-1]
    if n > TOP_ROWS_MAX_N:
        v, i = jax.lax.top_k(x, k)
        return v, i.astype(jnp.int32)
    iota = jnp.arange(n, dtype=jnp.int32)
    xv, xu = x[..., :, None], x[..., None, :]                                   # [..., v, u]
    rank = jnp.sum((xu > xv) | ((xu == xv) & (iota[None, :] < iota[:, None])), -1, dtype=jnp.int32)
    pick = rank[..., None, :] == jnp.arange(k, dtype=jnp.int32)[:, None]         # [..., k, n]: one-hot rows
    return (jnp.max(jnp.where(pick, x[..., None, :], -jnp.inf), -1).astype(x.dtype),
            jnp.sum(jnp.where(pick, iota, 0), -1, dtype=jnp.int32))


def _gaps(blank_lp: jax.Array, bonly: jax.Array, seg: jax.Array, columns: int):
    """Blank frames summed into the column they fold before: gap, has [B, columns + 1]."""
    bi = jnp.arange(seg.shape[0])[:, None]
    gap = jnp.zeros((seg.shape[0], columns + 1), jnp.float32).at[bi, seg].add(jnp.where(bonly, blank_lp, 0.0))
    has = jnp.zeros((seg.shape[0], columns + 1), bool).at[bi, seg].max(bonly)
    return gap, has


def fold_plan(counts: jax.Array, blank_lp: jax.Array, compact: bool) -> FoldPlan:
    """The plan of a search that folds blank frames (traced). counts [B, T] (frame_counts); blank_lp [B, T] the
    blank's log-probs. compact: the columns are each row's frames with candidates, in order (Tc = T, steps = the
    most of a row); else every frame (steps = T), a blank frame being a padding column that folds itself."""
    B, T = counts.shape
    bonly = counts == 0
    ts = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
    if not compact:
        gap, has = _gaps(blank_lp, bonly, ts, T)
        return FoldPlan(ts, (counts <= 0).astype(jnp.float32), gap, has, jnp.int32(T))
    keep = counts > 0
    n_keep = keep.sum(1, dtype=jnp.int32)
    seg = jnp.cumsum(keep, 1, dtype=jnp.int32) - keep                  # a kept frame's column; a blank frame: the next
    bi = jnp.arange(B)[:, None]
    orig_t = jnp.full((B, T + 1), T - 1, jnp.int32).at[bi, jnp.where(keep, seg, T)].set(ts)[:, :T]
    seg = jnp.where(seg >= n_keep[:, None], T, seg)                    # blank frames after the last column: the end
    gap, has = _gaps(blank_lp, bonly, seg, T)
    cpad = (jnp.arange(T)[None] >= n_keep[:, None]).astype(jnp.float32)
    return FoldPlan(orig_t, cpad, gap, has, n_keep.max(initial=0))


def pow2(n: int) -> int:
    n = max(int(n), 1)
    return 1 << (n - 1).bit_length()


def _bucket(n: int) -> int:
    """Host-planned column counts: powers of two up to 16, then multiples of an eighth of the next power of two."""
    p = pow2(n)
    return p if p <= 16 else -(-n // (p // 8)) * (p // 8)


def compaction(counts: np.ndarray):
    """Host plan of the compacted columns (as fold_plan's compact one, bucketed to few shapes). counts [B, T] numpy
    (frame_counts). -> ((orig_t [B, Tc], cpad [B, Tc], seg [B, T], bonly [B, T]), the candidates per column [Tc]):
    seg: the column before which each blank frame (bonly) folds (Tc: after the last)."""
    B, T = counts.shape
    bonly = counts == 0
    keep = counts > 0
    n_keep = keep.sum(1)
    Tc = min(_bucket(max(int(n_keep.max(initial=0)), 1)), T)
    order = np.argsort(~keep, axis=1, kind="stable")[:, :Tc]          # each row's kept frames first, in order
    valid = np.arange(Tc)[None] < n_keep[:, None]
    orig_t = np.where(valid, order, T - 1)
    seg = np.cumsum(keep, 1) - keep                                    # the column after a blank frame
    seg = np.where(seg >= n_keep[:, None], Tc, seg)                    # ... or the end
    col_counts = np.where(valid, np.take_along_axis(counts, orig_t, 1), 0).max(0)
    cpad = (~valid).astype(np.float32)
    return (orig_t.astype(np.int32), cpad, seg.astype(np.int32), bonly), np.maximum(col_counts, 0)


def host_fold_plan(comp, blank_lp: jax.Array) -> FoldPlan:
    """A FoldPlan from compaction()'s host arrays (traced part: the blank log-probs summed per column)."""
    orig_t, cpad, seg, bonly = comp
    gap, has = _gaps(blank_lp, bonly, seg, orig_t.shape[1])
    return FoldPlan(orig_t, cpad, gap, has, jnp.int32(orig_t.shape[1]))


def chunk_schedule(counts: np.ndarray, chunk: int):
    """Steps of a chunked search: column t gets ceil(counts[t] / chunk) steps (at least one); the number of extra
    steps is rounded up to a power of two (one compiled program per power), padded with no-op steps (a later chunk
    of the last column on padding). -> (frame_of, chunk_of, first_of, last_of, valid) [S] and the candidate
    columns per frame (a multiple of chunk)."""
    n = np.maximum(1, -(-counts // chunk)).astype(np.int64)
    T, total = len(n), int(n.sum())
    S = T + pow2(total - T) if total > T else T
    frame_of = np.full(S, T - 1, np.int32)
    frame_of[:total] = np.repeat(np.arange(T), n)
    chunk_of = np.zeros(S, np.int32)
    chunk_of[:total] = np.arange(total) - np.repeat(np.cumsum(n) - n, n)
    first_of = np.zeros(S, bool)
    first_of[:total] = chunk_of[:total] == 0
    last_of = np.zeros(S, bool)
    last_of[:total] = chunk_of[:total] == np.repeat(n, n) - 1
    valid = np.arange(S) < total
    return (frame_of, chunk_of, first_of, last_of, valid), pow2(int(n.max())) * chunk
