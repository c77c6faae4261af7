"""Dense CTC forward-backward with an analytic gradient (jax + numpy only): the public entry points.

CTC is the lattice whose states are the blank-extended label sequence
``ext = [blank, y1, blank, y2, ..., yL, blank]`` (S = 2N+1 positions for N padded labels).
A path stays on a state, moves one state on, or skips the blank between two different labels.

How it is computed (probability semiring; log-domain results):
  * Forward (alpha) and backward (beta) recursions run in ONE loop over frames on a [2B, S]
    array: rows 0..B-1 consume frame t, rows B..2B-1 consume frame T-1-t with their states stored
    in reverse order, so that every row takes mass from positions p-1 and p-2 and one step function
    serves both directions (`fsa_ops.ctc_lattice` holds the lattice in these coordinates). Each
    loop iteration runs one frame and renormalises; the removed log-scales are kept apart. On GPU
    the loop is one Pallas kernel (`fsa_ops.pallas_ctc`; ``implementation``).
  * ``method='log'`` (the default; `fsa_ops.ctc_log`) is the exact log-semiring recursion: the
    three-way log-add per state with one max (two exps and a log), over emissions
    ``lp[t, r, s] = log p(ext[b, s] | frame)`` gathered once from the logits straight into the
    loop's time-major row order (one gather of S columns per frame and row, never a one-hot
    product); every frame is shifted back to max 0, so float32 keeps its absolute precision for T
    in the thousands.
  * ``method='scaled'`` (`fsa_ops.ctc_scaled`) runs on probabilities (multiply-add in the loop, no
    exp/log per state); its range between states within a frame is ~80 nats, and that is NOT only a
    matter of extreme logits: with long label sequences, peaky (x3, x10) or uninformative logits the
    states that the best complete paths pass through often sit >80 nats below the frame's best
    prefix, and 'scaled' then loses mass (measured: 873.31 against the exact 872.15 at (32, 250, 32,
    60), N(0, 1) x3).
  * ``method='auto'`` runs 'scaled', checks that the totals from alpha and from beta agree, that no
    alignable sequence lost its mass and that no emission of a valid state was flushed (that one
    loses the same paths in both directions), and otherwise recomputes the batch with 'log'
    (``lax.cond``). The check is a heuristic, not a proof, and a batch that fails it pays for both
    recursions, so 'auto' is not the default (`default_method`).
  * The gradient (``jax.custom_vjp``) needs no further recursion: the loop stores alpha (including
    frame t) and beta (excluding it), so the occupancies are
    ``gamma[t, s] = alpha[t, s] * beta[t, s] / Z``; 'log' takes out the max of alpha + beta over the
    states of each frame (which removes both tables' running scales and Z at once) and renormalises
    gamma over s within each frame (where it sums to 1), so that no rounding of long running sums
    enters. Blank occupancies are summed into the blank column, label occupancies scatter-added
    onto the label ids. Memory is O(B*T*(2N+1)) besides the [B, T, K] gradient.

Conventions: ``logit_paddings`` / ``label_paddings`` are optax-style (1.0 = padded, 0.0 = valid).
Padded frames may sit anywhere (they are skipped, as in optax); labels must be right-padded.

Non-finite inputs: a NaN or +inf logit (or log-prob) anywhere in a valid frame of a row, in any
class, makes that row's loss NaN (and its gradient NaN on its valid frames, or 0 when the row's
cotangent is 0: masked out with ``jnp.where(jnp.isnan(loss), 0, loss)``), never a finite value;
the check is read off a per-frame sum that the normaliser computes anyway (`CtcLattice.bad_input`).
-inf entries are probabilities 0, and padded frames may hold anything.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from fsa_ops.ctc_lattice import CtcLattice, log_normaliser, row_sum
from fsa_ops.ctc_log import log_occupancy, run_log
from fsa_ops.ctc_scaled import run_scaled, scaled_occupancy, scaled_parts
from fsa_ops.pallas_ctc import IMPLEMENTATIONS, use_pallas
from fsa_ops.scores import is_traced

__all__ = [
    "ctc_nll",
    "ctc_forward_backward",
    "ctc_occupancy",
    "check_ctc_inputs",
    "METHODS",
    "IMPLEMENTATIONS",
    "default_method",
]

METHODS = ("auto", "scaled", "log")
# 'auto' falls back to the log recursion when |logZ_alpha - logZ_beta| exceeds this
# (absolute nats + relative part for very long sequences, where float32 scale sums round).
_AUTO_ABS_TOL = 1e-4
_AUTO_REL_TOL = 1e-6


# --------------------------------------------------------------------------------------------
# Input checks
# --------------------------------------------------------------------------------------------
def check_ctc_inputs(logits, logit_paddings, labels, label_paddings, blank_id: int = 0, *,
                     finite_logits: bool = False) -> None:
    """Raises ValueError/TypeError naming the bad input. Value checks run only on concrete arrays.

    Shapes: logits [B, T, K] float, logit_paddings [B, T], labels [B, N] int, label_paddings [B, N].
    Values (when not traced): paddings in {0, 1}; label_paddings right-padded (0...0 1...1);
    valid labels in [0, K) and != blank_id; 0 <= blank_id < K; with finite_logits=True also no
    NaN or +inf logit in a valid frame (this reads the logits on the host; `ctc_nll` does not ask
    for it). Under jit these are the causes of a NaN row, found by calling this on the host
    (e.g. on ``jax.device_get`` of the batch).
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

    if not is_traced(logit_paddings):
        lp = np.asarray(logit_paddings)
        if lp.size and not np.all((lp == 0) | (lp == 1)):
            raise ValueError("logit_paddings must contain only 0.0 (valid) and 1.0 (padded)")
    if not is_traced(label_paddings):
        pads = np.asarray(label_paddings)
        if pads.size and not np.all((pads == 0) | (pads == 1)):
            raise ValueError("label_paddings must contain only 0.0 (valid) and 1.0 (padded)")
        if pads.shape[1] > 1 and np.any(np.diff(pads, axis=1) < 0):
            bad = int(np.nonzero(np.any(np.diff(pads, axis=1) < 0, axis=1))[0][0])
            raise ValueError(f"label_paddings must be right-padded (0...0 then 1...1); row {bad} is not")
        if not is_traced(labels):
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
    if finite_logits and not is_traced(logits, logit_paddings):
        x = np.asarray(logits).astype(np.float32)
        bad = (np.isnan(x) | np.isposinf(x)) & (np.asarray(logit_paddings) < 0.5)[:, :, None]
        if np.any(bad):
            b, t, k = map(int, np.argwhere(bad)[0])
            raise ValueError(f"logits[{b}, {t}, {k}] = {x[b, t, k]} in a valid frame (logit_paddings[{b}, {t}] "
                             f"= 0): row {b}'s loss is NaN ({int(bad[b].any(axis=1).sum())} of its frames "
                             f"hold a NaN or +inf; -inf is a legitimate probability 0)")


