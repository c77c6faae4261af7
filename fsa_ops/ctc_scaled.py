"""The rescaled CTC recursion of `fsa_ops.ctc` (``method='scaled'``, and the first try of 'auto').

Runs on probabilities instead of logs (multiply-add per state, no exp/log in the loop), on the rows
of a `fsa_ops.ctc_lattice.CtcLattice` (R = 2B: forward rows, then backward rows state-reversed).
Its range between states within a frame is ~80 nats (float32, exponentials below exp(-80) flushed
to 0), which can lose mass (see `fsa_ops.ctc` on when 'auto' falls back to the log recursion).

How (`run_scaled`): emissions are ``exp(x - max_k x)`` gathered straight into the loop's
time-major order [T, 2B, S] (the frame's log-normaliser is added to a log-scale instead of
dividing), each row's emissions are divided by their sum, and every frame starts by dividing the
carried row by its row sum (a matrix-vector product: on CPU much cheaper than a reduction).  The
loop stores one [T, 2B, S+1] table: forward rows' new values, backward rows' incoming sums, and
each step's log-scale increment as column S; it writes it over the gathered emission rows
(gathered with a spare column S), each frame after reading it, so that no zero-filled output
buffer is made.  One prefix sum after the loop turns the increments into log-scales.

Tables (store=True) = (table [T, R, S+1], log_scale [T, R], row_offset [T, R]) in loop
coordinates: at step u, row b < B holds alpha of frame u (its emission included) and row B+b
beta_excl of frame T-1-u with its states reversed; the true log value of a forward entry is
log(table) + log_scale, of a backward entry log(table) + log_scale - row_offset.  `scaled_occupancy`
and `scaled_parts` turn them into occupancies.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from fsa_ops.ctc_lattice import (CtcLattice, nonfinite_frames, normalise_over_states, row_sum, time_major_gather,
                                usable_inverse)
from fsa_ops.scores import EXP_FLOOR, exp_flushed, shift_states

__all__ = ["scaled_ctc_step", "run_scaled", "scaled_occupancy", "scaled_parts"]

# the smallest value a step keeps (smaller ones are flushed to 0, as `exp_flushed` does)
_TINY = float(np.exp(EXP_FLOOR))

# Up to this many frames a prefix sum over time is one product with a triangular matrix (one
# kernel; XLA's CPU cumsum is a chain of several reduce-window/pad/slice kernels).
_PREFIX_SUM_BY_PRODUCT = 512


def scaled_ctc_step(alpha, emit, valid, skip):
    """One CTC frame in the probability semiring (multiply-add, no exp/log per state).

    alpha [R, S] float32 (>= 0); emit [R, S] = exp(lp - shift) (0 on padding states); valid [R]
    bool (False: padded frame, the row does not change); skip [R, S] bool (position p may be
    entered from p-2). Returns (new_alpha [R, S], incoming [R, S]): incoming = sum of the
    predecessors, new_alpha = incoming * emit with values below exp(-80) flushed to 0.
    """
    incoming = alpha + shift_states(alpha, 1, 0.0) + jnp.where(skip, shift_states(alpha, 2, 0.0), 0.0)
    post = incoming * emit
    post = jnp.where(post > _TINY, post, 0.0)   # no subnormals (see `exp_flushed`)
    return jnp.where(valid[:, None], post, alpha), incoming


def _prefix_sum(x):
    """Inclusive prefix sum over axis 0 of x [T, R] (float32).

    The product accumulates term by term, so its float32 rounding grows with the partial sums
    (log-scale increments of a few nats each add up to hundreds of nats within a few hundred
    frames, and the rounding then makes the forward and backward totals of 'auto' disagree); each
    column's mean is taken out first and put back as (t + 1) * mean, so that the accumulated
    partial sums stay small.
    """
    frames = x.shape[0]
    if frames > _PREFIX_SUM_BY_PRODUCT:
        return jnp.cumsum(x, axis=0)
    highest = jax.lax.Precision.HIGHEST
    mean = jnp.dot(jnp.full((frames,), 1.0 / frames, jnp.float32), x, precision=highest)       # [R]
    steps = jnp.arange(1, frames + 1, dtype=jnp.float32)[:, None]
    lower = (jnp.arange(frames)[:, None] >= jnp.arange(frames)[None, :]).astype(jnp.float32)
    return jnp.dot(lower, x - mean, precision=highest) + steps * mean


def _centred_total(x):
    """Sum over axis 0 of x [T, R] (float32) with each column's mean taken out first and put back
    as T * mean (see `_prefix_sum`): its last row without the other rows."""
    frames = x.shape[0]
    highest = jax.lax.Precision.HIGHEST
    mean = jnp.dot(jnp.full((frames,), 1.0 / frames, jnp.float32), x, precision=highest)       # [R]
    return jnp.dot(jnp.ones((frames,), jnp.float32), x - mean, precision=highest) + frames * mean


def run_scaled(lat: CtcLattice, logits, log_probs: bool, store: bool = True, mark_flushed: bool = False):
    """The rescaled recursion in one loop over time-major rows (see `_scaled_loop`).

    Emissions are the logits' exponentials relative to each frame's largest logit,
    ``exp(x - max_k x)`` (so the largest is 1 and no division is needed); the frame's offset to
    the true log-probabilities, ``max_k x - log_norm`` (``-log sum_k exp(x - max_k x)``), is added
    to the row's log-scale inside the loop. Returns (tables, log_z [R], log_norm [B, T],
    bad_frames [B, T]): tables as the module docstring says (column S of the table holds the loop's
    log-scale increments), None with store=False; bad_frames: `nonfinite_frames` (read off the
    normaliser's sum, or with log_probs a sum over the classes).
    mark_flushed=True ('auto'): log_z is NaN in both directions of a sequence for which an
    emission of a valid state was flushed (see the comment in the body).
    """
    batch, frames, classes, states = lat.shape
    x = logits.astype(jnp.float32)
    top = jnp.max(x, axis=-1)
    top = jnp.where(jnp.isfinite(top), top, 0.0)                                   # [B, T]
    if log_probs:
        log_norm = jnp.zeros((batch, frames), jnp.float32)
        offset = top
        bad_frames = nonfinite_frames(jnp.sum(x, axis=-1))
    else:
        total = jnp.sum(jnp.exp(x - top[:, :, None]), axis=-1)   # (a plain exp: fused into the sum)
        offset = -jnp.log(jnp.where(total > 0, total, 1.0))
        log_norm = top - offset
        bad_frames = nonfinite_frames(total)      # (NaN or +inf logits make the sum NaN or +inf)
    # emissions gathered straight into loop order; padding states emit too (blank ids) but the
    # loop masks what enters them (`enter`), so that no masked copy of the table is made
    top_rows = jnp.concatenate([top.T, top[:, ::-1].T], axis=1)                       # [T, R]
    # (store: one spare column S, which the loop overwrites with the log-scale increments)
    relative = time_major_gather(x, jnp.clip(lat.ext, 0, classes - 1), spare=store) - top_rows[:, :, None]
    rows = exp_flushed(relative)
    valid = jnp.concatenate([lat.frame_valid.T, lat.frame_valid[:, ::-1].T], axis=1)  # [T, R]
    enter = jnp.concatenate([lat.state_valid, lat.state_valid[:, ::-1]], axis=0)
    if mark_flushed:
        # An emission more than 80 nats below its frame's best class is flushed to 0 in both
        # directions alike, so their totals agree even when a likely path needed it. Such entries
        # (of valid states and frames of feasible sequences; exact zeros from -inf logits are no
        # loss) are set to -1e30: the row total turns negative and its log NaN, and so does log_z
        # in both directions, which 'auto' reads as lost mass (no extra reduction).
        entered = enter & jnp.concatenate([lat.feasible, lat.feasible])[:, None]
        if store:
            entered = jnp.concatenate([entered, jnp.zeros_like(entered[:, :1])], axis=1)
        lost = (relative <= EXP_FLOOR) & (relative > -jnp.inf) & entered & valid[:, :, None]
        rows = jnp.where(lost, -1e30, rows)
    # Each row's emissions are divided by their sum inside the loop (largest >= 1/S), so that the
    # range below a frame's best state is ~80 nats even where the best class is no label.
    row_total = row_sum(rows, (jnp.arange(rows.shape[2]) < states).astype(jnp.float32))
    row_total = jnp.where(valid & (row_total != 0), row_total, 1.0)
    row_offset = jnp.concatenate([offset.T, offset[:, ::-1].T], axis=1) + jnp.log(row_total)
    row_offset = jnp.where(valid, row_offset, 0.0)
    last, tables = _scaled_loop(lat.start.astype(jnp.float32), rows, 1.0 / row_total, valid, row_offset,
                                lat.skip, enter, store)
    post, last_scale = last
    log_z = jnp.log(row_sum(jnp.where(lat.final, post, 0.0))) + last_scale
    if not store:
        return None, log_z, log_norm, bad_frames
    return tables + (row_offset,), log_z, log_norm, bad_frames


def _scaled_loop(init, rows, gain, valid, offset, skip, enter, store: bool):
    """Scaled recursion over rows [T, R, S] with emissions rows * gain[..., None] * enter (gain,
    valid, offset [T, R]; offset = the log-factor that the gained emissions lack; enter [R, S]
    bool: the states that exist), renormalised at the start of every frame. With store=True,
    rows is [T, R, S+1] (column S unused) and the table is written over it, frame by frame after
    the frame's row is read, so that no zero-filled output buffer is needed.

    The carry is (x [R, S] unnormalised, its row sum [R]); each step's log-scale increment (the
    log of the sum it divides by, plus the frame's offset) goes to the table's column S (store) or
    to the scan's output, and one centred sum after the loop adds them up (the true value is
    x * exp(log-scale)). Each frame starts by dividing x by the sum inside the fused step, so that
    the body is little more than the step and the row sum (a matrix-vector product: on CPU much
    faster than a reduction). Rows without mass keep sum 1.

    Returns ((x after step T-1 divided by its sum [R, S], its log-scale [R]), table [T, R, S + 1]
    or None (store=False)): at each step the forward rows' new value and the backward rows'
    incoming sum, with the log-scale that the forward value lacks as column S (the backward rows'
    value lacks that minus the step's offset).
    """
    frames, num_rows = rows.shape[:2]
    states = init.shape[1]
    forward_row = (jnp.arange(num_rows) < num_rows // 2)[:, None]
    # row-sum weights derived from an input, so that XLA builds them once outside the loop body
    # rather than re-broadcasting a constant on every step; the input made finite first (a row
    # whose first gain was NaN, from a +inf logit, made them all NaN, and then no row was
    # renormalised any more; derived from another input, such as the bool `valid`, the body got
    # ~10% slower at (8, 100, 32, 20))
    first_gain = gain[0, 0]
    ones = jnp.broadcast_to(1.0 + 0.0 * jnp.where(jnp.isfinite(first_gain), first_gain, 0.0), (states,))

    def advance(x, norm, frame_rows, frame_gain, frame_valid, frame_offset):
        """One frame: (x [R, S], incoming [R, S], log-scale increment [R])."""
        norm = jnp.where(norm > 0, norm, 1.0)
        x = x * (1.0 / norm)[:, None]
        increment = jnp.log(norm)
        emit = jnp.where(enter, frame_rows[:, :states] * frame_gain[:, None], 0.0)
        x, incoming = scaled_ctc_step(x, emit, frame_valid, skip)
        return x, incoming, increment + frame_offset

    norm0 = jnp.ones((num_rows,), jnp.float32)
    if store:
        # the log-scale is not carried (one update fewer per step); each stored row holds its
        # increment instead, summed up by one prefix sum after the loop
        def in_place(t, state):
            x, norm, buf = state
            def at(a):
                return jax.lax.dynamic_slice_in_dim(a, t, 1, 0, allow_negative_indices=False)
            x, incoming, increment = advance(x, norm, at(buf)[0, :, :states], at(gain)[0], at(valid)[0],
                                             at(offset)[0])
            out = jnp.concatenate([jnp.where(forward_row, x, incoming), increment[:, None]], axis=1)
            return x, row_sum(x, ones), jax.lax.dynamic_update_slice_in_dim(buf, out[None], t, 0,
                                                                              allow_negative_indices=False)

        x, norm, table = jax.lax.fori_loop(0, frames, in_place, (init, norm0, rows))
        scales = _prefix_sum(table[:, :, states])
        return _normalised_last(x, norm, scales[-1]), (table, scales)

    # store=False: no table; the steps' log-scale increments [T, R] come out of the scan and are
    # summed as the stored table's column is (`_centred_total`, the last row of `_prefix_sum`):
    # carried as a running float32 sum they drifted ~1e-3 nats apart in the two directions at
    # (32, 250, 32, 60), and 'auto' then fell back to the log recursion on every value-only call
    # (a compensated running sum costs more per step than the scan's output)
    def carried(carry, xs):
        x, norm = carry
        x, _, increment = advance(x, norm, *xs)
        return (x, row_sum(x, ones)), increment

    (x, norm), increments = jax.lax.scan(carried, (init, norm0), (rows, gain, valid, offset))
    return _normalised_last(x, norm, _centred_total(increments)), None


def _normalised_last(x, norm, scale):
    """(x / its row sum [R, S], its log-scale [R]) of the loop's last carry (rows without mass: sum 1)."""
    norm = jnp.where(norm > 0, norm, 1.0)
    return x * (1.0 / norm)[:, None], scale + jnp.log(norm)


def _scaled_gamma(lat: CtcLattice, tables, log_z):
    """gamma [B, T, S] from the scaled tables, before the per-frame renormalisation."""
    table, scale, row_offset = tables       # [T, R, S + 1], [T, R] log-scales, [T, R] offsets (loop order)
    batch, _, _, states = lat.shape
    alpha = jnp.swapaxes(table[:, :batch, :states], 0, 1)                          # [B, T, S]
    beta = jnp.swapaxes(table[::-1, batch:, states - 1::-1], 0, 1)
    # forward values lack the running sum of column S, backward values that minus their step's offset
    log_factor = (scale[:, :batch].T + (scale[::-1, batch:] - row_offset[::-1, batch:]).T
                  - jnp.where(jnp.isfinite(log_z), log_z, 0.0)[:, None])
    # the factor is split over both tables so that neither the factors nor the product overflow
    half = jnp.exp(jnp.clip(0.5 * log_factor, -80.0, 80.0))[:, :, None]
    return jnp.minimum((alpha * half) * (beta * half), 1e30)


def scaled_occupancy(lat: CtcLattice, tables, log_z):
    """State occupancies gamma [B, T, S] from the tables of `run_scaled`, renormalised over s
    within each frame (`normalise_over_states`)."""
    return normalise_over_states(lat, _scaled_gamma(lat, tables, log_z), log_z)


def scaled_parts(lat: CtcLattice, tables, log_z):
    """(label [B, T, N], blank [B, T]) occupancies from the tables of `run_scaled`: the
    renormalised occupancies of the label states and the sum over the blank states, with the
    frame's total and blank sum from one [S, 2] matrix product (0 where `usable_inverse` is 0)."""
    gamma = _scaled_gamma(lat, tables, log_z)
    states = gamma.shape[-1]
    weights = jnp.stack([jnp.ones((states,), jnp.float32),
                         (jnp.arange(states) % 2 == 0).astype(jnp.float32)], axis=1)        # [S, 2]
    sums = jnp.dot(gamma, weights, precision=jax.lax.Precision.HIGHEST)                # [B, T, 2]
    inv_total = usable_inverse(lat, sums[..., 0], log_z)
    usable = inv_total > 0    # (gamma of unusable frames may be inf or NaN: select, not multiply)
    return (jnp.where(usable[:, :, None], gamma[:, :, 1::2] * inv_total[:, :, None], 0.0),
            jnp.where(usable, sums[..., 1] * inv_total, 0.0))
