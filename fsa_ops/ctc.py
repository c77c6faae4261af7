"""Dense CTC forward-backward with an analytic gradient (jax + numpy only).

CTC is the lattice whose states are the blank-extended label sequence
``ext = [blank, y1, blank, y2, ..., yL, blank]`` (S = 2N+1 positions for N padded labels).
A path stays on a state, moves one state on, or skips the blank between two different labels.

How it is computed (probability semiring; log-domain results):
  * The emission table ``lp[b, t, s] = log p(ext[b, s] | frame t)`` [B, T, S] is gathered once from
    the logits (a row-wise gather of S columns per frame, never a one-hot product over K).
  * Forward (alpha) and backward (beta) recursions run in ONE loop over frames on a [2B, S]
    array: rows 0..B-1 consume frame t, rows B..2B-1 consume frame T-1-t with their states stored
    in reverse order, so that every row takes mass from positions p-1 and p-2 and one step function
    serves both directions (``log_ctc_step`` / ``scaled_ctc_step``: the unit a GPU kernel can
    replace). Each loop iteration runs a block of `block` frames (default 1) and renormalises
    once at its end; the removed log-scales are kept apart.
  * ``method='log'`` is the exact log-semiring recursion (three-way logsumexp); float32 keeps its
    absolute precision for T in the thousands because every block is shifted back to max 0.
    ``method='scaled'`` runs on probabilities (multiply-add in the loop, no exp/log per state);
    its range between states within a frame is ~80 nats, and that is NOT only a matter of extreme
    logits: with long label sequences and uninformative logits (an untrained model) the states
    that the best complete paths pass through often sit >80 nats below the frame's best prefix,
    and 'scaled' then loses most of the mass (measured: 5-70 nats wrong on the bench shapes with
    K >= 500). ``method='auto'`` runs 'scaled', checks that the totals from alpha and from beta
    agree, that no alignable sequence lost its mass and that no emission of a valid state was
    flushed (that one loses the same paths in both directions), and otherwise recomputes the
    batch with 'log' (``lax.cond``); it is exact, and fast when 'scaled' suffices (short or confident
    sequences). The default (method=None, `default_method`) is 'auto' for vocabularies up to 128
    classes and 'log' above.
  * Exponentials of arguments below -80 are flushed to 0: float32 subnormals are ~50x slower on
    x86 and such terms cannot change a sum that contains exp(0) = 1.
  * 'scaled' in detail (`_run_scaled`): emissions are ``exp(x - max_k x)`` gathered straight into
    the loop's time-major order [T, 2B, S] (the frame's log-normaliser is added to a log-scale
    instead of dividing), each row's emissions are divided by their sum, and every block of frames
    starts by dividing the carried row by its row sum (a matrix-vector product: on CPU much cheaper than a
    reduction). The loop stores one [T, 2B, S+1] table: forward rows' new values, backward rows'
    incoming sums, and each step's log-scale increment as column S; it writes it over the gathered
    emission rows (gathered with a spare column S), each frame after reading it, so that no
    zero-filled output buffer is made (at (32, 250, 32, 60) ~10% of the call). One prefix sum
    after the loop turns the increments into log-scales.
  * The gradient (``jax.custom_vjp``) needs no further recursion: the loop stores alpha (including
    frame t) and beta before frame t's emission, so the occupancies are
    ``gamma[t, s] = alpha[t, s] * beta_excl[t, s] / Z``; the tables' log-scales are put back per
    frame (split over both factors, so that neither overflows) and gamma is renormalised over s
    within each frame (where it sums to 1), so that the rounding of long running sums cancels.
    Blank occupancies are summed into the blank column, label occupancies scatter-added onto the
    label ids. Memory is O(B*T*(2N+1)) besides the [B, T, K] gradient.

Conventions: ``logit_paddings`` / ``label_paddings`` are optax-style (1.0 = padded, 0.0 = valid).
Padded frames may sit anywhere (they are skipped, as in optax); labels must be right-padded.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
    "DEFAULT_BLOCK",
    "ctc_nll",
    "ctc_forward_backward",
    "ctc_occupancy",
    "check_ctc_inputs",
    "scaled_ctc_step",
    "log_ctc_step",
    "log_renormalise",
    "METHODS",
    "default_method",
]

METHODS = ("auto", "scaled", "log")
# Frames per loop iteration (renormalised once per block); see `ctc_nll`'s `block`. Measured on
# 2 CPU cores (bench shapes): blocks of 2-8 frames do not pay (XLA fuses or serialises the chained
# steps), so one frame per iteration is the default; larger blocks stay available.
DEFAULT_BLOCK = 1
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
# 0..T-1, rows B..2B-1 the backward (beta) recursion over frames T-1..0 of the same sequences,
# with their states stored in reverse order (recursion position S-1-s holds state s). In those
# coordinates every row takes mass from positions p-1 and p-2, so one step serves both directions
# with no per-row select; `skip` [R, S] says where the two-position move is allowed. The steps do
# not renormalise: 'log' calls `log_renormalise` once per block of frames, 'scaled' divides by the
# row sum at the start of each block inside `_scaled_loop`.
# --------------------------------------------------------------------------------------------
def _shift(x, by: int, fill):
    """x[..., s - by] (by > 0) or x[..., s + |by|] (by < 0), `fill` shifted in (static `by`)."""
    pad = jnp.full(x.shape[:-1] + (abs(by),), fill, x.dtype)
    if by > 0:
        return jnp.concatenate([pad, x[..., :-by]], axis=-1)
    return jnp.concatenate([x[..., -by:], pad], axis=-1)


# exp(x) that returns exactly 0 below exp(-80) ~ 1.8e-35 instead of a float32 subnormal:
# subnormal arithmetic is ~50x slower on x86 CPUs (XLA does not flush them), and terms this small
# do not change a sum that contains exp(0) = 1.
_EXP_FLOOR = -80.0


_TINY = float(np.exp(_EXP_FLOOR))


def _exp_nonpositive(x):
    return jnp.where(x > _EXP_FLOOR, jnp.exp(jnp.maximum(x, _EXP_FLOOR)), 0.0)


def log_ctc_step(log_alpha, lp, valid, skip):
    """One CTC frame in the log semiring (-inf = impossible).

    log_alpha [R, S] float32; lp [R, S] log-probabilities of the positions' symbols at this frame
    (-inf on padding states); valid [R] bool (False: padded frame, the row does not change);
    skip [R, S] bool (position p may be entered from p-2).
    Returns (new_log_alpha [R, S], incoming [R, S]): incoming = logsumexp of the (up to three)
    predecessors p, p-1, p-2; new = incoming + lp.
    """
    neg_inf = jnp.float32(-jnp.inf)
    x1 = _shift(log_alpha, 1, neg_inf)
    x2 = jnp.where(skip, _shift(log_alpha, 2, neg_inf), neg_inf)
    top = jnp.maximum(jnp.maximum(log_alpha, x1), x2)
    top = jnp.where(jnp.isfinite(top), top, 0.0)
    incoming = top + jnp.log(_exp_nonpositive(log_alpha - top) + _exp_nonpositive(x1 - top)
                             + _exp_nonpositive(x2 - top))
    return jnp.where(valid[:, None], incoming + lp, log_alpha), incoming


def log_renormalise(log_alpha):
    """Shifts every row to max 0: returns (log_alpha - offset, offset [R]) (offset 0 for rows
    without mass). Keeping the values near 0 keeps float32's absolute precision for long inputs."""
    offset = jnp.max(log_alpha, axis=-1)
    offset = jnp.where(jnp.isfinite(offset), offset, 0.0)
    return log_alpha - offset[:, None], offset


