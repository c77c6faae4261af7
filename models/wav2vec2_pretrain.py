"""Wav2Vec2 self-supervised pretraining: masking, Gumbel-softmax product quantizer, negatives, losses.

The same objective as transformers' ``Wav2Vec2ForPreTraining`` (and fairseq's wav2vec 2.0):

- time masking of the projected features with ``masked_spec_embed`` (:func:`compute_mask_indices`, re-exported
  from :mod:`models.wav2vec2`, JAX with explicit PRNG keys and static shapes);
- a product quantizer (``num_codevector_groups`` codebooks of ``num_codevectors_per_group`` entries) over the
  layer-normed conv features, hard Gumbel-softmax with a straight-through gradient when training and hard argmax
  in eval mode; its perplexity drives the diversity loss;
- a contrastive loss: cosine similarity of each masked frame's projected context vector with its projected
  quantized target and ``num_negatives`` distractors sampled from the other masked frames of the same utterance
  (:func:`sample_negative_indices`), divided by ``contrastive_logits_temperature``; summed over masked frames.

Randomness: Gumbel noise from the ``'gumbel'`` rng, dropout from ``'dropout'``; masks and negatives are computed
outside the model from explicit keys (as the transformers example does with its numpy helpers).
"""
from __future__ import annotations


import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
from jax.scipy.special import xlogy

from models.layer_stack import StackOptions
from models.logical import partitioned
from models.wav2vec2 import (Wav2Vec2Config, Wav2Vec2Model, w2v_dense, torch_linear_init,
                             compute_mask_indices, feat_extract_output_lengths, frame_paddings, spec_augment_masks)

__all__ = [
    "compute_mask_indices", "spec_augment_masks", "sample_negative_indices", "gumbel_quantize",
    "codevector_perplexity", "GumbelVectorQuantizer", "Wav2Vec2ForPreTraining", "Wav2Vec2PreTrainingOutput",
    "PretrainingLoss", "contrastive_logits", "pretraining_loss", "sample_pretraining_inputs",
]


def sample_negative_indices(key: jax.Array, shape: tuple[int, int], num_negatives: int,
                            mask_time_indices: jax.Array | None = None) -> jax.Array:
    """Distractor indices ``int32 [B, T, num_negatives]`` into the flattened ``[B * T]`` frames.

    The JAX counterpart of transformers' ``_sample_negative_indices`` (same output convention): for each masked
    frame, ``num_negatives`` frames drawn uniformly with replacement among the *other* masked frames of the same
    row; unmasked frames get index ``b * T`` (never used by the loss). A row with a single masked frame has no
    other frame to draw: its negatives point at the frame itself, which the loss treats as "negative equals
    positive" (logit -inf), so they contribute nothing.
    """
    b, t = int(shape[0]), int(shape[1])
    if mask_time_indices is None:
        mask = jnp.ones((b, t), bool)
    else:
        mask = jnp.asarray(mask_time_indices).astype(bool)
    count = jnp.sum(mask, axis=-1).astype(jnp.int32)                       # masked frames per row
    rank = jnp.cumsum(mask.astype(jnp.int32), axis=-1) - 1                 # rank of each masked frame
    high = jnp.maximum(count - 1, 1)
    u = jax.random.randint(key, (b, t, num_negatives), 0, high[:, None, None])
    u = jnp.where(u >= rank[:, :, None], u + 1, u)                         # skip the positive, stay uniform
    order = jnp.argsort(~mask, axis=-1, stable=True)                       # masked frame positions first
    neg = jnp.take_along_axis(order[:, None, :], jnp.clip(u, 0, t - 1).reshape(b, 1, -1), axis=-1)
    neg = neg.reshape(b, t, num_negatives)
    self_idx = jnp.broadcast_to(jnp.arange(t)[None, :, None], (b, t, num_negatives))
    neg = jnp.where((count > 1)[:, None, None], neg, self_idx)
    neg = jnp.where(mask[:, :, None], neg, 0)
    return (neg + (jnp.arange(b) * t)[:, None, None]).astype(jnp.int32)


def codevector_perplexity(probs: jax.Array, mask: jax.Array | None = None) -> jax.Array:
    """Sum over groups of ``exp(entropy)`` of the (masked) average codevector distribution; probs ``[N, G, V]``."""
    probs = probs.astype(jnp.float32)
    if mask is not None:
        m = jnp.asarray(mask).reshape(-1).astype(bool)
        probs = jnp.where(m[:, None, None], probs, 0.0)
        marginal = jnp.sum(probs, axis=0) / jnp.sum(m).astype(jnp.float32)
    else:
        marginal = jnp.mean(probs, axis=0)
    return jnp.sum(jnp.exp(-jnp.sum(xlogy(marginal, marginal), axis=-1)))


