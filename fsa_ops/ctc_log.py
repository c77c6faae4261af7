"""The log-semiring CTC recursion of `fsa_ops.ctc` (``method='log'``, the default): exact for any logits.

Runs on the rows of a `fsa_ops.ctc_lattice.CtcLattice` (R = 2B: forward rows, then backward rows
state-reversed), one frame per loop iteration: `log_ctc_step` (a three-way log-add per state with
one max: two exps and a log; ``-inf`` = impossible) and then `log_renormalise`, which shifts every
row back to max 0 and keeps the removed log-scales apart, so that float32 keeps its absolute
precision for T in the thousands.  The emission table ``lp [B, T, S]`` (`CtcLattice.emissions`) is
gathered before the loop.

`run_log` returns (tables, log_z [R]); log_z is the total log-likelihood per row (rows b and B+b
compute it independently).  The tables are (alpha [B, T, S], beta [B, T, S], scale_f [B, T],
scale_b [B, T]) in natural frame and state order:

  alpha: forward score of frames 0..t ending in s (including frame t's emission);
  beta:  backward score of frames t+1..T-1 from state s after frame t (frame t's emission
         excluded),

so that occupancies need no division by the emission (`log_occupancy`): the true log values are
``alpha[b, t] + sum_{t' <= t} scale_f[b, t']`` and ``beta[b, t] + sum_{t' >= t} scale_b[b, t']``,
and ``gamma[t, s] = alpha[t, s] * beta[t, s] / Z``.

``implementation='pallas'`` (or 'auto' on GPU) runs the frame loop as one Pallas kernel
(`fsa_ops.pallas_ctc`, backward rows in natural state order) and returns the same tables.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from fsa_ops.ctc_lattice import CtcLattice, normalise_over_states
from fsa_ops.pallas_ctc import ctc_loop_pallas, use_pallas
from fsa_ops.scores import EXP_FLOOR, exp_flushed, shift_states

__all__ = ["log_ctc_step", "log_renormalise", "run_log", "log_occupancy", "natural_row_masks"]


def log_ctc_step(log_alpha, lp, valid, skip, semiring: str = "log"):
    """One CTC frame in the log semiring (-inf = impossible; semiring='tropical': max instead of log-add).

    log_alpha [R, S] float32; lp [R, S] log-probabilities of the positions' symbols at this frame
    (-inf on padding states); valid [R] bool (False: padded frame, the row does not change);
    skip [R, S] bool (position p may be entered from p-2).
    Returns (new_log_alpha [R, S], incoming [R, S]): incoming = the log-add of the (up to three)
    predecessors p, p-1, p-2, as ``top + log(1 + exp(b - top) + exp(c - top))`` for the two terms b, c
    that are not the max (two exps; arguments below -80 clamped: a term of 1.8e-35 cannot change a
    sum that holds 1, and no float32 subnormals, which are slow on x86); new = incoming + lp.
    """
    neg_inf = jnp.float32(-jnp.inf)
    x1 = shift_states(log_alpha, 1, neg_inf)
    x2 = jnp.where(skip, shift_states(log_alpha, 2, neg_inf), neg_inf)
    hi = jnp.maximum(log_alpha, x1)
    top = jnp.maximum(hi, x2)
    if semiring == "tropical":
        incoming = top
    else:
        lo = jnp.minimum(log_alpha, x1)
        other = jnp.where(x2 > hi, hi, x2)          # the terms that are not the max: `other` and lo
        safe = jnp.where(jnp.isfinite(top), top, 0.0)
        incoming = top + jnp.log(1.0 + jnp.exp(jnp.maximum(other - safe, EXP_FLOOR))
                                 + jnp.exp(jnp.maximum(lo - safe, EXP_FLOOR)))
    return jnp.where(valid[:, None], incoming + lp, log_alpha), incoming


def log_renormalise(log_alpha):
    """Shifts every row to max 0: returns (log_alpha - offset, offset [R]) (offset 0 for rows
    without mass). Keeping the values near 0 keeps float32's absolute precision for long inputs."""
    offset = jnp.max(log_alpha, axis=-1)
    offset = jnp.where(jnp.isfinite(offset), offset, 0.0)
    return log_alpha - offset[:, None], offset


