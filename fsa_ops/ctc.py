"""Dense CTC forward-backward with an analytic gradient (jax + numpy only).

CTC is the lattice whose states are the blank-extended label sequence
``ext = [blank, y1, blank, y2, ..., yL, blank]`` (S = 2N+1 positions for N padded labels).
A path stays on a state, moves one state on, or skips the blank between two different labels.

How it is computed (probability semiring; log-domain results):
  * The emission table ``lp[b, t, s] = log p(ext[b, s] | frame t)`` [B, T, S] is gathered once from
    the logits (a row-wise gather of S columns per frame, never a one-hot product over K).
  * Forward (alpha) and backward (beta) recursions run in ONE loop over frames on a [2B, S]
    array: rows 0..B-1 consume frame t (taking mass from states s-1, s-2), rows B..2B-1 consume
    frame T-1-t (taking mass from s+1, s+2). The per-frame work is one function,
    ``log_ctc_step`` (or ``scaled_ctc_step``), the unit a GPU kernel can replace.
  * ``method='log'`` is the exact log-semiring recursion (three-way logsumexp), with
    each row shifted to max 0 every frame (the offsets are summed apart), so float32 keeps its
    absolute precision for T in the thousands. ``method='scaled'`` runs on probabilities
    renormalised every frame (multiply-add in the loop, no exp/log per state); its range between
    states within a frame is ~80 nats, and that is NOT only a matter of extreme logits: with long
    label sequences and uninformative logits (an untrained model) the states that the best
    complete paths pass through often sit >80 nats below the frame's best prefix, and 'scaled'
    then loses most of the mass (measured: 5-70 nats wrong on the bench shapes with K >= 500).
    ``method='auto'`` runs 'scaled', checks that the totals from alpha and from beta agree and that
    no alignable sequence lost its mass, and otherwise recomputes the batch with 'log'
    (``lax.cond``); it is exact, and fast when 'scaled' suffices (short or confident sequences).
    The default (method=None, `default_method`) is 'auto' for vocabularies up to 128 classes, where
    the loop dominates, and 'log' above, where it does not and 'auto' would risk paying twice.
  * Exponentials of arguments below -80 are flushed to 0: float32 subnormals are ~50x slower on
    x86 and such terms cannot change a sum that contains exp(0) = 1.
  * The gradient (``jax.custom_vjp``) needs no further recursion: the occupancies
    ``gamma[t, s] ~ alpha_post[t, s] * beta_incl[t, s] / p(ext[s] | t)``, normalised over s within
    each frame (where they sum to 1, so no large log-scale enters), come from the stored tables and
    are scatter-added onto the label ids. Memory is O(B*T*(2N+1)) besides the [B, T, K] gradient.

Conventions: ``logit_paddings`` / ``label_paddings`` are optax-style (1.0 = padded, 0.0 = valid).
Padded frames may sit anywhere (they are skipped, as in optax); labels must be right-padded.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
    "ctc_nll",
    "ctc_forward_backward",
    "ctc_occupancy",
    "check_ctc_inputs",
    "scaled_ctc_step",
    "log_ctc_step",
    "METHODS",
    "default_method",
]

METHODS = ("auto", "scaled", "log")
# method=None picks 'auto' up to this vocabulary size, 'log' above (see `default_method`).
_SMALL_VOCABULARY = 128

# 'auto' falls back to the log recursion when |logZ_alpha - logZ_beta| exceeds this
# (absolute nats + relative part for very long sequences, where float32 scale sums round).
_AUTO_ABS_TOL = 1e-4
_AUTO_REL_TOL = 1e-6


# --------------------------------------------------------------------------------------------
# Input checks
# --------------------------------------------------------------------------------------------
def _is_concrete(x) -> bool:
    return not isinstance(x, jax.core.Tracer)


def check_ctc_inputs(logits, logit_paddings, labels, label_paddings, blank_id: int) -> None:
    """Raises ValueError/TypeError naming the bad input. Value checks run only on concrete arrays.

    Shapes: logits [B, T, K] float, logit_paddings [B, T], labels [B, N] int, label_paddings [B, N].
    Values (when not traced): paddings in {0, 1}; label_paddings right-padded (0...0 1...1);
    valid labels in [0, K) and != blank_id; 0 <= blank_id < K.
    """
    if getattr(logits, "ndim", None) != 3:
        raise ValueError(f"logits must have shape [B, T, K]; got shape {getattr(logits, 'shape', None)}")
    if not jnp.issubdtype(logits.dtype, jnp.floating):
        raise TypeError(f"logits must be floating point; got dtype {logits.dtype}")
    batch, frames, classes = logits.shape
    if getattr(logit_paddings, "shape", None) != (batch, frames):
        raise ValueError(f"logit_paddings must have shape [B, T] = {(batch, frames)}; "
                         f"got {getattr(logit_paddings, 'shape', None)}")
    if getattr(labels, "ndim", None) != 2 or labels.shape[0] != batch:
        raise ValueError(f"labels must have shape [B, N] with B = {batch}; "
                         f"got {getattr(labels, 'shape', None)}")
    if not jnp.issubdtype(labels.dtype, jnp.integer):
        raise TypeError(f"labels must be integers; got dtype {labels.dtype}")
    if getattr(label_paddings, "shape", None) != labels.shape:
        raise ValueError(f"label_paddings must have the shape of labels {labels.shape}; "
                         f"got {getattr(label_paddings, 'shape', None)}")
    if not isinstance(blank_id, (int, np.integer)) or not 0 <= int(blank_id) < classes:
        raise ValueError(f"blank_id must be a Python int in [0, K={classes}); got {blank_id!r}")

    if _is_concrete(logit_paddings):
        lp = np.asarray(logit_paddings)
        if lp.size and not np.all((lp == 0) | (lp == 1)):
            raise ValueError("logit_paddings must contain only 0.0 (valid) and 1.0 (padded)")
    if _is_concrete(label_paddings):
        pads = np.asarray(label_paddings)
        if pads.size and not np.all((pads == 0) | (pads == 1)):
            raise ValueError("label_paddings must contain only 0.0 (valid) and 1.0 (padded)")
        if pads.shape[1] > 1 and np.any(np.diff(pads, axis=1) < 0):
            bad = int(np.nonzero(np.any(np.diff(pads, axis=1) < 0, axis=1))[0][0])
            raise ValueError(f"label_paddings must be right-padded (0...0 then 1...1); row {bad} is not")
        if _is_concrete(labels):
            lab = np.asarray(labels)
            valid = pads == 0
            out_of_range = valid & ((lab < 0) | (lab >= classes))
            if np.any(out_of_range):
                b, n = map(int, np.argwhere(out_of_range)[0])
                raise ValueError(f"labels[{b}, {n}] = {int(lab[b, n])} is outside [0, K={classes})")
            is_blank = valid & (lab == blank_id)
            if np.any(is_blank):
                b, n = map(int, np.argwhere(is_blank)[0])
                raise ValueError(f"labels[{b}, {n}] equals blank_id={blank_id} inside the valid "
                                 "label region; the blank cannot be a target label")


# --------------------------------------------------------------------------------------------
# Per-frame steps. Rows R = 2B: rows 0..B-1 run the forward (alpha) recursion over frames
# 0..T-1, rows B..2B-1 the backward (beta) recursion over frames T-1..0 of the same sequences.
# Both live on the same [R, S] array: forward rows take mass from states s-1 and s-2, backward
# rows from s+1 and s+2 (`forward_row` selects the direction, `skip` allows the two-state move).
# --------------------------------------------------------------------------------------------
def _shift(x, by: int, fill):
    """x[..., s - by] (by > 0) or x[..., s + |by|] (by < 0), `fill` shifted in (static `by`)."""
    pad = jnp.full(x.shape[:-1] + (abs(by),), fill, x.dtype)
    if by > 0:
        return jnp.concatenate([pad, x[..., :-by]], axis=-1)
    return jnp.concatenate([x[..., -by:], pad], axis=-1)


# exp(x) for x <= 0 that returns exactly 0 below exp(-80) ~ 1.8e-35 instead of a float32 subnormal:
# subnormal arithmetic is ~50x slower on x86 CPUs (XLA does not flush them), and terms this small
# do not change a sum that contains exp(0) = 1.
_EXP_FLOOR = -80.0


_TINY = float(np.exp(_EXP_FLOOR))


def _exp_nonpositive(x):
    return jnp.where(x > _EXP_FLOOR, jnp.exp(jnp.maximum(x, _EXP_FLOOR)), 0.0)


def _predecessors(x, forward_row, skip, fill):
    """The three incoming values of every state: x[s], x[s -+ 1], x[s -+ 2] (or `fill`)."""
    one = jnp.where(forward_row, _shift(x, 1, fill), _shift(x, -1, fill))
    two = jnp.where(skip, jnp.where(forward_row, _shift(x, 2, fill), _shift(x, -2, fill)), fill)
    return x, one, two


def log_ctc_step(log_alpha, lp, valid, forward_row, skip):
    """One CTC frame in the log semiring, renormalised (exact range; -inf = impossible).

    log_alpha [R, S] float32 (max 0, or all -inf once no path is left); lp [R, S] log-probabilities
    of the states' symbols at this frame (-inf on padding states); valid [R] bool (False: padded
    frame, nothing changes); forward_row [R, 1] bool; skip [R, S] bool.
    Returns (new_log_alpha [R, S], offset [R]): logsumexp over the (up to three) predecessors + lp,
    minus its row maximum `offset` (0 on padded frames). Keeping the values near 0 keeps float32's
    absolute precision (the offsets are summed separately), which matters for long inputs.
    """
    x0, x1, x2 = _predecessors(log_alpha, forward_row, skip, jnp.float32(-jnp.inf))
    top = jnp.maximum(jnp.maximum(x0, x1), x2)
    top = jnp.where(jnp.isfinite(top), top, 0.0)
    post = top + jnp.log(_exp_nonpositive(x0 - top) + _exp_nonpositive(x1 - top) + _exp_nonpositive(x2 - top)) + lp
    offset = jnp.max(post, axis=-1)
    offset = jnp.where(valid & jnp.isfinite(offset), offset, 0.0)
    return jnp.where(valid[:, None], post - offset[:, None], log_alpha), offset


def scaled_ctc_step(alpha, emit, valid, forward_row, skip):
    """One CTC frame in the probability semiring, renormalised (multiply-add, no exp/log per state).

    alpha [R, S] float32 (max 1, or all 0 once no path is left); emit [R, S] = exp(lp - shift)
    (0 on padding states); valid, forward_row, skip as in `log_ctc_step`.
    Returns (new_alpha [R, S], norm [R]): new_alpha * norm is the unnormalised score
    (norm = 1 on padded frames and for rows without mass).
    """
    x0, x1, x2 = _predecessors(alpha, forward_row, skip, jnp.float32(0.0))
    post = (x0 + x1 + x2) * emit
    norm = jnp.max(post, axis=-1)
    norm = jnp.where(valid & (norm > 0), norm, 1.0)
    new_alpha = post * (1.0 / norm)[:, None]
    new_alpha = jnp.where(new_alpha > _TINY, new_alpha, 0.0)   # no subnormals (see _exp_nonpositive)
    return jnp.where(valid[:, None], new_alpha, alpha), norm


# --------------------------------------------------------------------------------------------
# Lattice set-up
# --------------------------------------------------------------------------------------------
def _extended_labels(labels, label_lengths, blank_id):
    """[B, N] labels -> ext [B, 2N+1] (blank-interleaved; padded positions hold the blank)."""
    batch, max_labels = labels.shape
    positions = jnp.arange(max_labels)[None, :]
    labels = jnp.where(positions < label_lengths[:, None], labels, blank_id)
    blanks = jnp.full_like(labels, blank_id)
    ext = jnp.stack([blanks, labels], axis=-1).reshape(batch, 2 * max_labels)
    return jnp.concatenate([ext, jnp.full((batch, 1), blank_id, labels.dtype)], axis=-1)


class _Lattice:
    """Static-shape CTC lattice of a padded batch: emission table and the masks of R = 2B rows."""

    def __init__(self, logits, logit_paddings, labels, label_paddings, blank_id, log_probs, emissions=None):
        batch, frames, classes = logits.shape
        max_labels = labels.shape[1]
        states = 2 * max_labels + 1
        self.shape = (batch, frames, classes, states)
        labels = labels.astype(jnp.int32)
        label_lengths = jnp.sum(label_paddings < 0.5, axis=1).astype(jnp.int32)
        self.frame_valid = logit_paddings < 0.5                                   # [B, T]
        num_states = 2 * label_lengths + 1                                        # [B]
        self.ext = _extended_labels(labels, label_lengths, blank_id)              # [B, S]
        state_ids = jnp.arange(states)[None, :]
        self.state_valid = state_ids < num_states[:, None]                        # [B, S]
        # skip[s]: s may be entered from s-2 (ext[s] is a label different from ext[s-2]).
        skip = (self.ext != blank_id) & (self.ext != _shift(self.ext, 2, blank_id))
        self.skip = jnp.concatenate([skip, _shift(skip, -2, False)], axis=0)        # [R, S]
        self.forward_row = (jnp.arange(2 * batch) < batch)[:, None]               # [R, 1]
        last = num_states[:, None] - 1
        self.start = jnp.concatenate([jnp.broadcast_to(state_ids == 0, (batch, states)), state_ids == last],
                                     axis=0)                                      # [R, S]
        self.final = jnp.concatenate([(state_ids == last) | (state_ids == last - 1),
                                      (state_ids <= 1) & self.state_valid], axis=0)
        # Structural feasibility: frames >= labels + adjacent repeats.
        positions = jnp.arange(max_labels)[None, :]
        if max_labels > 1:
            repeats = jnp.sum((labels[:, 1:] == labels[:, :-1]) & (positions[:, 1:] < label_lengths[:, None]),
                              axis=1)
        else:
            repeats = jnp.zeros((batch,), jnp.int32)
        self.feasible = jnp.sum(self.frame_valid, axis=1) >= label_lengths + repeats
        # Labels that the gather would silently clamp (only detectable on device under jit).
        valid_labels = positions < label_lengths[:, None]
        self.bad_labels = jnp.any(valid_labels & ((labels < 0) | (labels >= classes) | (labels == blank_id)),
                                  axis=1)
        # Emission table lp[b, t, s] = log p(ext[b, s] | t) in float32, -inf on padding states.
        if emissions is not None:  # (lp, log_norm) kept from the forward pass
            self.lp, self.log_norm = emissions
            return
        if log_probs:
            self.log_norm = jnp.zeros((batch, frames), jnp.float32)
        else:
            self.log_norm = jax.nn.logsumexp(logits.astype(jnp.float32), axis=-1)
            self.log_norm = jnp.where(jnp.isfinite(self.log_norm), self.log_norm, 0.0)
        # Row-wise gather on the flattened [B*T, K] logits (keeps the [B, T, S] layout contiguous).
        ids = jnp.broadcast_to(jnp.clip(self.ext, 0, classes - 1)[:, None, :], (batch, frames, states))
        gathered = jnp.take_along_axis(logits.reshape(batch * frames, classes),
                                       ids.reshape(batch * frames, states), axis=1,
                                       mode="promise_in_bounds").reshape(batch, frames, states)
        lp = gathered.astype(jnp.float32) - self.log_norm[:, :, None]
        self.lp = jnp.where(self.state_valid[:, None, :], lp, -jnp.inf)           # [B, T, S]


# --------------------------------------------------------------------------------------------
# The recursions. Both return (alpha [B, T, S], beta [B, T, S], log_scale [R, T], log_z [R]):
#   'log':    alpha = log alpha_post (forward score including frame t), beta = log beta_incl
#             (backward score of frames t..T-1 from state s, including frame t); log_scale = 0.
#   'scaled': the same as probabilities, each frame renormalised: log alpha_post[b, t] =
#             log(alpha[b, t]) + sum_{t' <= t} log_scale[b, t'] (beta: sum over t' >= t of row B+b).
# log_z: total log-likelihood per row (rows b and B+b compute it independently).
# --------------------------------------------------------------------------------------------
def _run_log(lat: _Lattice, unroll: int):
    init = jnp.where(lat.start, 0.0, -jnp.inf).astype(jnp.float32)
    last, (alpha, beta, log_scale) = _frame_loop(log_ctc_step, init, lat.lp, lat, unroll)
    log_z = jax.nn.logsumexp(jnp.where(lat.final, last, -jnp.inf), axis=-1) + jnp.sum(log_scale, axis=-1)
    return alpha, beta, log_scale, log_z


def _run_scaled(lat: _Lattice, unroll: int):
    # Per-frame shift so that the largest valid emission of each frame is exp(0) = 1.
    shift = jnp.max(lat.lp, axis=-1)                                              # [B, T]
    shift = jnp.where(jnp.isfinite(shift) & lat.frame_valid, shift, 0.0)
    emit = _exp_nonpositive(lat.lp - shift[:, :, None])
    last, (alpha, beta, norm) = _frame_loop(scaled_ctc_step, lat.start.astype(jnp.float32), emit, lat, unroll)
    log_scale = jnp.log(norm) + jnp.concatenate([shift, shift], axis=0)
    log_z = jnp.log(jnp.sum(jnp.where(lat.final, last, 0.0), axis=-1)) + jnp.sum(log_scale, axis=-1)
    return alpha, beta, log_scale, log_z


def _frame_loop(step, init, table, lat: _Lattice, unroll: int):
    """Runs `step(carry, frame [R, S], valid [R], forward_row, skip) -> (carry, norm [R])` over
    frames: forward rows read frame t, backward rows frame T-1-t of `table` [B, T, S]; carries and
    norms are written back at those frames (no reversed copies are made)."""
    batch, frames, _, states = lat.shape
    valid = lat.frame_valid
    outs = (jnp.zeros((batch, frames, states), jnp.float32), jnp.zeros((batch, frames, states), jnp.float32),
            jnp.ones((batch, frames), jnp.float32), jnp.ones((batch, frames), jnp.float32))

    def at(x, t):
        return jax.lax.dynamic_index_in_dim(x, t, axis=1, keepdims=False)

    def put(x, value, t):
        return jax.lax.dynamic_update_index_in_dim(x, value, t, axis=1)

    def body(t, state):
        carry, (alpha, beta, norm_f, norm_b) = state
        back = frames - 1 - t
        frame = jnp.concatenate([at(table, t), at(table, back)], axis=0)
        frame_valid = jnp.concatenate([at(valid, t), at(valid, back)], axis=0)
        carry, norm = step(carry, frame, frame_valid, lat.forward_row, lat.skip)
        return carry, (put(alpha, carry[:batch], t), put(beta, carry[batch:], back),
                       put(norm_f, norm[:batch], t), put(norm_b, norm[batch:], back))

    last, (alpha, beta, norm_f, norm_b) = jax.lax.fori_loop(0, frames, body, (init, outs), unroll=unroll)
    return last, (alpha, beta, jnp.concatenate([norm_f, norm_b], axis=0))


def _needs_log_recursion(lat: _Lattice, log_z):
    """[B] bool: the scaled recursion lost mass (alpha/beta totals disagree or vanished)."""
    batch = lat.shape[0]
    forward, backward = log_z[:batch], log_z[batch:]
    both_finite = jnp.isfinite(forward) & jnp.isfinite(backward)
    gap = jnp.abs(jnp.where(both_finite, forward - backward, 0.0))
    tol = _AUTO_ABS_TOL + _AUTO_REL_TOL * jnp.abs(jnp.where(both_finite, forward, 0.0))
    disagree = (jnp.isfinite(forward) != jnp.isfinite(backward)) | (gap > tol)
    vanished = lat.feasible & ~both_finite
    return disagree | vanished


def ctc_forward_backward(logits, logit_paddings, labels, label_paddings, blank_id: int = 0, *,
                         log_probs: bool = False, method: str = "log", unroll: int = 1):
    """Runs the fused forward-backward recursion (no input checks; see `ctc_nll`).

    Returns (lattice, (alpha [B, T, S], beta [B, T, S], log_scale [2B, T]), log_z [B], used_log []):
    see `_run_log` / `_run_scaled` for the tables' meaning; log_z is the total log-likelihood
    (-inf when no alignment fits). With method='auto', used_log says that the scaled run lost mass:
    log_z then comes from the log recursion, the tables stay those of the scaled run and
    `ctc_occupancy` recomputes them (so only [B] values, not tables, pass through `lax.cond`).
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}; got {method!r}")
    lat = _Lattice(logits, logit_paddings, labels, label_paddings, blank_id, log_probs)
    batch = lat.shape[0]
    if method == "log":
        alpha, beta, log_scale, log_z = _run_log(lat, unroll)
        used_log = jnp.array(True)
    else:
        alpha, beta, log_scale, log_z = _run_scaled(lat, unroll)
        used_log = jnp.array(False)
        if method == "auto":
            used_log = jnp.any(_needs_log_recursion(lat, log_z))
            log_z = jax.lax.cond(used_log, lambda: _run_log(lat, unroll)[3], lambda: log_z)
    log_z = jnp.where(lat.feasible, log_z[:batch], -jnp.inf)
    return lat, (alpha, beta, log_scale), log_z, used_log


