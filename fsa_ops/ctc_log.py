"""The log-semiring CTC recursion of `fsa_ops.ctc` (``method='log'``, the default): exact for any logits.

Runs on the rows of a `fsa_ops.ctc_lattice.CtcLattice` (R = 2B: forward rows, then backward rows
state-reversed), one frame per loop iteration over the emissions in loop order (rows [T, R, S],
`CtcLattice.loop_emissions`, gathered once before the loop): a three-way log-add per state with
one max (two exps and a log; ``-inf`` = impossible), plus the frame's emission; after each frame
every row is shifted back to max 0 and the removed log-scale is booked apart, so that float32 keeps
its absolute precision for T in the thousands.

`run_log` returns (tables, log_z [R]); log_z is the total log-likelihood per row (rows b and B+b
compute it independently).  The tables are (alpha, beta) [T, B, S] (time-major, natural frame and
state order):

  alpha: forward score of frames 0..t ending in s (including frame t's emission);
  beta:  backward score of frames t..T-1 from state s at frame t (frame t's emission excluded),

each relative to its own running shifts.  `log_occupancy` turns them into occupancies
``gamma[t, s] = alpha[t, s] * beta[t, s] / Z`` by taking out the max over s of alpha + beta within
each frame and renormalising (the shifts and Z are common to a frame's states).

``implementation='pallas'`` (or 'auto' on GPU) runs the frame loop as one Pallas kernel
(`fsa_ops.pallas_ctc`, backward rows in natural state order) and returns the same tables.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from fsa_ops.ctc_lattice import CtcLattice, row_sum
from fsa_ops.pallas_ctc import ctc_loop_pallas, use_pallas
from fsa_ops.scores import EXP_FLOOR, exp_flushed

__all__ = ["run_log", "log_occupancy", "natural_row_masks"]


def run_log(lat: CtcLattice, lp=None, store: bool = True, *, rows=None, implementation: str = "xla",
            semiring: str = "log"):
    """The log recursion over the emissions, given as lp [B, T, S] (natural order,
    `CtcLattice.emissions`) or rows [T, R, S] (loop order, `CtcLattice.loop_emissions`): (tables,
    log_z [R]) as the module docstring says; store=False: only log_z is computed (tables is None).
    implementation: 'xla', 'pallas' (interpreted on CPU) or 'auto' (Pallas on GPU).
    semiring='tropical': Viterbi scores (log_z = the best alignment's log-probability; its tables
    are not occupancies)."""
    if (lp is None) == (rows is None):
        raise ValueError("run_log takes lp or rows (one of them)")
    batch = lat.shape[0]
    if use_pallas(implementation):
        if lp is None:
            lp = jnp.transpose(rows[:, :batch], (1, 0, 2))
        return _run_pallas(lat, lp, store, semiring)
    if rows is None:
        rows = jnp.concatenate([jnp.transpose(lp, (1, 0, 2)), jnp.transpose(lp[:, ::-1, ::-1], (1, 0, 2))], axis=1)
    init = jnp.where(lat.start, 0.0, -jnp.inf).astype(jnp.float32)
    last, out = _frame_loop(init, rows, lat.loop_valid, lat.skip, store, semiring)
    if not store:
        return None, _finish(last, lat.final, jnp.sum(out, axis=0), semiring)
    states = rows.shape[2]
    shift_sum = jnp.concatenate([jnp.sum(out[0][:, :, states], axis=0), jnp.sum(out[1][:, :, states], axis=0)])
    return (out[0][:, :, :states], out[1][:, :, :states]), _finish(last, lat.final, shift_sum, semiring)


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
    # The kernel stores the incoming sums of every frame (before its emission): alpha adds the
    # emission back, beta is that table (each relative to its own shifts, as `log_occupancy` wants)
    alpha = jnp.where(valid[:, :, None], table[:batch] + lp, table[:batch])
    return (jnp.swapaxes(alpha, 0, 1), jnp.swapaxes(table[batch:], 0, 1)), log_z


def _frame_loop(init, rows, valid, skip, store: bool, semiring: str = "log"):
    """Runs the CTC step over rows [T, R, S] (loop order), valid [T, R], from init [R, S], every row
    shifted back to max 0 after every frame.

    Returns (last scores [R, S] (shifted), out): with store, out = (alpha, beta) [T, B, S+1] in
    natural frame and state order: the forward rows' scores after frame t (including its
    emission) and the backward rows' scores before it (excluding its emission), relative to the
    shifts applied before that step, and in column S the shift applied after the step (the max of
    the row's new scores, 0 for rows without mass); without store, out = those shifts [T, R] in
    loop order. The true log-likelihood is the log-add of the last scores plus all the shifts.

    The step reads its three predecessors as plain slices of a carry with two -inf columns in
    front, and only the next carry's (cheap) fusion subtracts the shift and pads: XLA's CPU
    fusions with a pad, a concatenate or a broadcast before a slice in them do not vectorise
    their exps and logs. The loop body is then the step, the max (which XLA:CPU runs as two
    reductions for S > 32), the next carry and one table write per direction, plus the loop's own
    counter and condition. At (8, 100, 32, 20) on CPU that kernel count takes ~60 % of the loop's time and the
    log-add's exps and logs ~40 % (bench/ctc_anatomy.py: the same loop in the tropical semiring)."""
    frames, num_rows, states = rows.shape
    batch = num_rows // 2
    neg_inf = jnp.float32(-jnp.inf)
    gap = jnp.full((num_rows, 2), neg_inf)
    put = functools.partial(jax.lax.dynamic_update_slice_in_dim, axis=0, allow_negative_indices=False)

    def body(t, state):
        padded, out = state
        stay = padded[:, 2:]
        frame = jax.lax.dynamic_slice_in_dim(rows, t, 1, 0, allow_negative_indices=False)[0]
        frame_valid = jax.lax.dynamic_slice_in_dim(valid, t, 1, 0, allow_negative_indices=False)[0]
        incoming = _log_add3(stay, padded[:, 1:-1], jnp.where(skip, padded[:, :-2], neg_inf), semiring)
        post = jnp.where(frame_valid[:, None], incoming + frame, stay)
        top = jnp.max(post, axis=1, keepdims=True)
        shift = jnp.where(jnp.isfinite(top), top, 0.0)
        if store:
            # the backward rows' table takes the frame's emission out again (beta excludes it): one
            # rounding of the size of the one that alpha (which includes the emission) carries
            beta = jnp.where(frame[batch:] > -jnp.inf, post[batch:] - frame[batch:], neg_inf)[:, ::-1]
            out = (put(out[0], jnp.concatenate([post[:batch], shift[:batch]], axis=1)[None], t),
                   put(out[1], jnp.concatenate([beta, shift[batch:]], axis=1)[None], frames - 1 - t))
        else:
            out = put(out, shift[None, :, 0], t)
        return jnp.concatenate([gap, post - shift], axis=1), out

    if store:
        out = (jnp.zeros((frames, batch, states + 1), jnp.float32), jnp.zeros((frames, batch, states + 1), jnp.float32))
    else:
        out = jnp.zeros((frames, num_rows), jnp.float32)
    padded, out = jax.lax.fori_loop(0, frames, body, (jnp.concatenate([gap, init], axis=1), out))
    return padded[:, 2:], out


def _log_add3(x0, x1, x2, semiring: str):
    """The log-add (tropical: max) of three arrays of scores (-inf = impossible), as
    ``top + log(1 + exp(b - top) + exp(c - top))`` for the two terms b, c that are not the max
    (two exps; arguments below -80 clamped: a term of 1.8e-35 cannot change a sum that holds 1,
    and no float32 subnormals, which are slow on x86)."""
    hi = jnp.maximum(x0, x1)
    top = jnp.maximum(hi, x2)
    if semiring == "tropical":
        return top
    lo = jnp.minimum(x0, x1)
    other = jnp.where(x2 > hi, hi, x2)          # the terms that are not the max: `other` and lo
    safe = jnp.where(jnp.isfinite(top), top, 0.0)
    return top + jnp.log(1.0 + jnp.exp(jnp.maximum(other - safe, EXP_FLOOR))
                         + jnp.exp(jnp.maximum(lo - safe, EXP_FLOOR)))


def log_occupancy(lat: CtcLattice, tables):
    """State occupancies gamma [T, B, S] (time-major) from the tables of `run_log`: alpha + beta
    shifted by its max over s and exponentiated, then renormalised to sum 1 over s within each
    frame (0 on padded frames and frames without mass). alpha and beta of a frame carry different
    running shifts, and the max takes their sum (and log Z) out exactly, whatever their rounding."""
    alpha, beta = tables
    both = alpha + beta
    top = jnp.max(both, axis=-1)                                                        # [T, B]
    top = jnp.where(lat.frame_valid.T & (top > -jnp.inf), top, jnp.inf)
    gamma = exp_flushed(both - top[:, :, None])
    return gamma * (1.0 / jnp.maximum(row_sum(gamma), 1.0))[:, :, None]