# --------------------------------------------------------------------------------------------
# Forward-backward and occupancies
# --------------------------------------------------------------------------------------------
def _needs_log_recursion(lat: CtcLattice, log_z):
    """[B] bool: the scaled recursion lost mass (alpha/beta totals disagree or vanished); never for
    rows whose loss is NaN anyway (`CtcLattice.nan_rows`), so that one bad row does not send the
    whole batch to the log recursion."""
    batch = lat.shape[0]
    forward, backward = log_z[:batch], log_z[batch:]
    both_finite = jnp.isfinite(forward) & jnp.isfinite(backward)
    gap = jnp.abs(jnp.where(both_finite, forward - backward, 0.0))
    tol = _AUTO_ABS_TOL + _AUTO_REL_TOL * jnp.abs(jnp.where(both_finite, forward, 0.0))
    disagree = (jnp.isfinite(forward) != jnp.isfinite(backward)) | (gap > tol)
    vanished = lat.feasible & ~both_finite
    return (disagree | vanished) & ~lat.nan_rows


def ctc_forward_backward(logits, logit_paddings, labels, label_paddings, blank_id: int = 0, *,
                         log_probs: bool = False, method: str = "log", store_tables: bool = True,
                         implementation: str = "xla"):
    """Runs the fused forward-backward recursion (no input checks; see `ctc_nll`).

    Returns (lattice, tables, log_z [B], used_log []): tables are method-specific (the module
    docstrings of `fsa_ops.ctc_log` and `fsa_ops.ctc_scaled` say what they hold) and meant for
    `ctc_occupancy`; log_z is the total log-likelihood (-inf when no alignment fits, NaN when a
    valid frame holds a NaN or +inf or a valid label is invalid: `CtcLattice.nan_rows`). With
    method='auto', used_log says that the
    scaled run lost mass: log_z then comes from the log recursion, the tables stay those of the
    scaled run and `ctc_occupancy` recomputes them (so only [B] values, not tables, pass through
    `lax.cond`). store_tables=False: only log_z is computed (tables is None), in a loop that
    writes no tables (faster when no gradient is wanted). implementation: how the log recursion
    runs, 'xla' (a loop of fused XLA kernels), 'pallas' (`fsa_ops.pallas_ctc`: one kernel launch;
    interpreted on CPU) or 'auto' (Pallas on GPU, XLA elsewhere); 'pallas' needs method='log'.
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}; got {method!r}")
    _check_implementation(implementation, method)
    lat = CtcLattice.build(logits, logit_paddings, labels, label_paddings, blank_id)
    batch = lat.shape[0]
    if method == "log":
        lat = lat.with_log_norm(*log_normaliser(logits, log_probs))
        tables, log_z = _run_log(lat, logits, store_tables, implementation)
        used_log = jnp.array(True)
    else:
        tables, log_z, log_norm, bad_frames = run_scaled(lat, logits, log_probs, store_tables,
                                                         mark_flushed=method == "auto")
        lat = lat.with_log_norm(log_norm, bad_frames)
        used_log = jnp.array(False)
        if method == "auto":   # (the fallback needs only log_z; ctc_occupancy recomputes tables)
            used_log = jnp.any(_needs_log_recursion(lat, log_z))
            log_z = jax.lax.cond(used_log, lambda: _run_log(lat, logits, False, implementation)[1], lambda: log_z)
    log_z = jnp.where(lat.feasible, log_z[:batch], -jnp.inf)
    log_z = jnp.where(lat.nan_rows, jnp.nan, log_z)
    return lat, tables, log_z, used_log


def _run_log(lat: CtcLattice, logits, store: bool, implementation: str):
    """The log recursion (`fsa_ops.ctc_log`) on `lat` (with its log_norm): (tables or None, log_z [2B])."""
    if use_pallas(implementation):
        return run_log(lat, lat.emissions(logits), store=store, implementation=implementation)
    return run_log(lat, rows=lat.loop_emissions(logits), store=store, implementation=implementation)


def ctc_occupancy(lat: CtcLattice, logits, tables, log_z, used_log, method: str = "log", implementation: str = "xla"):
    """State occupancies gamma [B, T, S] = P(the path is in state s at frame t): 0 on padded frames,
    padding states and sequences with log_z = -inf; NaN on the valid frames of rows whose loss is
    NaN (`CtcLattice.nan_rows`). `tables`, `log_z`, `used_log` as returned by
    `ctc_forward_backward` with the same `method` (and `logits`, read only when 'auto' fell back;
    `implementation` runs that recomputation).

    gamma[t] = alpha[t] * beta_excl[t] / Z, renormalised over s within each frame (where it sums to
    1): 'log' takes out the max of alpha + beta over the frame's states (a sequence with log_z =
    -inf has no state with both finite), 'scaled' puts the tables' scales back from their running
    sums; either way the rounding of long running sums cancels: float32 precision for any T.
    """
    occupancy = _by_method(lat, logits, implementation, tables, used_log, method,
                           lambda log_tables: jnp.swapaxes(log_occupancy(lat, log_tables), 0, 1),
                           lambda scaled_tables: scaled_occupancy(lat, scaled_tables, log_z))
    return jnp.where(_nan_frames(lat)[:, :, None], jnp.nan, occupancy)


def _nan_frames(lat: CtcLattice):
    """[B, T] bool: the valid frames of the rows whose loss is NaN (their occupancies are NaN
    there, and so is their gradient unless their cotangent is 0)."""
    return lat.nan_rows[:, None] & lat.frame_valid


def _occupancy_parts(lat: CtcLattice, logits, implementation: str, tables, log_z, used_log, method: str):
    """(label [B, T, N], blank [B, T]): the renormalised occupancies of the label states and their
    sum over the blank states, what the gradient needs (0 where the frame is padded or log_z is
    infinite). 'log' renormalises its time-major gamma and transposes the label part; the scaled
    tables take the total and the blank sum from one matrix product and scale only the label
    states."""
    return _by_method(lat, logits, implementation, tables, used_log, method,
                      lambda log_tables: _parts_of_time_major(log_occupancy(lat, log_tables)),
                      lambda scaled_tables: scaled_parts(lat, scaled_tables, log_z))


def _parts_of_time_major(occupancy):
    """(label [B, T, N], blank [B, T]) of time-major occupancies [T, B, S] already renormalised over
    the states."""
    blank_weights = (jnp.arange(occupancy.shape[-1]) % 2 == 0).astype(jnp.float32)
    return jnp.swapaxes(occupancy[:, :, 1::2], 0, 1), row_sum(occupancy, blank_weights).T


def _by_method(lat: CtcLattice, logits, implementation: str, tables, used_log, method: str, from_log,
               from_scaled):
    """from_log(log tables) or from_scaled(scaled tables), as `method` made `tables`; 'auto' that
    fell back (used_log) recomputes the log tables inside a `lax.cond`."""
    if method == "auto":
        return jax.lax.cond(used_log, lambda: from_log(_run_log(lat, logits, True, implementation)[0]),
                            lambda: from_scaled(tables))
    return from_log(tables) if method == "log" else from_scaled(tables)


# --------------------------------------------------------------------------------------------
# Negative log-likelihood with analytic gradient
# --------------------------------------------------------------------------------------------
def _nll_from(lat: CtcLattice, log_z):
    nll = jnp.where(jnp.isfinite(log_z), -log_z, jnp.inf)
    return jnp.where(lat.nan_rows, jnp.nan, nll)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6, 7))
def _ctc_nll(logits, logit_paddings, labels, label_paddings, blank_id, log_probs, method, implementation):
    lat, _, log_z, _ = ctc_forward_backward(logits, logit_paddings, labels, label_paddings, blank_id,
                                            log_probs=log_probs, method=method, store_tables=False,
                                            implementation=implementation)
    return _nll_from(lat, log_z)


def _ctc_nll_fwd(logits, logit_paddings, labels, label_paddings, blank_id, log_probs, method, implementation):
    lat, tables, log_z, used_log = ctc_forward_backward(
        logits, logit_paddings, labels, label_paddings, blank_id, log_probs=log_probs, method=method,
        implementation=implementation)
    return _nll_from(lat, log_z), (logits, lat, tables, log_z, used_log)


def _ctc_nll_bwd(blank_id, log_probs, method, implementation, residuals, upstream):
    logits, lat, tables, log_z, used_log = residuals
    batch, frames, classes, _ = lat.shape
    label_occ, blank_occ = _occupancy_parts(lat, logits, implementation, tables, log_z, used_log, method)
    scale = jnp.where(jnp.isfinite(log_z), upstream.astype(jnp.float32), 0.0)[:, None]       # [B, 1]
    # d nll / d logits = softmax * g - g * occupancy summed onto the class ids. Blank states (even)
    # sum into the blank column inside the elementwise pass; label states (odd) are scatter-added
    # to their ids (repeated ids add up). With log_probs the softmax term is absent. The valid
    # frames of rows whose loss is NaN are set in the same elementwise pass: NaN, or 0 where the
    # row's cotangent is 0 (a row masked out of the loss; its label occupancies are 0, so the
    # scatter adds nothing to them).
    is_blank = (jnp.arange(classes) == blank_id)[None, None, :]
    grad = jnp.where(is_blank, (-scale * blank_occ)[:, :, None], 0.0)
    if not log_probs:
        probs = jnp.exp(logits.astype(jnp.float32) - lat.log_norm[:, :, None])
        grad = grad + jnp.where(lat.frame_valid[:, :, None], probs * scale[:, :, None], 0.0)
    fill = jnp.where(upstream != 0, jnp.nan, 0.0)[:, None, None]
    grad = jnp.where(_nan_frames(lat)[:, :, None], fill, grad)
    if lat.shape[3] > 1:   # any label positions
        ids = jnp.clip(lat.ext[:, 1::2], 0, classes - 1)                          # [B, N]
        label_occ = jnp.transpose(label_occ * -scale[:, :, None], (0, 2, 1))          # [B, N, T]
        grad = grad.at[jnp.arange(batch)[:, None], :, ids].add(label_occ, mode="promise_in_bounds")
    return grad.astype(logits.dtype), None, None, None


_ctc_nll.defvjp(_ctc_nll_fwd, _ctc_nll_bwd)


def default_method(num_classes: int) -> str:
    """The recursion used when method=None: 'log' for every vocabulary size K.

    'log' is exact for any input. 'scaled' can lose mass on peaky or long inputs, and 'auto' (which
    detects that from the alpha/beta totals and recomputes with 'log') then pays twice: on N(0, 1)
    logits x3 and x10 at (32, 250, 32, 60) it fell back on every batch. (K is kept as the argument
    so that callers need not change if a size-dependent choice returns.)
    """
    del num_classes
    return "log"


def _check_implementation(implementation: str, method: str) -> None:
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"implementation must be one of {IMPLEMENTATIONS}; got {implementation!r}")
    if implementation == "pallas" and method != "log":
        raise ValueError(f"implementation='pallas' runs the log recursion only; got method={method!r}")


def ctc_nll(logits, logit_paddings, labels, label_paddings, blank_id: int = 0, *,
            log_probs: bool = False, method: str | None = None, implementation: str = "auto"):
    """Per-sequence CTC negative log-likelihood [B] (probability semiring), differentiable in logits.

    logits [B, T, K] (any float dtype; accumulation in float32, gradient in the input dtype),
    logit_paddings [B, T] (1.0 = padded frame, skipped wherever it is), labels [B, N] int,
    label_paddings [B, N] (right-padded). log_probs=True: logits are already log-normalised.
    Returns +inf for a sequence that no alignment fits (its gradient is 0), and NaN (its gradient
    NaN on its valid frames, other rows unaffected; 0 if the row's cotangent is 0, so that
    ``jnp.where(jnp.isnan(loss), 0.0, loss)`` skips it) for a row with a NaN or +inf logit anywhere in
    a valid frame (-inf is a legitimate probability 0; padded frames may hold anything) or whose
    valid labels are out of [0, K) or equal to blank_id (an error instead on concrete labels).
    Under jit nothing is checked per call (no host sync): to find the cause of a NaN row, call
    ``check_ctc_inputs(..., finite_logits=True)`` on host copies of the inputs.
    method: 'log' | 'scaled' | 'auto' (see the module docstring), or None for `default_method(K)` ('log').
    implementation: 'auto' (the Pallas kernel of `fsa_ops.pallas_ctc` on GPU, XLA elsewhere), 'pallas'
    (method 'log' only; interpreted on CPU: slow, for tests) or 'xla'.
    """
    check_ctc_inputs(logits, logit_paddings, labels, label_paddings, blank_id)
    if method is None:
        method = default_method(logits.shape[-1])
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}; got {method!r}")
    _check_implementation(implementation, method)
    return _ctc_nll(logits, jnp.asarray(logit_paddings), jnp.asarray(labels), jnp.asarray(label_paddings),
                    int(blank_id), bool(log_probs), method, implementation)