def ctc_occupancy(lat: _Lattice, tables, log_z, used_log, method: str = "log", unroll: int = 1):
    """State occupancies gamma [B, T, S] = P(the path is in state s at frame t): 0 on padded frames,
    padding states and sequences with log_z = -inf. `tables`, `log_z`, `used_log` as returned by
    `ctc_forward_backward` with the same `method`.

    gamma[t] = alpha_post[t] * beta_incl[t] / p(emission at t), normalised over s within each frame
    (it sums to 1 there), so the per-frame scales of the tables cancel and no large cumulative
    log-scale enters: the result keeps float32 precision for any T.
    """
    if method == "auto":
        return jax.lax.cond(
            used_log,
            lambda: _occupancy(lat, _run_log(lat, unroll)[:3], log_z, log_domain=True),
            lambda: _occupancy(lat, tables, log_z, log_domain=False))
    return _occupancy(lat, tables, log_z, log_domain=(method == "log"))


def _occupancy(lat: _Lattice, tables, log_z, log_domain: bool):
    alpha, beta, _ = tables
    log_alpha = alpha if log_domain else jnp.log(alpha)
    log_beta = beta if log_domain else jnp.log(beta)
    keep = lat.frame_valid[:, :, None] & jnp.isfinite(lat.lp)
    scores = jnp.where(keep, log_alpha + log_beta - jnp.where(keep, lat.lp, 0.0), -jnp.inf)
    top = jnp.max(scores, axis=-1, keepdims=True)
    top = jnp.where(jnp.isfinite(top), top, 0.0)
    unnormalised = _exp_nonpositive(scores - top)
    total = jnp.sum(unnormalised, axis=-1, keepdims=True)
    usable = jnp.isfinite(log_z)[:, None, None] & (total > 0)
    return jnp.where(usable, unnormalised / jnp.where(usable, total, 1.0), 0.0)