def gumbel_quantize(logits: jax.Array, codebook: jax.Array, *, temperature: float = 2.0,
                    gumbel_noise: jax.Array | None = None, mask: jax.Array | None = None):
    """Product quantization of ``logits [B, T, G, V]`` with ``codebook [G * V, d]``.

    ``gumbel_noise`` None: hard argmax (eval mode), perplexity of the one-hot choices. Otherwise hard
    Gumbel-softmax ``onehot(argmax(softmax((logits + noise) / temperature)))`` with the straight-through gradient
    of the soft sample, and the perplexity of ``softmax(logits)`` (noise-free). Returns ``(codevectors [B, T, G*d],
    perplexity)``; the perplexity averages over frames where ``mask`` (``[B, T]``) is set, or all frames.
    """
    b, t, g, v = logits.shape
    logits = logits.astype(jnp.float32)
    if gumbel_noise is None:
        probs = jax.nn.one_hot(jnp.argmax(logits, axis=-1), v, dtype=jnp.float32)
        perplexity = codevector_perplexity(probs.reshape(b * t, g, v), mask)
    else:
        y_soft = jax.nn.softmax((logits + gumbel_noise.astype(jnp.float32)) / temperature, axis=-1)
        y_hard = jax.nn.one_hot(jnp.argmax(y_soft, axis=-1), v, dtype=jnp.float32)
        probs = y_hard - jax.lax.stop_gradient(y_soft) + y_soft
        perplexity = codevector_perplexity(jax.nn.softmax(logits, axis=-1).reshape(b * t, g, v), mask)
    cb = codebook.reshape(g, v, -1)
    codevectors = jnp.einsum("btgv,gvd->btgd", probs.astype(cb.dtype), cb, preferred_element_type=jnp.float32)
    return codevectors.reshape(b, t, -1), perplexity