def scaled_ctc_step(alpha, emit, valid, skip):
    """One CTC frame in the probability semiring (multiply-add, no exp/log per state).

    alpha [R, S] float32 (>= 0); emit [R, S] = exp(lp - shift) (0 on padding states); valid, skip
    as in `log_ctc_step`. Returns (new_alpha [R, S], incoming [R, S]): incoming = sum of the
    predecessors, new_alpha = incoming * emit with values below exp(-80) flushed to 0.
    """
    incoming = alpha + _shift(alpha, 1, 0.0) + jnp.where(skip, _shift(alpha, 2, 0.0), 0.0)
    post = incoming * emit
    post = jnp.where(post > _TINY, post, 0.0)   # no subnormals (see _exp_nonpositive)
    return jnp.where(valid[:, None], post, alpha), incoming


# --------------------------------------------------------------------------------------------
# Lattice set-up
# --------------------------------------------------------------------------------------------
def _log_normaliser(logits, log_probs: bool):
    """[B, T] logsumexp of each frame's logits (0 with log_probs; 0 for frames without mass)."""
    if log_probs:
        return jnp.zeros(logits.shape[:2], jnp.float32)
    log_norm = jax.nn.logsumexp(logits.astype(jnp.float32), axis=-1)
    return jnp.where(jnp.isfinite(log_norm), log_norm, 0.0)


def _row_sum(x, weights=None):
    """Sum over the last axis as a matrix-vector product (on CPU much faster than a reduction over
    a short minor axis); `weights` [n] (default ones) weight the columns. float32, exact order
    aside."""
    if weights is None:
        weights = jnp.ones((x.shape[-1],), jnp.float32)
    return jnp.dot(x, weights, precision=jax.lax.Precision.HIGHEST)


# Up to this many frames a prefix sum over time is one product with a triangular matrix (one
# kernel; XLA's CPU cumsum is a chain of ~6 reduce-window/pad/slice kernels, ~40 us at T = 100).
_PREFIX_SUM_BY_PRODUCT = 512


def _prefix_sum(x):
    """Inclusive prefix sum over axis 0 of x [T, R] (float32).

    The product accumulates term by term, so its float32 rounding grows with the partial sums
    (log-scale increments of a few nats each reach |sum| ~ 1000 at T = 250, ~1e-3 nats off, and
    the forward and backward totals of 'auto' then disagree); each column's mean is taken out
    first and put back as (t + 1) * mean, so that the accumulated partial sums stay small.
    """
    frames = x.shape[0]
    if frames > _PREFIX_SUM_BY_PRODUCT:
        return jnp.cumsum(x, axis=0)
    highest = jax.lax.Precision.HIGHEST
    mean = jnp.dot(jnp.full((frames,), 1.0 / frames, jnp.float32), x, precision=highest)       # [R]
    steps = jnp.arange(1, frames + 1, dtype=jnp.float32)[:, None]
    lower = (jnp.arange(frames)[:, None] >= jnp.arange(frames)[None, :]).astype(jnp.float32)
    return jnp.dot(lower, x - mean, precision=highest) + steps * mean