# --------------------------------------------------------------------------------------------
# Negative log-likelihood with analytic gradient
# --------------------------------------------------------------------------------------------
def _nll_from(lat: _Lattice, log_z):
    nll = jnp.where(jnp.isfinite(log_z), -log_z, jnp.inf)
    return jnp.where(lat.bad_labels, jnp.nan, nll)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6, 7))
def _ctc_nll(logits, logit_paddings, labels, label_paddings, blank_id, log_probs, method, unroll):
    lat, _, log_z, _ = ctc_forward_backward(logits, logit_paddings, labels, label_paddings, blank_id,
                                               log_probs=log_probs, method=method, unroll=unroll)
    return _nll_from(lat, log_z)


def _ctc_nll_fwd(logits, logit_paddings, labels, label_paddings, blank_id, log_probs, method, unroll):
    lat, tables, log_z, used_log = ctc_forward_backward(
        logits, logit_paddings, labels, label_paddings, blank_id,
        log_probs=log_probs, method=method, unroll=unroll)
    residuals = (logits, logit_paddings, labels, label_paddings, (lat.lp, lat.log_norm),
                 tables, log_z, used_log)
    return _nll_from(lat, log_z), residuals


def _ctc_nll_bwd(blank_id, log_probs, method, unroll, residuals, upstream):
    logits, logit_paddings, labels, label_paddings, emissions, tables, log_z, used_log = residuals
    lat = _Lattice(logits, logit_paddings, labels, label_paddings, blank_id, log_probs, emissions)
    batch, frames, classes, _ = lat.shape
    occupancy = ctc_occupancy(lat, tables, log_z, used_log, method, unroll)      # [B, T, S]
    scale = jnp.where(jnp.isfinite(log_z), upstream.astype(jnp.float32), 0.0)[:, None, None]
    # d nll / d logits = softmax * g - g * occupancy scattered onto the class ids. Blank states (even)
    # sum into the blank column inside the elementwise pass; label states (odd) are scatter-added
    # to their ids (repeated ids add up). With log_probs the softmax term is absent.
    blank_occ = jnp.sum(occupancy[:, :, 0::2], axis=-1)                              # [B, T]
    is_blank = (jnp.arange(classes) == blank_id)[None, None, :]
    grad = -scale * jnp.where(is_blank, blank_occ[:, :, None], 0.0)
    if not log_probs:
        probs = jnp.exp(logits.astype(jnp.float32) - lat.log_norm[:, :, None])
        grad = grad + jnp.where(lat.frame_valid[:, :, None], probs * scale, 0.0)
    if labels.shape[1]:
        ids = jnp.clip(lat.ext[:, 1::2], 0, classes - 1)                          # [B, N]
        label_occ = jnp.transpose(-scale * occupancy[:, :, 1::2], (0, 2, 1))      # [B, N, T]
        grad = grad.at[jnp.arange(batch)[:, None], :, ids].add(label_occ, mode="promise_in_bounds")
    return grad.astype(logits.dtype), None, None, None


