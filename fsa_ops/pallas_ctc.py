"""A Pallas kernel for the CTC forward-backward loop of `fsa_ops.ctc_log` (GPU, Triton backend).

One launch runs every frame: the grid has one program per row (R = 2B: forward rows, then backward
rows, as in `fsa_ops.ctc_log`), and each program loops over the T frames inside the kernel with its
row's scores [S'] (S' = S rounded up to a power of two) in registers, float32, in the log semiring
(three-way log-add with one max) or the tropical one (max: Viterbi scores). Per frame it reads the
row's emissions, writes the incoming sums (before the frame's emission) to the table and the
frame's log-scale (the row's max, subtracted at the next frame) to the scales; `fsa_ops.ctc_log`
turns that into the (alpha, beta) tables of its XLA loop (alpha adds the emission back), so that the
gradient code downstream is shared and the numbers are the XLA path's (float32 rounding aside).

The shift of the row by one and two states goes through a per-row scratch row in memory (written
at offset 2, read back at offsets 0..4) between two barriers (`debug_barrier`: the threads of a
program share the row); Triton has no in-register shift.

On CPU the kernel runs with ``interpret=True`` (tests); `use_pallas` says when 'auto' picks it.
This module imports jax and numpy only (no data stack), so it runs on a bare GPU image.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

__all__ = ["IMPLEMENTATIONS", "SEMIRINGS", "use_pallas", "ctc_loop_pallas", "next_power_of_two"]

IMPLEMENTATIONS = ("auto", "pallas", "xla")
SEMIRINGS = ("log", "tropical")
_NEG_INF = float("-inf")
_EXP_FLOOR = -80.0      # as fsa_ops.scores.EXP_FLOOR (no float32 subnormals)


def next_power_of_two(n: int) -> int:
    """The smallest power of two >= n (>= 1): Triton's block sizes."""
    return 1 << max(0, int(n) - 1).bit_length()


def use_pallas(implementation: str) -> bool:
    """Whether `implementation` ('auto' | 'pallas' | 'xla') runs the Pallas kernel: 'auto' does on GPU only."""
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"implementation must be one of {IMPLEMENTATIONS}; got {implementation!r}")
    if implementation == "auto":
        return jax.default_backend() == "gpu"
    return implementation == "pallas"


def _kernel(lp_ref, valid_ref, skip_ref, init_ref, table_ref, scale_ref, last_ref, work_ref, *,
            batch: int, frames: int, width: int, semiring: str, barrier: bool):
    """One row: loops over the frames (see the module docstring). Refs are whole arrays in memory:
    lp [R, T, S'], valid [R, T], skip [R, S'], init [R, S'] -> table [R, T, S'], scale [R, T],
    last [R, S'], work [R, 2 S'] (scratch)."""
    row = pl.program_id(0)
    forward = row < batch
    skip = skip_ref[row, :] > 0.5
    work_ref[row, :] = jnp.full((2 * width,), _NEG_INF, jnp.float32)

    def sync():
        if barrier:
            pltriton.debug_barrier()

    def body(t, carry):
        post, offset = carry
        alpha = post - offset
        sync()
        work_ref[row, pl.ds(2, width)] = alpha
        sync()
        x1 = jnp.where(forward, work_ref[row, pl.ds(1, width)], work_ref[row, pl.ds(3, width)])
        x2 = jnp.where(forward, work_ref[row, pl.ds(0, width)], work_ref[row, pl.ds(4, width)])
        x2 = jnp.where(skip, x2, _NEG_INF)
        hi = jnp.maximum(alpha, x1)
        top = jnp.maximum(hi, x2)
        if semiring == "log":
            lo = jnp.minimum(alpha, x1)
            other = jnp.where(x2 > hi, hi, x2)
            safe = jnp.where(top > _NEG_INF, top, 0.0)
            incoming = top + jnp.log(1.0 + jnp.exp(jnp.maximum(other - safe, _EXP_FLOOR))
                                     + jnp.exp(jnp.maximum(lo - safe, _EXP_FLOOR)))
        else:
            incoming = top
        valid = valid_ref[row, pl.ds(t, 1)] > 0.5                               # [1]
        post = jnp.where(valid, incoming + lp_ref[row, t, :], alpha)
        new_offset = jnp.max(post)
        new_offset = jnp.where(new_offset > _NEG_INF, new_offset, 0.0)
        frame = jnp.where(forward, t, frames - 1 - t)
        table_ref[row, frame, :] = incoming
        scale_ref[row, pl.ds(frame, 1)] = jnp.full((1,), new_offset, jnp.float32)
        return post, new_offset

    post, offset = jax.lax.fori_loop(0, frames, body, (init_ref[row, :], jnp.float32(0.0)))
    last_ref[row, :] = post - offset


@functools.partial(jax.jit, static_argnames=("batch", "semiring", "interpret", "num_warps"))
def ctc_loop_pallas(lp_rows, valid_rows, skip, init, *, batch: int, semiring: str = "log",
                    interpret: bool = False, num_warps: int = 4):
    """The CTC frame loop of `fsa_ops.ctc_log.run_log` as one Pallas launch (its own table layout, below).

    lp_rows [R, T, S] float32: row r's emissions in loop order (forward rows frame t, backward rows
    frame T-1-t; natural state order; -inf on padding states); valid_rows [R, T] bool (loop order);
    skip [R, S] bool (forward rows: state s entered from s-2; backward rows: from s+2); init [R, S]
    float32 (0 on the start state, -inf elsewhere); batch = B (rows < B run forward, taking from
    s-1 and s-2; the others backward, from s+1 and s+2).
    Returns (table [R, T, S]: the incoming sums at each NATURAL frame (forward rows: frame t at
    step t; backward rows: frame T-1-t), relative to the scales of the steps before; scale [R, T]:
    the log-scale removed after each natural frame's step; last [R, S]: the final scores, shifted
    to max 0, their scale being the sum of `scale`).
    """
    if semiring not in SEMIRINGS:
        raise ValueError(f"semiring must be one of {SEMIRINGS}; got {semiring!r}")
    rows, frames, states = lp_rows.shape
    width = next_power_of_two(max(states, 4))
    pad = width - states
    lp_p = jnp.pad(lp_rows.astype(jnp.float32), ((0, 0), (0, 0), (0, pad)), constant_values=_NEG_INF)
    skip_p = jnp.pad(skip.astype(jnp.float32), ((0, 0), (0, pad)))
    init_p = jnp.pad(init.astype(jnp.float32), ((0, 0), (0, pad)), constant_values=_NEG_INF)
    kernel = functools.partial(_kernel, batch=batch, frames=frames, width=width, semiring=semiring,
                               barrier=not interpret)
    out_shape = (jax.ShapeDtypeStruct((rows, frames, width), jnp.float32),
                 jax.ShapeDtypeStruct((rows, frames), jnp.float32),
                 jax.ShapeDtypeStruct((rows, width), jnp.float32),
                 jax.ShapeDtypeStruct((rows, 2 * width), jnp.float32))
    table, scale, last, _ = pl.pallas_call(
        kernel, out_shape=out_shape, grid=(rows,), interpret=interpret,
        compiler_params=None if interpret else pltriton.CompilerParams(num_warps=num_warps, num_stages=1),
        name="ctc_frame_loop")(lp_p, valid_rows.astype(jnp.float32), skip_p, init_p)
    return table[:, :, :states], scale, last[:, :states]