def run_log(lat: CtcLattice, lp, store: bool = True, *, implementation: str = "xla", semiring: str = "log"):
    """The log recursion over the emissions lp [B, T, S]: (tables, log_z [R]) as the module
    docstring says; store=False: only log_z is computed (tables is None), in a loop that writes
    no tables. implementation: 'xla', 'pallas' (interpreted on CPU) or 'auto' (Pallas on GPU).
    semiring='tropical': Viterbi scores (log_z = the best alignment's log-probability; its tables
    are not occupancies)."""
    if use_pallas(implementation):
        return _run_pallas(lat, lp, store, semiring)
    init = jnp.where(lat.start, 0.0, -jnp.inf).astype(jnp.float32)
    # (store=False: the same loop; XLA drops the table writes that nothing reads)
    last, tables, scale_sum = _frame_loop(init, lp, lat, semiring)
    return (tables if store else None), _finish(last, lat.final, scale_sum, semiring)


def _finish(last, final, scale_sum, semiring: str):
    """log_z [R] from the last scores [R, S] and the sum of the removed log-scales [R]."""
    last = jnp.where(final, last, -jnp.inf)
    return (jnp.max(last, axis=-1) if semiring == "tropical" else jax.nn.logsumexp(last, axis=-1)) + scale_sum


def natural_row_masks(lat: CtcLattice):
    """(skip, start, final) [R, S] with the backward rows in NATURAL state order (the Pallas kernel's
    layout): forward rows enter s from s-2 where the lattice's skip[s], backward rows from s+2 where
    skip[s+2]; they start at state 0 and at the last state, and end in the last two states and in
    states 0 and 1."""
    batch = lat.shape[0]
    skip = lat.skip[:batch]
    states = jnp.arange(skip.shape[1])[None, :]
    last = jnp.sum(lat.state_valid, axis=1, keepdims=True) - 1
    return (jnp.concatenate([skip, jnp.concatenate([skip[:, 2:], jnp.zeros_like(skip[:, :2])], axis=1)]),
            jnp.concatenate([jnp.broadcast_to(states == 0, skip.shape), states == last]),
            jnp.concatenate([lat.final[:batch], (states <= 1) & lat.state_valid]))


def _run_pallas(lat: CtcLattice, lp, store: bool, semiring: str):
    """`run_log` through `fsa_ops.pallas_ctc.ctc_loop_pallas`, with the same tables."""
    batch = lat.shape[0]
    skip, start, final = natural_row_masks(lat)
    valid = lat.frame_valid
    args = (jnp.concatenate([lp, lp[:, ::-1]]), jnp.concatenate([valid, valid[:, ::-1]]), skip,
            jnp.where(start, 0.0, -jnp.inf).astype(jnp.float32))
    kernel = functools.partial(ctc_loop_pallas, batch=batch, semiring=semiring)
    # interpreted where the program is lowered for the CPU, compiled (Triton) for GPUs
    table, scale, last = jax.lax.platform_dependent(
        *args, cpu=functools.partial(kernel, interpret=True), default=functools.partial(kernel, interpret=False))
    scale_sum = jnp.sum(scale, axis=1)
    log_z = _finish(last, final, scale_sum, semiring)
    if not store:
        return None, log_z
    # The kernel stores the incoming sums of every frame relative to the maxima removed at the steps
    # before it, and books each step's maximum on its natural frame. `_frame_loop`'s tables hold alpha
    # including frame t's emission and book on each frame the shift its step applied: the kernel's
    # maxima moved by one step (one frame later for alpha, one frame earlier for beta).
    alpha = jnp.where(valid[:, :, None], table[:batch] + lp, table[:batch])
    beta = table[batch:]
    norm_f = jnp.concatenate([jnp.zeros_like(scale[:batch, :1]), scale[:batch, :-1]], axis=1)
    norm_b = jnp.concatenate([scale[batch:, 1:], jnp.zeros_like(scale[batch:, :1])], axis=1)
    return (alpha, beta, norm_f, norm_b), log_z