_ctc_nll.defvjp(_ctc_nll_fwd, _ctc_nll_bwd)


def default_method(num_classes: int) -> str:
    """The recursion used when method=None, from the vocabulary size K (both choices are exact).

    Small K: the per-frame loop dominates and the rescaled recursion (with the exact log fallback,
    'auto') is several times faster. Large K: the O(B*T*K) softmax, gather and gradient dominate,
    the conversions in and out of the probability domain cost what the cheaper loop saves, and
    long label sequences with uninformative logits make 'auto' fall back (paying twice), so 'log'.
    """
    return "auto" if num_classes <= _SMALL_VOCABULARY else "log"


def ctc_nll(logits, logit_paddings, labels, label_paddings, blank_id: int = 0, *,
            log_probs: bool = False, method: str | None = None, unroll: int = 1):
    """Per-sequence CTC negative log-likelihood [B] (probability semiring), differentiable in logits.

    logits [B, T, K] (any float dtype; accumulation in float32, gradient in the input dtype),
    logit_paddings [B, T] (1.0 = padded frame, skipped wherever it is), labels [B, N] int,
    label_paddings [B, N] (right-padded). log_probs=True: logits are already log-normalised.
    Returns +inf for a sequence that no alignment fits (its gradient is 0), NaN for a row whose
    valid labels are out of [0, K) or equal to blank_id (an error instead on concrete inputs).
    method: 'auto' | 'scaled' | 'log' (see the module docstring), or None for `default_method(K)`;
    unroll: frames per loop step.
    """
    check_ctc_inputs(logits, logit_paddings, labels, label_paddings, blank_id)
    if method is None:
        method = default_method(logits.shape[-1])
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}; got {method!r}")
    return _ctc_nll(logits, jnp.asarray(logit_paddings), jnp.asarray(labels), jnp.asarray(label_paddings),
                    int(blank_id), bool(log_probs), method, int(unroll))