def _extended_labels(labels, label_lengths, blank_id):
    """[B, N] labels -> ext [B, 2N+1] (blank-interleaved; padded positions hold the blank)."""
    batch, max_labels = labels.shape
    positions = jnp.arange(max_labels)[None, :]
    labels = jnp.where(positions < label_lengths[:, None], labels, blank_id)
    blanks = jnp.full_like(labels, blank_id)
    ext = jnp.stack([blanks, labels], axis=-1).reshape(batch, 2 * max_labels)
    return jnp.concatenate([ext, jnp.full((batch, 1), blank_id, labels.dtype)], axis=-1)


@jax.tree_util.register_pytree_node_class
class _Lattice:
    """Static-shape CTC lattice of a padded batch (a pytree, so the backward pass reuses it).

    frame_valid [B, T], ext [B, S], state_valid [B, S], feasible [B], bad_labels [B],
    log_norm [B, T] (logsumexp of the logits; 0 with log_probs); per-row masks skip, start,
    final [R, S] in recursion coordinates (backward rows state-reversed).
    """
    _FIELDS = ("frame_valid", "ext", "state_valid", "skip", "start", "final", "feasible", "bad_labels",
               "log_norm")

    def __init__(self, shape, **fields):
        self.shape = shape
        for name in self._FIELDS:
            setattr(self, name, fields[name])

    def tree_flatten(self):
        return tuple(getattr(self, name) for name in self._FIELDS), self.shape

    @classmethod
    def tree_unflatten(cls, shape, children):
        return cls(shape, **dict(zip(cls._FIELDS, children)))

    @classmethod
    def build(cls, logits, logit_paddings, labels, label_paddings, blank_id):
        """The lattice without log_norm (None until `with_log_norm`: each recursion computes it
        its own way)."""
        batch, frames, classes = logits.shape
        max_labels = labels.shape[1]
        states = 2 * max_labels + 1
        labels = labels.astype(jnp.int32)
        label_lengths = jnp.sum(label_paddings < 0.5, axis=1).astype(jnp.int32)
        frame_valid = logit_paddings < 0.5
        num_states = 2 * label_lengths + 1
        ext = _extended_labels(labels, label_lengths, blank_id)
        state_ids = jnp.arange(states)[None, :]
        state_valid = state_ids < num_states[:, None]
        # skip[s]: s may be entered from s-2 (ext[s] is a label different from ext[s-2]). Backward
        # rows move from s+2 to s when skip[s+2]; at reversed position p = S-1-s that is skip[S+1-p].
        skip = (ext != blank_id) & (ext != _shift(ext, 2, blank_id))
        last = num_states[:, None] - 1
        # Start: forward rows at state 0, backward rows at the last state (position S-1-last).
        # Final: forward rows end in the last label or the trailing blank, backward rows in 0 or 1.
        fields = dict(
            frame_valid=frame_valid, ext=ext, state_valid=state_valid,
            skip=jnp.concatenate([skip, _shift(skip, -2, False)[:, ::-1]], axis=0),
            start=jnp.concatenate([jnp.broadcast_to(state_ids == 0, (batch, states)),
                                   state_ids == states - 1 - last], axis=0),
            final=jnp.concatenate([(state_ids == last) | (state_ids == last - 1),
                                   ((state_ids <= 1) & state_valid)[:, ::-1]], axis=0))
        # Structural feasibility: frames >= labels + adjacent repeats.
        positions = jnp.arange(max_labels)[None, :]
        if max_labels > 1:
            repeats = jnp.sum((labels[:, 1:] == labels[:, :-1]) & (positions[:, 1:] < label_lengths[:, None]),
                              axis=1)
        else:
            repeats = jnp.zeros((batch,), jnp.int32)
        fields["feasible"] = jnp.sum(frame_valid, axis=1) >= label_lengths + repeats
        # Labels that the gather would silently clamp (only detectable on device under jit).
        valid_labels = positions < label_lengths[:, None]
        fields["bad_labels"] = jnp.any(valid_labels & ((labels < 0) | (labels >= classes) | (labels == blank_id)),
                                       axis=1)
        fields["log_norm"] = None
        return cls((batch, frames, classes, states), **fields)

    def with_log_norm(self, log_norm):
        fields = {name: getattr(self, name) for name in self._FIELDS}
        fields["log_norm"] = log_norm
        return _Lattice(self.shape, **fields)

    def emissions(self, logits):
        """lp [B, T, S] = log p(ext[b, s] | frame t) in float32 (-inf on padding states): a row-wise
        gather of S columns from each frame's K logits (never a one-hot product)."""
        batch, frames, classes, states = self.shape
        ids = jnp.broadcast_to(jnp.clip(self.ext, 0, classes - 1)[:, None, :], (batch, frames, states))
        gathered = jnp.take_along_axis(logits.reshape(batch * frames, classes),
                                       ids.reshape(batch * frames, states), axis=1,
                                       mode="promise_in_bounds").reshape(batch, frames, states)
        lp = gathered.astype(jnp.float32) - self.log_norm[:, :, None]
        return jnp.where(self.state_valid[:, None, :], lp, -jnp.inf)