def _frame_loop(init, table, lat: CtcLattice, semiring: str = "log"):
    """Runs `log_ctc_step` over the rows' frames of `table` [B, T, S] (forward rows frame t, backward
    rows frame T-1-t, states reversed), each row shifted back to max 0 at every frame.

    Returns (last carry [R, S], (alpha, beta, norm_f, norm_b), log-scale sum [R]): alpha [B, T, S] =
    the forward rows' scores after each frame (including its emission), beta [B, T, S] = the backward
    rows' incoming sums at each frame (excluding its emission), both in natural order; norm_* [B, T]
    the shift each row's scores took at that frame (so that alpha's scale is the sum of norm_f over frames <= t,
    beta's that of norm_b over frames >= t).

    The shift by the previous frame's max is applied inside the next step (the carry is the
    unshifted scores and their max), and each table row holds its frame's shift in a last column,
    so that a frame costs one fused step, one reduction and two table writes."""
    batch, frames, _, states = lat.shape
    valid = lat.frame_valid
    buf = jnp.zeros((batch, frames, states + 1), jnp.float32)

    def body(t, state):
        """Frame t (forward rows) and T-1-t (backward rows)."""
        post, offset, alpha, beta = state
        back = frames - t - 1
        shift = jnp.where(jnp.isfinite(offset), offset, 0.0)
        at = lambda x, start: jax.lax.dynamic_slice_in_dim(x, start, 1, axis=1)  # noqa: E731  [B, 1, ...]
        frame = jnp.concatenate([at(table, t)[:, 0], at(table, back)[:, 0, ::-1]], axis=0)
        frame_valid = jnp.concatenate([at(valid, t)[:, 0], at(valid, back)[:, 0]], axis=0)
        post, incoming = log_ctc_step(post - shift[:, None], frame, frame_valid, lat.skip, semiring)
        put = lambda x, row, start: jax.lax.dynamic_update_slice_in_dim(x, row[:, None], start, axis=1)  # noqa: E731
        alpha = put(alpha, jnp.concatenate([post[:batch], shift[:batch, None]], axis=1), t)
        beta = put(beta, jnp.concatenate([incoming[batch:, ::-1], shift[batch:, None]], axis=1), back)
        return post, jnp.max(post, axis=1), alpha, beta

    post, offset, alpha, beta = jax.lax.fori_loop(
        0, frames, body, (init, jnp.zeros(init.shape[:1], jnp.float32), buf, buf))
    last_shift = jnp.where(jnp.isfinite(offset), offset, 0.0)
    norm_f, norm_b = alpha[:, :, -1], beta[:, :, -1]
    scale_sum = jnp.concatenate([jnp.sum(norm_f, axis=1), jnp.sum(norm_b, axis=1)]) + last_shift
    return post - last_shift[:, None], (alpha[:, :, :-1], beta[:, :, :-1], norm_f, norm_b), scale_sum


def log_occupancy(lat: CtcLattice, tables, log_z):
    """State occupancies gamma [B, T, S] from the tables of `run_log`, renormalised over s within
    each frame (`normalise_over_states`)."""
    alpha, beta, scale_f, scale_b = tables
    # log of the factor that turns alpha * beta into gamma: forward scales of frames <= t,
    # backward scales of frames >= t, minus log Z.
    log_factor = jnp.cumsum(scale_f, axis=1) + jax.lax.cumsum(scale_b, axis=1, reverse=True)
    log_factor = log_factor - jnp.where(jnp.isfinite(log_z), log_z, 0.0)[:, None]
    # (exact arithmetic gives log gamma <= 0; the cap only guards the exp against rounding)
    gamma = exp_flushed(jnp.minimum(alpha + beta + log_factor[:, :, None], 30.0))
    return normalise_over_states(lat, gamma, log_z)