def _gumbel_noise(key: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    """Standard Gumbel noise for the quantizer (a module-level function so tests can share noise with torch)."""
    return jax.random.gumbel(key, shape, jnp.float32)


class GumbelVectorQuantizer(nn.Module):
    """``weight_proj`` (conv_dim[-1] -> G*V logits) and ``codevectors [1, G*V, codevector_dim / G]``."""

    config: Wav2Vec2Config

    @nn.compact
    def __call__(self, x, mask_time_indices=None, *, temperature: float = 2.0, deterministic: bool = True):
        cfg = self.config
        g, v = cfg.num_codevector_groups, cfg.num_codevectors_per_group
        logits = w2v_dense(g * v, ("embed", "vocab"), cfg, name="weight_proj",
                        kernel_init=nn.initializers.normal(1.0))(x)
        codebook = self.param("codevectors", partitioned(nn.initializers.uniform(1.0), (None, "vocab", "embed")),
                              (1, g * v, cfg.codevector_dim // g), jnp.dtype(cfg.param_dtype))
        logits = logits.reshape(*logits.shape[:2], g, v)
        noise = None
        if not deterministic:
            noise = _gumbel_noise(self.make_rng("gumbel"), logits.shape)
        return gumbel_quantize(logits, codebook[0], temperature=temperature, gumbel_noise=noise,
                               mask=mask_time_indices)


@flax.struct.dataclass
class Wav2Vec2PreTrainingOutput:
    projected_states: jax.Array             # [B, T, proj_codevector_dim]
    projected_quantized_states: jax.Array   # [B, T, proj_codevector_dim]
    codevector_perplexity: jax.Array        # scalar
    paddings: jax.Array                     # [B, T] frame paddings
    last_hidden_state: jax.Array


class Wav2Vec2ForPreTraining(nn.Module):
    config: Wav2Vec2Config
    stack: StackOptions = StackOptions()      # remat policy, pipeline stages of the encoder's layers

    @nn.compact
    def __call__(self, input_values, paddings=None, *, mask_time_indices=None, deterministic: bool = True,
                 gumbel_temperature: float = 2.0) -> Wav2Vec2PreTrainingOutput:
        cfg = self.config
        out = Wav2Vec2Model(cfg, self.stack, name="wav2vec2")(input_values, paddings, deterministic=deterministic,
                                                  mask_time_indices=mask_time_indices)
        projected = w2v_dense(cfg.proj_codevector_dim, ("embed", None), cfg, name="project_hid",
                           kernel_init=torch_linear_init(cfg.hidden_size),
                           bias_init=torch_linear_init(cfg.hidden_size))(out.last_hidden_state)
        feats = nn.Dropout(cfg.feat_quantizer_dropout)(out.extract_features, deterministic=deterministic)
        quantized, perplexity = GumbelVectorQuantizer(cfg, name="quantizer")(
            feats, out.mask_time_indices if mask_time_indices is None else mask_time_indices, temperature=gumbel_temperature, deterministic=deterministic)
        quantized = w2v_dense(cfg.proj_codevector_dim, ("embed", None), cfg, name="project_q",
                           kernel_init=torch_linear_init(cfg.codevector_dim),
                           bias_init=torch_linear_init(cfg.codevector_dim))(quantized)
        return Wav2Vec2PreTrainingOutput(projected.astype(jnp.float32), quantized.astype(jnp.float32), perplexity,
                                         out.paddings, out.last_hidden_state)


def _cosine_similarity(x, y, eps=1e-8):
    num = jnp.sum(x * y, axis=-1)
    nx = jnp.maximum(jnp.sqrt(jnp.sum(x * x, axis=-1)), eps)
    ny = jnp.maximum(jnp.sqrt(jnp.sum(y * y, axis=-1)), eps)
    return num / (nx * ny)


def contrastive_logits(projected_states, projected_quantized_states, sampled_negative_indices,
                       temperature: float = 0.1) -> jax.Array:
    """``[B, T, 1 + K]`` logits: cosine similarity to the positive (index 0) and the K negatives, divided by the
    temperature; a negative identical to the positive gets ``-inf``."""
    pred = projected_states.astype(jnp.float32)
    q = projected_quantized_states.astype(jnp.float32)
    b, t, d = q.shape
    idx = jnp.asarray(sampled_negative_indices).astype(jnp.int32)
    k = idx.shape[-1]
    negs = jnp.take(q.reshape(b * t, d), idx.reshape(-1), axis=0).reshape(b, t, k, d)
    targets = jnp.concatenate([q[:, :, None, :], negs], axis=2)
    logits = _cosine_similarity(pred[:, :, None, :], targets) / temperature
    neg_is_pos = jnp.all(q[:, :, None, :] == negs, axis=-1)
    return jnp.concatenate([logits[..., :1], jnp.where(neg_is_pos, -jnp.inf, logits[..., 1:])], axis=-1)


@flax.struct.dataclass
class PretrainingLoss:
    loss: jax.Array
    contrastive_loss: jax.Array
    diversity_loss: jax.Array
    num_masked: jax.Array


def pretraining_loss(config: Wav2Vec2Config, out: Wav2Vec2PreTrainingOutput, mask_time_indices,
                     sampled_negative_indices) -> PretrainingLoss:
    """``L = L_m + diversity_loss_weight * L_d`` as ``Wav2Vec2ForPreTraining`` (sums over masked frames)."""
    mask = jnp.asarray(mask_time_indices).astype(bool)
    logits = contrastive_logits(out.projected_states, out.projected_quantized_states, sampled_negative_indices,
                                config.contrastive_logits_temperature)
    ce = jax.nn.logsumexp(logits, axis=-1) - logits[..., 0]
    contrastive = jnp.sum(jnp.where(mask, ce, 0.0))
    n_codes = config.num_codevectors_per_group * config.num_codevector_groups
    n_masked = jnp.sum(mask).astype(jnp.float32)
    diversity = (n_codes - out.codevector_perplexity) / n_codes * n_masked
    return PretrainingLoss(contrastive + config.diversity_loss_weight * diversity, contrastive, diversity, n_masked)


def sample_pretraining_inputs(key: jax.Array, config: Wav2Vec2Config, batch: int, num_samples: int,
                              paddings: jax.Array | None = None, mask_prob: float | None = None,
                              mask_length: int | None = None, min_masks: int | None = None):
    """``(mask_time_indices [B, T], sampled_negative_indices [B, T, K])`` for a batch of ``num_samples`` audio:
    spans as configured (``mask_time_*``, overridable), restricted to valid frames, and negatives among them."""
    t = feat_extract_output_lengths(config, int(num_samples))
    if t < 1:
        raise ValueError(f"audio of {num_samples} samples is shorter than the receptive field "
                         f"({config.receptive_field} samples)")
    fpads = None if paddings is None else frame_paddings(config, paddings, t)
    k_mask, k_neg = jax.random.split(key)
    mask = compute_mask_indices(
        k_mask, (batch, t), config.mask_time_prob if mask_prob is None else mask_prob,
        config.mask_time_length if mask_length is None else mask_length, fpads,
        config.mask_time_min_masks if min_masks is None else min_masks)
    neg = sample_negative_indices(k_neg, (batch, t), config.num_negatives, mask)
    return mask, neg