# --------------------------------------------------------------------------------------------
# The recursions. Both return (tables, log_z [R]); log_z is the total log-likelihood per row (rows
# b and B+b compute it independently). The tables are method-specific (read them only through
# `ctc_occupancy`); both hold
#   alpha: forward score of frames 0..t ending in s (including frame t's emission);
#   beta:  backward score of frames t+1..T-1 from state s after frame t (frame t's emission
#          excluded),
# so that occupancies need no division by the emission: gamma[t, s] = alpha[t, s] * beta[t, s] / Z.
# 'log' (`_run_log`): (alpha [B, T, S], beta [B, T, S], scale_f [B, T], scale_b [B, T]) in natural
#   frame and state order, logs renormalised per block of frames: the true log value is
#   alpha[b, t] + sum_{t' <= t} scale_f[b, t'] and beta[b, t] + sum_{t' > t} scale_b[b, t'].
# 'scaled' (`_run_scaled`): (table [T, 2B, S+1], log_scale [T, 2B], row_offset [T, 2B]) in loop
#   order (see `_scaled_loop`).
# --------------------------------------------------------------------------------------------
def _run_log(lat: _Lattice, lp, block: int, store: bool = True):
    """store=False: only log_z is needed; tables is None (see `_frame_loop`)."""
    init = jnp.where(lat.start, 0.0, -jnp.inf).astype(jnp.float32)
    last, tables, scale_sum = _frame_loop(log_ctc_step, log_renormalise, init, lp, lat, block, store)
    log_z = jax.nn.logsumexp(jnp.where(lat.final, last, -jnp.inf), axis=-1) + scale_sum
    return tables, log_z


