"""The CTC lattice of a padded batch, shared by the two recursions of `fsa_ops.ctc`.

The lattice of a sequence is its blank-extended label sequence
``ext = [blank, y1, blank, y2, ..., yL, blank]`` (S = 2N+1 positions for N padded labels); a path
stays on a state, moves one state on, or skips the blank between two different labels.

Both recursions (`fsa_ops.ctc_log`, `fsa_ops.ctc_scaled`) run forward and backward in one loop
over frames on R = 2B rows: rows 0..B-1 run the forward (alpha) recursion over frames 0..T-1, rows
B..2B-1 the backward (beta) recursion over frames T-1..0 of the same sequences, with their states
stored in reverse order (recursion position S-1-s holds state s).  In those coordinates every row
takes mass from positions p-1 and p-2, so one step serves both directions with no per-row select;
`CtcLattice` holds the per-row masks (``skip``, ``start``, ``final`` [R, S]) in recursion
coordinates and everything else in natural order.  The occupancy helpers here
(`normalise_over_states`) are what both recursions' gradients share.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from fsa_ops.scores import shift_states

__all__ = ["CtcLattice", "log_normaliser", "nonfinite_frames", "row_sum", "usable_inverse",
           "normalise_over_states", "time_major_gather"]


def log_normaliser(logits, log_probs: bool):
    """(log_norm [B, T], bad [B, T]): the logsumexp of each frame's logits (0 with log_probs; 0 for
    frames without mass) and `nonfinite_frames` of the frames (from the logsumexp, or with log_probs
    from a plain sum over the classes)."""
    x = logits.astype(jnp.float32)
    if log_probs:
        return jnp.zeros(logits.shape[:2], jnp.float32), nonfinite_frames(jnp.sum(x, axis=-1))
    log_norm = jax.nn.logsumexp(x, axis=-1)
    return jnp.where(jnp.isfinite(log_norm), log_norm, 0.0), nonfinite_frames(log_norm)


def nonfinite_frames(frame_sum):
    """[B, T] bool: the frames that hold a NaN or +inf in some class, read off a per-frame sum over
    the classes that is NaN or +inf exactly then (a sum, a logsumexp, a sum of exp(x - max));
    -inf entries (probability 0) are legitimate. A sum, not a max: XLA's CPU max reduction does
    not propagate NaN."""
    return ~(frame_sum < jnp.inf)


def row_sum(x, weights=None):
    """Sum over the last axis as a matrix-vector product (on CPU much faster than a reduction over
    a short minor axis); `weights` [n] (default ones) weight the columns. float32, exact order
    aside."""
    if weights is None:
        weights = jnp.ones((x.shape[-1],), jnp.float32)
    return jnp.dot(x, weights, precision=jax.lax.Precision.HIGHEST)


def time_major_gather(table, ids, spare: bool = False):
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
    return jnp.asarray(table).reshape(-1).at[flat.reshape(-1)].get(mode="promise_in_bounds").reshape(
        frames, 2 * batch, states + spare)


def _extended_labels(labels, label_lengths, blank_id):
    """[B, N] labels -> ext [B, 2N+1] (blank-interleaved; padded positions hold the blank)."""
    batch, max_labels = labels.shape
    positions = jnp.arange(max_labels)[None, :]
    labels = jnp.where(positions < label_lengths[:, None], labels, blank_id)
    blanks = jnp.full_like(labels, blank_id)
    ext = jnp.stack([blanks, labels], axis=-1).reshape(batch, 2 * max_labels)
    return jnp.concatenate([ext, jnp.full((batch, 1), blank_id, labels.dtype)], axis=-1)


@jax.tree_util.register_pytree_node_class
class CtcLattice:
    """Static-shape CTC lattice of a padded batch (a pytree, so the backward pass reuses it).

    shape = (B, T, K, S); frame_valid [B, T], ext [B, S], state_valid [B, S], feasible [B],
    bad_labels [B], log_norm [B, T] (logsumexp of the logits; 0 with log_probs), bad_input [B] (a
    valid frame holds a NaN or +inf); per-row masks skip, start, final [R, S] in recursion
    coordinates (backward rows state-reversed).
    """
    _FIELDS = ("frame_valid", "ext", "state_valid", "skip", "start", "final", "feasible", "bad_labels",
               "log_norm", "bad_input")

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
        """The lattice without log_norm and bad_input (None until `with_log_norm`: each recursion
        computes them its own way)."""
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
        skip = (ext != blank_id) & (ext != shift_states(ext, 2, blank_id))
        last = num_states[:, None] - 1
        # Start: forward rows at state 0, backward rows at the last state (position S-1-last).
        # Final: forward rows end in the last label or the trailing blank, backward rows in 0 or 1.
        fields = dict(
            frame_valid=frame_valid, ext=ext, state_valid=state_valid,
            skip=jnp.concatenate([skip, shift_states(skip, -2, False)[:, ::-1]], axis=0),
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
        fields["log_norm"] = fields["bad_input"] = None
        return cls((batch, frames, classes, states), **fields)

    def with_log_norm(self, log_norm, bad_frames):
        """The lattice with log_norm [B, T] and bad_input = any valid frame of bad_frames [B, T]
        (`nonfinite_frames`)."""
        fields = {name: getattr(self, name) for name in self._FIELDS}
        fields["log_norm"] = log_norm
        fields["bad_input"] = jnp.any(bad_frames & self.frame_valid, axis=1)
        return CtcLattice(self.shape, **fields)

    @property
    def nan_rows(self):
        """[B] bool: rows whose loss is NaN (invalid labels or a NaN/+inf in a valid frame)."""
        return self.bad_labels | self.bad_input

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

    def loop_emissions(self, logits):
        """The emissions of `emissions` in loop order: rows [T, R, S] (row b: frame t of sequence b;
        row B+b: frame T-1-t, states reversed), gathered straight from the logits (`time_major_gather`)."""
        batch, frames, classes, _ = self.shape
        rows = time_major_gather(logits, jnp.clip(self.ext, 0, classes - 1)).astype(jnp.float32)
        norm = jnp.concatenate([self.log_norm.T, self.log_norm[:, ::-1].T], axis=1)          # [T, R]
        enter = jnp.concatenate([self.state_valid, self.state_valid[:, ::-1]], axis=0)       # [R, S]
        return jnp.where(enter[None], rows - norm[:, :, None], -jnp.inf)

    @property
    def loop_valid(self):
        """[T, R] bool: whether row r's frame at loop step t is valid (loop order, as `loop_emissions`)."""
        return jnp.concatenate([self.frame_valid.T, self.frame_valid[:, ::-1].T], axis=1)


def usable_inverse(lat: CtcLattice, total, log_z):
    """1/total [B, T] on valid frames of finite-log_z sequences with total > 0, else 0."""
    usable = lat.frame_valid & jnp.isfinite(log_z)[:, None] & (total > 0)
    return jnp.where(usable, 1.0 / jnp.where(usable, total, 1.0), 0.0)


def normalise_over_states(lat: CtcLattice, gamma, log_z):
    """gamma [B, T, S] renormalised to sum 1 over s (0 where `usable_inverse` is 0): occupancies
    sum to 1 within each frame, so this cancels the rounding of the tables' long running sums."""
    inv_total = usable_inverse(lat, row_sum(gamma), log_z)[:, :, None]
    return jnp.where(inv_total > 0, gamma * inv_total, 0.0)
