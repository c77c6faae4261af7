"""Training losses. `ctc_loss` is the public face of the CTC forward-backward in `fsa_ops.ctc`."""
from __future__ import annotations

import jax.numpy as jnp

from fsa_ops.ctc import METHODS, ctc_nll

__all__ = ["ctc_loss"]

_REDUCTIONS = ("none", "sum", "mean")


def ctc_loss(logits, logit_paddings, labels, label_paddings, blank_id: int = 0, *,
             log_probs: bool = False, zero_infinity: bool = False, reduction: str = "none",
             method: str | None = None):
    """CTC negative log-likelihood; a drop-in for ``optax.ctc_loss`` (same positional arguments).

    Args:
      logits: [B, T, K] float (f32/bf16/f16; accumulated in float32, gradient in this dtype).
        Unnormalised scores, or log-probabilities when ``log_probs=True``.
      logit_paddings: [B, T], 1.0 = padded frame, 0.0 = valid. Padded frames are skipped wherever
        they are (as in optax) and get zero gradient.
      labels: [B, N] int label ids in [0, K), never ``blank_id`` inside the valid region.
      label_paddings: [B, N], 1.0 = padded label; right-padded (0...0 then 1...1).
      blank_id: index of the blank class (any value in [0, K)).
      log_probs: inputs are already log-normalised over K (as torch's ``ctc_loss``); no softmax is
        applied and the gradient is -occupancy (composed with a log_softmax it equals torch's).
      zero_infinity: an infeasible sequence (no alignment fits: frames < labels + repeats, or all
        alignments have probability 0) gives loss 0 instead of +inf. Its gradient is 0 either way.
      reduction: 'none' -> [B]; 'sum' -> []; 'mean' -> mean over the batch of
        loss / max(label_length, 1) (torch's definition).
      method: None (default: 'auto' for K <= 128, else 'log'; both exact), 'log' (log semiring),
        'scaled' (rescaled probabilities; fast but can lose mass) or 'auto' ('scaled', recomputed
        with 'log' when it lost mass); see ``fsa_ops.ctc``.

    Returns:
      Per-sequence loss [B] (float32) or its reduction.

    Differences from the references: optax returns a large finite value (~1e5, from its
    log_epsilon) for an infeasible sequence; we return +inf (or 0 with ``zero_infinity``), as torch
    does. torch yields NaN gradients for infinite losses; we give 0. Invalid labels (out of range or
    equal to the blank inside the valid region) and malformed paddings raise ``ValueError`` on
    concrete inputs; under ``jit`` such a row's loss is NaN.
    """
    if reduction not in _REDUCTIONS:
        raise ValueError(f"reduction must be one of {_REDUCTIONS}; got {reduction!r}")
    if method is not None and method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}; got {method!r}")
    loss = ctc_nll(logits, logit_paddings, labels, label_paddings, blank_id,
                   log_probs=log_probs, method=method)
    if zero_infinity:
        loss = jnp.where(jnp.isposinf(loss), 0.0, loss)
    if reduction == "sum":
        return jnp.sum(loss)
    if reduction == "mean":
        label_lengths = jnp.sum(jnp.asarray(label_paddings) < 0.5, axis=1)
        return jnp.mean(loss / jnp.maximum(label_lengths, 1).astype(loss.dtype))
    return loss