def _run_scaled(lat: _Lattice, logits, log_probs: bool, block: int, store: bool = True,
                mark_flushed: bool = False):
    """The rescaled recursion in one `lax.scan` over time-major rows (see `_scaled_loop`).

    Emissions are the logits' exponentials relative to each frame's largest logit,
    ``exp(x - max_k x)`` (so the largest is 1 and no division is needed); the frame's offset to
    the true log-probabilities, ``max_k x - log_norm`` (``-log sum_k exp(x - max_k x)``), is added
    to the row's log-scale inside the loop. Returns (tables, log_z [R], log_norm [B, T]):
    tables (store=True) = (table [T, R, S+1], log_scale [T, R], row_offset [T, R]) in loop
    coordinates: at step u, row b < B holds alpha of frame u (its emission included) and row B+b
    beta_excl of frame T-1-u with its states reversed; the true log value of a forward entry is
    log(table) + log_scale, of a backward entry log(table) + log_scale - row_offset (column S
    holds the loop's log-scale increments). None with store=False.
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
    else:
        total = jnp.sum(jnp.exp(x - top[:, :, None]), axis=-1)   # (a plain exp: fused into the sum)
        offset = -jnp.log(jnp.where(total > 0, total, 1.0))
        log_norm = top - offset
    # emissions gathered straight into loop order; padding states emit too (blank ids) but the
    # loop masks what enters them (`enter`), so that no masked copy of the table is made
    top_rows = jnp.concatenate([top.T, top[:, ::-1].T], axis=1)                       # [T, R]
    # (store: one spare column S, which the loop overwrites with the log-scale increments)
    relative = _time_major_gather(x, jnp.clip(lat.ext, 0, classes - 1), spare=store) - top_rows[:, :, None]
    rows = _exp_nonpositive(relative)
    valid = jnp.concatenate([lat.frame_valid.T, lat.frame_valid[:, ::-1].T], axis=1)  # [T, R]
    enter = jnp.concatenate([lat.state_valid, lat.state_valid[:, ::-1]], axis=0)
    if mark_flushed:
        # An emission more than 80 nats below its frame's best class is flushed to 0 in both
        # directions alike, so their totals agree even when a likely path needed it. Such entries
        # (of valid states and frames of feasible sequences; exact zeros from -inf logits are no
        # loss) are set to -1e30: the row total turns negative and its log NaN, and so does log_z
        # in both directions, which `_needs_log_recursion` reads as lost mass (no extra reduction).
        entered = enter & jnp.concatenate([lat.feasible, lat.feasible])[:, None]
        if store:
            entered = jnp.concatenate([entered, jnp.zeros_like(entered[:, :1])], axis=1)
        lost = (relative <= _EXP_FLOOR) & (relative > -jnp.inf) & entered & valid[:, :, None]
        rows = jnp.where(lost, -1e30, rows)
    # Each row's emissions are divided by their sum inside the loop (largest >= 1/S), so that the
    # range below a frame's best state is ~80 nats even where the best class is no label.
    row_total = _row_sum(rows, (jnp.arange(rows.shape[2]) < states).astype(jnp.float32))
    row_total = jnp.where(valid & (row_total != 0), row_total, 1.0)
    row_offset = jnp.concatenate([offset.T, offset[:, ::-1].T], axis=1) + jnp.log(row_total)
    row_offset = jnp.where(valid, row_offset, 0.0)
    last, tables = _scaled_loop(lat.start.astype(jnp.float32), rows, 1.0 / row_total, valid, row_offset,
                                lat.skip, enter, block, store)
    post, last_scale = last
    log_z = jnp.log(_row_sum(jnp.where(lat.final, post, 0.0))) + last_scale
    if not store:
        return None, log_z, log_norm
    return tables + (row_offset,), log_z, log_norm


def _time_major_gather(table, ids, spare: bool = False):
    """table [B, T, C], ids [B, S] in [0, C) -> rows [T, 2B, S] in loop order: row b =
    table[b, t, ids[b]], row B+b = table[b, T-1-t, ids[b, ::-1]] (one gather, no transposes).
    spare=True: [T, 2B, S+1], column S a copy of column S-1 (room for the loop's own column)."""
    batch, frames, columns = table.shape
    states = ids.shape[1]
    step = jnp.arange(frames)[:, None, None]
    row = jnp.arange(2 * batch)[None, :, None]
    pos = jnp.minimum(jnp.arange(states + spare), states - 1)[None, None, :]
    forward = row < batch
    b = jnp.where(forward, row, row - batch)
    t = jnp.where(forward, step, frames - 1 - step)
    flat = (b * frames + t) * columns + ids[b, jnp.where(forward, pos, states - 1 - pos)]
    return table.reshape(-1)[flat.reshape(-1)].reshape(frames, 2 * batch, states + spare)


def _scaled_loop(init, rows, gain, valid, offset, skip, enter, block: int, store: bool):
    """Scaled recursion over rows [T, R, S] with emissions rows * gain[..., None] * enter (gain,
    valid, offset [T, R]; offset = the log-factor that the gained emissions lack; enter [R, S]
    bool: the states that exist), renormalised at the start of every block of frames. With
    store=True, rows is [T, R, S+1] (column S unused) and the table is written over it, block by
    block after the block's rows are read, so that no zero-filled output buffer is needed.

    The carry is (x [R, S] unnormalised, its row sum [R], its log-scale c [R]: the true value is
    x * exp(c)); each block starts by dividing x by the sum inside the fused step, so that a
    one-frame body is little more than the step, the row sum (a matrix-vector product: on CPU
    much faster than a reduction) and one small update. Rows without mass keep sum 1.

    Returns ((x after step T-1 divided by its sum [R, S], its log-scale [R]), table [T, R, S + 1]
    or None (store=False)): at each step the forward rows' new value and the backward rows'
    incoming sum, with the log-scale that the forward value lacks as column S (the backward rows'
    value lacks that minus the step's offset).
    """
    frames, num_rows = rows.shape[:2]
    states = init.shape[1]
    forward_row = (jnp.arange(num_rows) < num_rows // 2)[:, None]
    ones = jnp.broadcast_to(1.0 + 0.0 * gain[0, 0], (states,))

    def run_block(carry, xs):
        # store=True: the log-scale is not carried (one update fewer per step); each stored row
        # holds its increment instead and the caller sums them up (one prefix sum after the loop)
        x, norm, scale = carry
        block_rows, block_gain, block_valid, block_offset = xs
        norm = jnp.where(norm > 0, norm, 1.0)
        x = x * (1.0 / norm)[:, None]
        increment = jnp.log(norm)
        stored = []
        for j in range(block_rows.shape[0]):
            emit = jnp.where(enter, block_rows[j, :, :states] * block_gain[j][:, None], 0.0)
            x, incoming = scaled_ctc_step(x, emit, block_valid[j], skip)
            increment = increment + block_offset[j]
            if store:
                stored.append(jnp.concatenate([jnp.where(forward_row, x, incoming), increment[:, None]], axis=1))
            else:
                scale = scale + increment
            increment = jnp.zeros_like(increment)
        return (x, _row_sum(x, ones), scale), (jnp.stack(stored) if store else None)

    blocks, rest = divmod(frames, block)
    carry = (init, jnp.ones((num_rows,), jnp.float32), jnp.zeros((num_rows,), jnp.float32))
    if store:
        def in_place(t0, size, state):
            x, norm, buf = state
            at = lambda a: jax.lax.dynamic_slice_in_dim(a, t0, size, 0, allow_negative_indices=False)
            (x, norm, _), out = run_block((x, norm, None), (at(buf), at(gain), at(valid), at(offset)))
            return x, norm, jax.lax.dynamic_update_slice_in_dim(buf, out, t0, 0, allow_negative_indices=False)

        state = (init, carry[1], rows)
        if blocks:
            state = jax.lax.fori_loop(0, blocks, lambda i, st: in_place(i * block, block, st), state)
        if rest:
            state = in_place(blocks * block, rest, state)
        x, norm, table = state
        scales = _prefix_sum(table[:, :, states])
        return _normalised_last(x, norm, scales[-1]), (table, scales)
    # store=False: the log-scale is carried, nothing is written
    if blocks == frames:   # one frame per step: no [T, 1, ...] reshapes (they cost layout copies)
        carry, _ = jax.lax.scan(lambda c, xs: run_block(c, jax.tree.map(lambda a: a[None], xs)), carry,
                                (rows, gain, valid, offset))
    elif blocks:
        split = lambda a: a[:blocks * block].reshape((blocks, block) + a.shape[1:])
        carry, _ = jax.lax.scan(run_block, carry, (split(rows), split(gain), split(valid), split(offset)))
    if rest:
        tail = blocks * block
        carry, _ = run_block(carry, (rows[tail:], gain[tail:], valid[tail:], offset[tail:]))
    return _normalised_last(*carry), None


def _normalised_last(x, norm, scale):
    """(x / its row sum [R, S], its log-scale [R]) of the loop's last carry (rows without mass: sum 1)."""
    norm = jnp.where(norm > 0, norm, 1.0)
    return x * (1.0 / norm)[:, None], scale + jnp.log(norm)


def _total_only_loop(step, renormalise, init, table, lat: _Lattice, block: int):
    """`_frame_loop` without tables: (last carry [R, S], sum of the removed log-scales [R]).

    The rows' frames are first laid out time-major in loop order ([T, R, S]: row b frame t, row
    B+b frame T-1-t with its states reversed), so that each step reads one contiguous slice. Without
    the stored tables XLA fuses the whole step (shifts, log-sum-exp, emission) into one kernel, and
    building the frame from two strided, reversed reads inside it defeats vectorisation (measured
    at (16, 500, 500, 80): 30 -> 20 ms for a forward-only call)."""
    frames = lat.shape[1]
    rows = jnp.concatenate([jnp.swapaxes(table, 0, 1), jnp.swapaxes(table[:, ::-1, ::-1], 0, 1)], axis=1)
    valid = jnp.concatenate([lat.frame_valid.T, lat.frame_valid[:, ::-1].T], axis=1)        # [T, R]

    def run_block(carry, total, t0, size):
        block_rows = jax.lax.dynamic_slice_in_dim(rows, t0, size, axis=0)
        block_valid = jax.lax.dynamic_slice_in_dim(valid, t0, size, axis=0)
        for j in range(size):
            carry, _ = step(carry, block_rows[j], block_valid[j], lat.skip)
        carry, log_scale = renormalise(carry)
        return carry, total + log_scale

    blocks, rest = divmod(frames, block)
    carry, total = init, jnp.zeros(init.shape[:1], jnp.float32)
    if blocks:
        carry, total = jax.lax.fori_loop(
            0, blocks, lambda i, state: run_block(*state, i * block, block), (carry, total))
    if rest:
        carry, total = run_block(carry, total, blocks * block, rest)
    return carry, total


def _frame_loop(step, renormalise, init, table, lat: _Lattice, block: int, store: bool = True):
    """Runs `step(carry [R, S], frame [R, S], valid [R], skip) -> (carry, incoming)` over the rows'
    frames of `table` [B, T, S] (forward rows frame t, backward rows frame T-1-t, states reversed),
    `block` frames per loop iteration, then `renormalise(carry) -> (carry, log_scale [R])`.

    Returns (last carry [R, S], (alpha, beta, norm_f, norm_b), log-scale sum [R]): alpha [B, T, S] =
    the forward rows' carry after each frame, beta [B, T, S] = the backward rows' incoming sum at
    each frame (both in natural order); norm_* [B, T] the log-scales removed by the
    renormalisations, each booked on the last frame of its block in that row's order (so that
    alpha's scale includes its own frame and beta's does not). store=False: no tables (None),
    see `_total_only_loop`."""
    if not store:
        last, total = _total_only_loop(step, renormalise, init, table, lat, block)
        return last, None, total
    batch, frames, _, states = lat.shape
    valid = lat.frame_valid
    zeros = jnp.zeros((batch, frames, states), jnp.float32)
    outs = (zeros, zeros, jnp.zeros((batch, frames), jnp.float32), jnp.zeros((batch, frames), jnp.float32))

    def run_block(carry, outs, t0, size):
        """Frames t0 .. t0+size-1 (forward), T-1-t0 .. T-size-t0 (backward); t0 traced or static."""
        alpha, beta, norm_f, norm_b = outs
        back0 = frames - t0 - size
        fwd_frames = jax.lax.dynamic_slice_in_dim(table, t0, size, axis=1)            # [B, size, S]
        bwd_frames = jax.lax.dynamic_slice_in_dim(table, back0, size, axis=1)
        fwd_valid = jax.lax.dynamic_slice_in_dim(valid, t0, size, axis=1)
        bwd_valid = jax.lax.dynamic_slice_in_dim(valid, back0, size, axis=1)
        fwd_out, bwd_out = [], []
        for j in range(size):
            frame = jnp.concatenate([fwd_frames[:, j], bwd_frames[:, size - 1 - j, ::-1]], axis=0)
            frame_valid = jnp.concatenate([fwd_valid[:, j], bwd_valid[:, size - 1 - j]], axis=0)
            carry, incoming = step(carry, frame, frame_valid, lat.skip)
            if size > 1:   # keep XLA from fusing (and recomputing) the chain of steps
                carry, incoming = jax.lax.optimization_barrier((carry, incoming))
            fwd_out.append(carry[:batch])
            bwd_out.append(incoming[batch:, ::-1])
        carry, log_scale = renormalise(carry)
        fwd_out[-1] = carry[:batch]
        booked = jnp.zeros((size,), jnp.float32).at[-1].set(1.0)                         # last frame
        alpha = jax.lax.dynamic_update_slice_in_dim(alpha, jnp.stack(fwd_out, axis=1), t0, axis=1)
        beta = jax.lax.dynamic_update_slice_in_dim(beta, jnp.stack(bwd_out[::-1], axis=1), back0, axis=1)
        norm_f = jax.lax.dynamic_update_slice_in_dim(norm_f, log_scale[:batch, None] * booked, t0, axis=1)
        norm_b = jax.lax.dynamic_update_slice_in_dim(norm_b, log_scale[batch:, None] * booked[::-1], back0,
                                                     axis=1)
        return carry, (alpha, beta, norm_f, norm_b)

    blocks, rest = divmod(frames, block)
    carry = init
    if blocks:
        carry, outs = jax.lax.fori_loop(
            0, blocks, lambda i, state: run_block(*state, i * block, block), (carry, outs))
    if rest:
        carry, outs = run_block(carry, outs, blocks * block, rest)
    return carry, outs, jnp.concatenate([jnp.sum(outs[2], axis=1), jnp.sum(outs[3], axis=1)])


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
                         log_probs: bool = False, method: str = "log", block: int = DEFAULT_BLOCK,
                         store_tables: bool = True):
    """Runs the fused forward-backward recursion (no input checks; see `ctc_nll`).

    Returns (lattice, tables, log_z [B], used_log []): tables are method-specific (the comment
    above `_run_log` says what they hold) and meant for `ctc_occupancy`; log_z is the total
    log-likelihood (-inf when no alignment fits). With method='auto', used_log says that the
    scaled run lost mass: log_z then comes from the log recursion, the tables stay those of the
    scaled run and `ctc_occupancy` recomputes them (so only [B] values, not tables, pass through
    `lax.cond`). store_tables=False: only log_z is computed (tables is None), in a loop that
    writes no tables (`_total_only_loop` / `_scaled_loop` with store=False; faster when no
    gradient is wanted).
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}; got {method!r}")
    lat = _Lattice.build(logits, logit_paddings, labels, label_paddings, blank_id)
    batch = lat.shape[0]
    if method == "log":
        lat = lat.with_log_norm(_log_normaliser(logits, log_probs))
        tables, log_z = _run_log(lat, lat.emissions(logits), block, store_tables)
        used_log = jnp.array(True)
    else:
        tables, log_z, log_norm = _run_scaled(lat, logits, log_probs, block, store_tables,
                                              mark_flushed=method == "auto")
        lat = lat.with_log_norm(log_norm)
        used_log = jnp.array(False)
        if method == "auto":   # (the fallback needs only log_z; ctc_occupancy recomputes tables)
            used_log = jnp.any(_needs_log_recursion(lat, log_z))
            log_z = jax.lax.cond(used_log, lambda: _run_log(lat, lat.emissions(logits), block, store=False)[1],
                                 lambda: log_z)
    log_z = jnp.where(lat.feasible, log_z[:batch], -jnp.inf)
    return lat, tables, log_z, used_log


def ctc_occupancy(lat: _Lattice, logits, tables, log_z, used_log, method: str = "log",
                  block: int = DEFAULT_BLOCK):
    """State occupancies gamma [B, T, S] = P(the path is in state s at frame t): 0 on padded frames,
    padding states and sequences with log_z = -inf. `tables`, `log_z`, `used_log` as returned by
    `ctc_forward_backward` with the same `method` (and `logits`, read only when 'auto' fell back).

    gamma[t] = alpha[t] * beta_excl[t] / Z, with the tables' scales put back from their running sums
    and the result renormalised over s within each frame (where it sums to 1), so that the
    rounding of the long running sums cancels: float32 precision for any T.
    """
    return _by_method(lat, logits, tables, used_log, method, block,
                      lambda log_tables: _log_occupancy(lat, log_tables, log_z),
                      lambda scaled_tables: _scaled_occupancy(lat, scaled_tables, log_z))


def _occupancy_parts(lat: _Lattice, logits, tables, log_z, used_log, method: str, block: int):
    """(label [B, T, N], blank [B, T]): the renormalised occupancies of the label states and their
    sum over the blank states, what the gradient needs (0 where the frame is padded or log_z is
    infinite). 'log' renormalises gamma in one fused pass; the scaled tables take the total and the
    blank sum from one matrix product and scale only the label states."""
    return _by_method(lat, logits, tables, used_log, method, block,
                      lambda log_tables: _parts_of_normalised(_log_occupancy(lat, log_tables, log_z)),
                      lambda scaled_tables: _scaled_parts(lat, scaled_tables, log_z))


def _by_method(lat: _Lattice, logits, tables, used_log, method: str, block: int, from_log, from_scaled):
    """from_log(log tables) or from_scaled(scaled tables), as `method` made `tables`; 'auto' that
    fell back (used_log) recomputes the log tables inside a `lax.cond`."""
    if method == "auto":
        return jax.lax.cond(used_log, lambda: from_log(_run_log(lat, lat.emissions(logits), block)[0]),
                            lambda: from_scaled(tables))
    return from_log(tables) if method == "log" else from_scaled(tables)


def _parts_of_normalised(occupancy):
    blank_weights = (jnp.arange(occupancy.shape[-1]) % 2 == 0).astype(jnp.float32)
    return occupancy[:, :, 1::2], _row_sum(occupancy, blank_weights)


def _log_occupancy(lat: _Lattice, tables, log_z):
    alpha, beta, scale_f, scale_b = tables
    # log of the factor that turns alpha * beta into gamma: forward scales of frames <= t,
    # backward scales of frames > t, minus log Z.
    log_factor = jnp.cumsum(scale_f, axis=1) + (jax.lax.cumsum(scale_b, axis=1, reverse=True) - scale_b)
    log_factor = log_factor - jnp.where(jnp.isfinite(log_z), log_z, 0.0)[:, None]
    # (exact arithmetic gives log gamma <= 0; the cap only guards the exp against rounding)
    gamma = _exp_nonpositive(jnp.minimum(alpha + beta + log_factor[:, :, None], 30.0))
    return _normalised(lat, gamma, log_z)


def _scaled_gamma(lat: _Lattice, tables, log_z):
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


def _scaled_occupancy(lat: _Lattice, tables, log_z):
    return _normalised(lat, _scaled_gamma(lat, tables, log_z), log_z)


def _usable_inverse(lat: _Lattice, total, log_z):
    """1/total [B, T] on valid frames of finite-log_z sequences with total > 0, else 0."""
    usable = lat.frame_valid & jnp.isfinite(log_z)[:, None] & (total > 0)
    return jnp.where(usable, 1.0 / jnp.where(usable, total, 1.0), 0.0)


def _normalised(lat: _Lattice, gamma, log_z):
    """gamma [B, T, S] renormalised to sum 1 over s (0 where `_usable_inverse` is 0)."""
    inv_total = _usable_inverse(lat, _row_sum(gamma), log_z)[:, :, None]
    return jnp.where(inv_total > 0, gamma * inv_total, 0.0)


def _scaled_parts(lat: _Lattice, tables, log_z):
    """`_occupancy_parts` of the scaled tables: total and blank sum from one [S, 2] product."""
    gamma = _scaled_gamma(lat, tables, log_z)
    states = gamma.shape[-1]
    weights = jnp.stack([jnp.ones((states,), jnp.float32),
                         (jnp.arange(states) % 2 == 0).astype(jnp.float32)], axis=1)        # [S, 2]
    sums = jnp.dot(gamma, weights, precision=jax.lax.Precision.HIGHEST)                # [B, T, 2]
    inv_total = _usable_inverse(lat, sums[..., 0], log_z)
    usable = inv_total > 0    # (gamma of unusable frames may be inf or NaN: select, not multiply)
    return (jnp.where(usable[:, :, None], gamma[:, :, 1::2] * inv_total[:, :, None], 0.0),
            jnp.where(usable, sums[..., 1] * inv_total, 0.0))


# --------------------------------------------------------------------------------------------
# Negative log-likelihood with analytic gradient
# --------------------------------------------------------------------------------------------
def _nll_from(lat: _Lattice, log_z):
    nll = jnp.where(jnp.isfinite(log_z), -log_z, jnp.inf)
    return jnp.where(lat.bad_labels, jnp.nan, nll)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6, 7))
def _ctc_nll(logits, logit_paddings, labels, label_paddings, blank_id, log_probs, method, block):
    lat, _, log_z, _ = ctc_forward_backward(logits, logit_paddings, labels, label_paddings, blank_id,
                                            log_probs=log_probs, method=method, block=block,
                                            store_tables=False)
    return _nll_from(lat, log_z)


def _ctc_nll_fwd(logits, logit_paddings, labels, label_paddings, blank_id, log_probs, method, block):
    lat, tables, log_z, used_log = ctc_forward_backward(
        logits, logit_paddings, labels, label_paddings, blank_id,
        log_probs=log_probs, method=method, block=block)
    return _nll_from(lat, log_z), (logits, lat, tables, log_z, used_log)


def _ctc_nll_bwd(blank_id, log_probs, method, block, residuals, upstream):
    logits, lat, tables, log_z, used_log = residuals
    batch, frames, classes, _ = lat.shape
    label_occ, blank_occ = _occupancy_parts(lat, logits, tables, log_z, used_log, method, block)
    scale = jnp.where(jnp.isfinite(log_z), upstream.astype(jnp.float32), 0.0)[:, None]       # [B, 1]
    # d nll / d logits = softmax * g - g * occupancy summed onto the class ids. Blank states (even)
    # sum into the blank column inside the elementwise pass; label states (odd) are scatter-added
    # to their ids (repeated ids add up). With log_probs the softmax term is absent.
    is_blank = (jnp.arange(classes) == blank_id)[None, None, :]
    grad = jnp.where(is_blank, (-scale * blank_occ)[:, :, None], 0.0)
    if not log_probs:
        probs = jnp.exp(logits.astype(jnp.float32) - lat.log_norm[:, :, None])
        grad = grad + jnp.where(lat.frame_valid[:, :, None], probs * scale[:, :, None], 0.0)
    if lat.shape[3] > 1:   # any label positions
        ids = jnp.clip(lat.ext[:, 1::2], 0, classes - 1)                          # [B, N]
        label_occ = jnp.transpose(label_occ * -scale[:, :, None], (0, 2, 1))          # [B, N, T]
        grad = grad.at[jnp.arange(batch)[:, None], :, ids].add(label_occ, mode="promise_in_bounds")
    return grad.astype(logits.dtype), None, None, None


_ctc_nll.defvjp(_ctc_nll_fwd, _ctc_nll_bwd)


def default_method(num_classes: int) -> str:
    """The recursion used when method=None, from the vocabulary size K (both choices are exact).

    Small K: the per-frame loop dominates and the rescaled recursion (with the exact log fallback,
    'auto') is faster. Large K: the O(B*T*K) softmax, gather and gradient dominate, and long label
    sequences with uninformative logits make 'auto' fall back (paying twice), so 'log'.
    """
    return "auto" if num_classes <= _SMALL_VOCABULARY else "log"


def ctc_nll(logits, logit_paddings, labels, label_paddings, blank_id: int = 0, *,
            log_probs: bool = False, method: str | None = None, block: int = DEFAULT_BLOCK):
    """Per-sequence CTC negative log-likelihood [B] (probability semiring), differentiable in logits.

    logits [B, T, K] (any float dtype; accumulation in float32, gradient in the input dtype),
    logit_paddings [B, T] (1.0 = padded frame, skipped wherever it is), labels [B, N] int,
    label_paddings [B, N] (right-padded). log_probs=True: logits are already log-normalised.
    Returns +inf for a sequence that no alignment fits (its gradient is 0), NaN for a row whose
    valid labels are out of [0, K) or equal to blank_id (an error instead on concrete inputs).
    method: 'auto' | 'scaled' | 'log' (see the module docstring), or None for `default_method(K)`;
    block: frames per loop iteration (renormalised once per block; results do not depend on it).
    """
    check_ctc_inputs(logits, logit_paddings, labels, label_paddings, blank_id)
    if method is None:
        method = default_method(logits.shape[-1])
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}; got {method!r}")
    if not isinstance(block, (int, np.integer)) or block < 1:
        raise ValueError(f"block must be a positive int; got {block!r}")
    return _ctc_nll(logits, jnp.asarray(logit_paddings), jnp.asarray(labels), jnp.asarray(label_paddings),
                    int(blank_id), bool(log_probs), method, int(block))
