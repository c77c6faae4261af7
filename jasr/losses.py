"""Training losses: CTC (the public face of the forward-backward in :mod:`fsa_ops.ctc`), CTC summed over a batch
with row weights, Hugging Face's Wav2Vec2ForCTC loss, label-smoothed attention losses and the joint CTC/attention
loss of ESPnet/WeNet. Every formula lives here once; the model families in :mod:`jasr.tasks` combine them."""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from fsa_ops.ctc import METHODS, check_ctc_inputs, ctc_nll

__all__ = ["ctc_loss", "check_ctc_inputs", "weighted_ctc_loss", "wav2vec2_ctc_loss", "label_smoothed_kl",
           "label_smoothed_nll", "joint_ctc_attention_loss"]

_REDUCTIONS = ("none", "sum", "mean")


def ctc_loss(logits, logit_paddings, labels, label_paddings, blank_id: int = 0, *,
             log_probs: bool = False, zero_infinity: bool = False, reduction: str = "none",
             method: str | None = None, implementation: str = "auto"):
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
      method: None (default: 'log', the exact log-semiring recursion), 'log', 'scaled' (rescaled
        probabilities; can lose mass on peaky or long inputs) or 'auto' ('scaled', recomputed with
        'log' when its alpha/beta totals disagree; a heuristic check); see ``fsa_ops.ctc``.
      implementation: 'auto' (default: the Pallas kernel ``fsa_ops.pallas_ctc`` on GPU, XLA
        elsewhere), 'pallas' (method 'log' only; interpreted on CPU, for tests) or 'xla'.

    Returns:
      Per-sequence loss [B] (float32) or its reduction. A row with a NaN or +inf in any class of a
      valid frame gets loss NaN (as optax and torch through their log-softmax; never a finite
      value) and a NaN gradient on its valid frames, leaving the other rows untouched; ``-inf``
      entries are probabilities 0, and padded frames may hold anything. To skip such rows, mask
      the per-row loss (``jnp.where(jnp.isnan(loss), 0.0, loss)``): a row whose cotangent is 0
      gets gradient 0.

    Differences from the references: optax returns a large finite value (~1e5, from its
    log_epsilon) for an infeasible sequence; we return +inf (or 0 with ``zero_infinity``), as torch
    does. torch yields NaN gradients for infinite losses; we give 0. Invalid labels (out of range or
    equal to the blank inside the valid region) and malformed paddings raise ``ValueError`` on
    concrete inputs; under ``jit`` nothing is checked per call (that would need a host sync) and
    such a row's loss is NaN, like a row with NaN or +inf logits. To find the cause of a NaN row,
    call ``check_ctc_inputs(logits, logit_paddings, labels, label_paddings, blank_id,
    finite_logits=True)`` (this module's, from ``fsa_ops.ctc``) on host copies of the batch (e.g.
    ``jax.device_get``): it raises a ``ValueError`` naming the first bad label or logit.
    """
    if reduction not in _REDUCTIONS:
        raise ValueError(f"reduction must be one of {_REDUCTIONS}; got {reduction!r}")
    if method is not None and method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}; got {method!r}")
    loss = ctc_nll(logits, logit_paddings, labels, label_paddings, blank_id,
                   log_probs=log_probs, method=method, implementation=implementation)
    if zero_infinity:
        loss = jnp.where(jnp.isposinf(loss), 0.0, loss)
    if reduction == "sum":
        return jnp.sum(loss)
    if reduction == "mean":
        label_lengths = jnp.sum(jnp.asarray(label_paddings) < 0.5, axis=1)
        return jnp.mean(loss / jnp.maximum(label_lengths, 1).astype(loss.dtype))
    return loss


def weighted_ctc_loss(logits, logit_paddings, labels, label_paddings, row_weights, blank_id: int = 0):
    """CTC summed over a batch whose rows carry weights (0 for the loader's padding rows).

    logits [B, T, K] (any float dtype; the loss runs in float32), paddings as :func:`ctc_loss`, row_weights [B].
    Rows of weight 0 never contribute, whatever their loss. A row whose label cannot align with its frames (an
    infinite NLL: more tokens plus repeats than frames) is left out of both sums and flagged, so that one such row
    does not make the whole batch's loss infinite; a NaN (from NaN inputs) stays NaN.
    Returns (sum_b w_b * nll_b, sum_b w_b * label_count_b, infeasible [B] float32: 1.0 for the rows left out);
    the training loss is the ratio of the first two (per label token).
    """
    per_utt = ctc_loss(logits.astype(jnp.float32), logit_paddings, labels, label_paddings, blank_id)
    used = row_weights > 0
    infeasible = used & jnp.isposinf(per_utt)
    weights = jnp.where(infeasible, 0.0, row_weights)
    loss_sum = jnp.sum(jnp.where(used & ~infeasible, per_utt * weights, 0.0))
    tokens = jnp.sum((1.0 - label_paddings) * weights[:, None])
    return loss_sum, tokens, infeasible.astype(jnp.float32)


def wav2vec2_ctc_loss(logits, logit_paddings, labels, label_paddings=None, *, blank_id: int = 0,
                      reduction: str = "sum", zero_infinity: bool = False, ignore_index: int = -100):
    """CTC loss as transformers' ``Wav2Vec2ForCTC`` computes it (torch's ``ctc_loss`` on a float32 log-softmax).

    ``labels [B, U]``: entries equal to ``ignore_index`` or ``blank_id`` (or flagged by ``label_paddings``) are
    dropped and the rest packed left. An alignment that cannot exist gives ``inf``, or 0 with a zero gradient when
    ``zero_infinity``. ``reduction``: 'none' (per row), 'sum', or 'mean' (each row divided by its target length,
    clamped to >= 1, then averaged over the batch), as torch's.
    """
    if reduction not in _REDUCTIONS:
        raise ValueError(f"reduction={reduction!r}: expected one of {_REDUCTIONS}")
    labels = jnp.asarray(labels).astype(jnp.int32)
    valid = (labels != ignore_index) & (labels != blank_id)
    if label_paddings is not None:
        valid = valid & (jnp.asarray(label_paddings) < 0.5)
    order = jnp.argsort(~valid, axis=-1, stable=True)
    packed_valid = jnp.take_along_axis(valid, order, axis=-1)
    packed = jnp.where(packed_valid, jnp.take_along_axis(labels, order, axis=-1), 0)
    return ctc_loss(logits.astype(jnp.float32), jnp.asarray(logit_paddings, jnp.float32), packed,
                    (~packed_valid).astype(jnp.float32), blank_id, zero_infinity=zero_infinity, reduction=reduction)


def label_smoothed_kl(logits, targets, target_paddings, smoothing: float):
    """ESPnet's LabelSmoothingLoss numerator: per row, the sum over valid positions of KL(smoothed one-hot ||
    softmax(logits)), the smoothed target being 1 - eps on the target and eps / (V - 1) elsewhere.

    logits [B, U, V], targets [B, U] int, target_paddings [B, U]. Returns (kl [B], correct argmax counts [B]), f32.
    """
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    v = logits.shape[-1]
    conf = 1.0 - smoothing
    low = smoothing / (v - 1)
    # sum_k t_k log t_k (constant) - sum_k t_k logp_k
    entropy_term = conf * math.log(conf) + (smoothing * math.log(low) if smoothing > 0 else 0.0)
    tgt_logp = jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
    cross = -(conf - low) * tgt_logp - low * jnp.sum(logp, axis=-1)
    valid = 1.0 - target_paddings
    kl = jnp.sum((entropy_term + cross) * valid, axis=-1)
    correct = jnp.sum((jnp.argmax(logp, -1) == targets) * valid, axis=-1)
    return kl, correct


def label_smoothed_nll(logits, targets, smoothing: float):
    """The transformers Trainer's label smoother, per position: (1 - eps) * NLL + eps * mean over the vocabulary
    of -log p. logits [..., V], targets [...] int -> (smoothed [...], nll [...]) float32."""
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    nll = -jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
    return (1.0 - smoothing) * nll - smoothing * jnp.mean(logp, axis=-1), nll


def joint_ctc_attention_loss(att_logits, ctc_logits, ctc_paddings, targets, target_paddings, labels,
                             label_paddings, *, ctc_weight: float = 0.3, label_smoothing: float = 0.1,
                             blank_id: int = 0, row_weights=None, normalize: str = "batch"):
    """ESPnet/WeNet's joint loss: ``ctc_weight * L_ctc + (1 - ctc_weight) * L_att``.

    att_logits [B, U+1, V]: the decoder's outputs for the shifted inputs ``[sos, y..]``; targets and
    target_paddings [B, U+1]: ``[y.., eos]`` (``models.aed.shift_labels``); ctc_logits [B, T', V] with
    ctc_paddings (unused when ``ctc_weight == 0``); labels / label_paddings [B, U]: the CTC targets.
    ``L_att`` is :func:`label_smoothed_kl` and ``L_ctc`` the CTC NLL, both summed over rows (weighted by
    ``row_weights`` [B], default 1) and divided according to ``normalize``: 'batch' (the summed row weights),
    'tokens' (the weighted number of targets, eos included) or 'none' (sums).
    Returns (loss, aux) with aux ``att_loss``, ``ctc_loss`` (when ctc_weight > 0; same normalisation; rows whose
    labels cannot align with their frames are left out of it and flagged in ``infeasible_rows`` [B], see
    :func:`weighted_ctc_loss`), ``att_accuracy`` and ``num_tokens`` (weighted targets).
    """
    if normalize not in ("batch", "tokens", "none"):
        raise ValueError(f"normalize must be 'batch', 'tokens' or 'none', got {normalize!r}")
    if att_logits.shape[:2] != targets.shape:
        raise ValueError(f"att_logits must be [batch, labels+1, vocab] = {targets.shape}+(V,), got "
                         f"{att_logits.shape}")
    rows = jnp.ones(targets.shape[:1], jnp.float32) if row_weights is None else row_weights
    kl, correct = label_smoothed_kl(att_logits, targets, target_paddings, label_smoothing)
    num_tokens = jnp.sum((1.0 - target_paddings) * rows[:, None])
    denom = {"batch": jnp.sum(rows), "tokens": num_tokens, "none": jnp.float32(1.0)}[normalize]
    att = jnp.sum(kl * rows) / denom
    aux = {"att_loss": att, "att_accuracy": jnp.sum(correct * rows) / jnp.maximum(num_tokens, 1.0),
           "num_tokens": num_tokens}
    if ctc_weight <= 0.0:
        return att, aux
    ctc_sum, _, aux["infeasible_rows"] = weighted_ctc_loss(ctc_logits, ctc_paddings, labels, label_paddings, rows,
                                                           blank_id)
    aux["ctc_loss"] = ctc_sum / denom
    return ctc_weight * aux["ctc_loss"] + (1.0 - ctc_weight) * att, aux
