"""Wav2Vec2 in Flax (linen): conv feature encoder, transformer encoder, CTC head, SpecAugment-style masking.

Numerically the same network as transformers' ``Wav2Vec2Model`` / ``Wav2Vec2ForCTC`` (both the ``group``-norm +
post-LN "base" variant and the ``layer``-norm + pre-LN ``do_stable_layer_norm`` "large-lv60" variant); the
pretraining head (Gumbel product quantizer, contrastive + diversity loss) lives in :mod:`models.wav2vec2_pretrain`,
Hugging Face import/export in :mod:`models.wav2vec2_hf`, the config and the feature
encoder's shape arithmetic in :mod:`models.wav2vec2_config`.

Conventions:
- Audio is ``input_values [B, S]`` (float, already normalised as the feature extractor does) with optax-style
  ``paddings [B, S]`` (1.0 = padded, valid samples first). Frame-level paddings are derived exactly as
  transformers derives its reduced attention mask.
- ``dtype`` is the compute dtype, ``param_dtype`` the storage dtype; layer/group norms, softmaxes and losses are
  computed in float32.
- Parameters carry logical axis names (``embed``, ``mlp``, ``heads``, ``kv``, ``vocab``, ``conv``, ``layers``)
  through :func:`models.logical.partitioned`; ``nn.unbox`` gives plain arrays.
- Randomness is explicit: dropout/layerdrop draw from the ``'dropout'`` rng, SpecAugment masks from ``'mask'``
  (only when ``deterministic=False``); masks can also be passed in (``mask_time_indices``, ``mask_feature_indices``).
- The group-norm feature encoder normalises each channel over the whole (padded) time axis, as transformers and
  fairseq do; that is why "base" checkpoints are used without attention masks. Results therefore depend on the
  amount of padding for that variant (not for the ``layer`` variant).
"""
from __future__ import annotations

import math
from typing import Any, Callable

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from models.layer_stack import LayerStack, StackOptions
from models.logical import partitioned
from models.wav2vec2_config import (  # noqa: F401  (feat_extract_output_lengths: re-exported)
    Wav2Vec2Config, activation, check_audio, feat_extract_output_lengths, frame_paddings)

Dtype = Any
NEG_INF = float(np.finfo(np.float32).min)


# --------------------------------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------------------------------

def torch_linear_init(fan_in: int) -> Callable:
    """PyTorch's default ``nn.Linear`` init: uniform(-1/sqrt(fan_in), 1/sqrt(fan_in))."""
    bound = 1.0 / math.sqrt(fan_in)

    def init(key, shape, dtype=jnp.float32):
        return jax.random.uniform(key, shape, dtype, -bound, bound)

    return init


def w2v_dense(features, names, cfg: Wav2Vec2Config, *, name: str, axis=-1, use_bias=True,
              kernel_init: Callable | None = None, bias_init: Callable | None = None) -> nn.DenseGeneral:
    """A DenseGeneral in the config's dtypes with logically named kernel and bias (HF's normal init default)."""
    nfeat = 1 if isinstance(features, int) else len(features)
    return nn.DenseGeneral(
        features=features, axis=axis, use_bias=use_bias, dtype=jnp.dtype(cfg.dtype),
        param_dtype=jnp.dtype(cfg.param_dtype),
        kernel_init=partitioned(kernel_init or nn.initializers.normal(cfg.initializer_range), names),
        bias_init=partitioned(bias_init or nn.initializers.zeros_init(), tuple(names)[-nfeat:]), name=name)


class Norm(nn.Module):
    """LayerNorm over the last axis (``reduce_time=False``) or per-channel GroupNorm over time
    (``reduce_time=True``, i.e. ``nn.GroupNorm(num_groups=C)`` on ``[B, C, T]``), statistics in float32."""

    features: int
    eps: float = 1e-5
    reduce_time: bool = False
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32
    axis_name: str = "embed"

    @nn.compact
    def __call__(self, x):
        scale = self.param("scale", partitioned(nn.initializers.ones_init(), (self.axis_name,)), (self.features,),
                           self.param_dtype)
        bias = self.param("bias", partitioned(nn.initializers.zeros_init(), (self.axis_name,)), (self.features,),
                          self.param_dtype)
        xf = x.astype(jnp.float32)
        axis = -2 if self.reduce_time else -1
        mean = jnp.mean(xf, axis=axis, keepdims=True)
        var = jnp.mean(jnp.square(xf - mean), axis=axis, keepdims=True)
        y = (xf - mean) * jax.lax.rsqrt(var + self.eps)
        y = y * scale.astype(jnp.float32) + bias.astype(jnp.float32)
        return y.astype(self.dtype)


# --------------------------------------------------------------------------------------------------------------------
# Feature encoder and projection
# --------------------------------------------------------------------------------------------------------------------

class ConvLayer(nn.Module):
    """One conv layer of the feature encoder: Conv1d (stride, no padding) -> optional norm -> activation."""

    config: Wav2Vec2Config
    layer_id: int
    norm: str | None  # None, "group", "layer"

    @nn.compact
    def __call__(self, x):  # [B, T, Cin] -> [B, T', Cout]
        cfg = self.config
        cin = cfg.conv_dim[self.layer_id - 1] if self.layer_id > 0 else 1
        cout, k, s = cfg.conv_dim[self.layer_id], cfg.conv_kernel[self.layer_id], cfg.conv_stride[self.layer_id]
        dtype, pdt = jnp.dtype(cfg.dtype), jnp.dtype(cfg.param_dtype)
        conv = _Conv1d(cin, cout, k, s, cfg.conv_bias, dtype, pdt, name="conv")
        x = conv(x)
        if self.norm is not None:
            x = Norm(cout, eps=1e-5, reduce_time=self.norm == "group", dtype=dtype, param_dtype=pdt,
                     name="layer_norm")(x)
        return activation(cfg.feat_extract_activation)(x)


class _Conv1d(nn.Module):
    in_features: int
    out_features: int
    kernel_size: int
    stride: int
    use_bias: bool
    dtype: Dtype
    param_dtype: Dtype

    @nn.compact
    def __call__(self, x):
        fan_in = self.in_features * self.kernel_size
        kernel = self.param("kernel", partitioned(nn.initializers.variance_scaling(2.0, "fan_in", "normal",
                                                                               in_axis=(0, 1), out_axis=2),
                                            ("conv", None, "embed")),
                            (self.kernel_size, self.in_features, self.out_features), self.param_dtype)
        y = jax.lax.conv_general_dilated(
            x.astype(self.dtype), kernel.astype(self.dtype), window_strides=(self.stride,), padding="VALID",
            dimension_numbers=("NWC", "WIO", "NWC"), preferred_element_type=jnp.float32)
        if self.use_bias:
            bias = self.param("bias", partitioned(torch_linear_init(fan_in), ("embed",)), (self.out_features,),
                              self.param_dtype)
            y = y + bias.astype(jnp.float32)
        return y.astype(self.dtype)


class FeatureEncoder(nn.Module):
    """Raw audio ``[B, S]`` -> conv features ``[B, T, conv_dim[-1]]``."""

    config: Wav2Vec2Config

    @nn.compact
    def __call__(self, input_values):
        cfg = self.config
        x = input_values[:, :, None].astype(jnp.dtype(cfg.dtype))
        for i in range(len(cfg.conv_dim)):
            if cfg.feat_extract_norm == "group":
                norm = "group" if i == 0 else None
            else:
                norm = "layer"
            x = ConvLayer(cfg, i, norm, name=f"conv_layers_{i}")(x)
        return x


class FeatureProjection(nn.Module):
    config: Wav2Vec2Config

    @nn.compact
    def __call__(self, x, deterministic: bool = True):
        cfg = self.config
        normed = Norm(cfg.conv_dim[-1], eps=cfg.layer_norm_eps, dtype=jnp.dtype(cfg.dtype),
                      param_dtype=jnp.dtype(cfg.param_dtype), name="layer_norm")(x)
        h = w2v_dense(cfg.hidden_size, (None, "embed"), cfg, name="projection",
                   kernel_init=torch_linear_init(cfg.conv_dim[-1]),
                   bias_init=torch_linear_init(cfg.conv_dim[-1]))(normed)
        h = nn.Dropout(cfg.feat_proj_dropout)(h, deterministic=deterministic)
        return h, normed


# --------------------------------------------------------------------------------------------------------------------
# Transformer encoder
# --------------------------------------------------------------------------------------------------------------------

class PositionalConvEmbedding(nn.Module):
    """Grouped Conv1d (kernel ``num_conv_pos_embeddings``, 'same' padding, weight norm over dim 2) + activation."""

    config: Wav2Vec2Config

    @nn.compact
    def __call__(self, x):  # [B, T, E]
        cfg = self.config
        e, k, g = cfg.hidden_size, cfg.num_conv_pos_embeddings, cfg.num_conv_pos_embedding_groups
        pdt, dtype = jnp.dtype(cfg.param_dtype), jnp.dtype(cfg.dtype)
        std = 2.0 * math.sqrt(1.0 / (k * e))
        v = self.param("weight_v", partitioned(nn.initializers.normal(std), ("conv", None, "embed")),
                       (k, e // g, e), pdt)

        def g_init(key, shape, dtype=jnp.float32):
            vv = nn.unbox(v).astype(jnp.float32)
            return jnp.sqrt(jnp.sum(jnp.square(vv), axis=(1, 2))).astype(dtype)

        wg = self.param("weight_g", partitioned(g_init, ("conv",)), (k,), pdt)
        b = self.param("bias", partitioned(nn.initializers.zeros_init(), ("embed",)), (e,), pdt)
        vf = v.astype(jnp.float32)
        w = vf * (wg.astype(jnp.float32) / jnp.sqrt(jnp.sum(jnp.square(vf), axis=(1, 2))))[:, None, None]
        # one convolution per group, not feature_group_count=g: XLA's SPMD partitioner (jax 0.10 on CPU) sums a
        # grouped convolution's weight gradient over mesh axes the batch is not split over (x2 under dp4 x tp2)
        c = e // g
        y = jnp.concatenate([jax.lax.conv_general_dilated(
            x[..., i * c:(i + 1) * c].astype(dtype), w[:, :, i * c:(i + 1) * c].astype(dtype), window_strides=(1,),
            padding=[(k // 2, k // 2)], dimension_numbers=("NWC", "WIO", "NWC"), preferred_element_type=jnp.float32)
            for i in range(g)], axis=-1)
        y = y + b.astype(jnp.float32)
        if k % 2 == 0:
            y = y[:, :-1]
        return activation(cfg.feat_extract_activation)(y).astype(dtype)


def dot_product_attention(q, k, v, key_mask=None, *, chunk_size: int = 0, dropout_rate: float = 0.0,
                          dropout_rng: jax.Array | None = None) -> jax.Array:
    """Softmax attention ``[B, T, H, D] -> [B, T, H, D]`` (float32 scores/softmax, float32 output).

    With ``0 < chunk_size < T`` the queries are processed ``chunk_size`` at a time (``lax.map`` with
    rematerialisation), so memory is ``O(chunk_size * T)`` instead of ``O(T^2)`` in the forward and the backward
    pass; the numbers are those of the unchunked computation. Dropout on the attention probabilities when
    ``dropout_rng`` is given.
    """
    b, t, h, d = q.shape
    scale = d ** -0.5

    def block(qb, rng):
        scores = jnp.einsum("bqhd,bkhd->bhqk", qb, k, preferred_element_type=jnp.float32) * scale
        if key_mask is not None:
            scores = jnp.where(key_mask[:, None, None, :], scores, NEG_INF)
        probs = jax.nn.softmax(scores, axis=-1)
        if rng is not None and dropout_rate > 0.0:
            keep = jax.random.bernoulli(rng, 1.0 - dropout_rate, probs.shape)
            probs = jnp.where(keep, probs / (1.0 - dropout_rate), 0.0)
        return jnp.einsum("bhqk,bkhd->bqhd", probs.astype(v.dtype), v, preferred_element_type=jnp.float32)

    if not chunk_size or chunk_size >= t:
        return block(q, dropout_rng)
    n = -(-t // chunk_size)
    qp = jnp.pad(q, ((0, 0), (0, n * chunk_size - t), (0, 0), (0, 0)))
    qc = jnp.moveaxis(qp.reshape(b, n, chunk_size, h, d), 1, 0)
    if dropout_rng is None:
        out = jax.lax.map(jax.checkpoint(lambda qb: block(qb, None)), qc)
    else:
        rngs = jax.random.split(dropout_rng, n)
        out = jax.lax.map(jax.checkpoint(lambda a: block(a[0], a[1])), (qc, rngs))
    return jnp.moveaxis(out, 0, 1).reshape(b, n * chunk_size, h, d)[:, :t]


class Attention(nn.Module):
    config: Wav2Vec2Config
    deterministic: bool = True

    @nn.compact
    def __call__(self, x, key_mask):  # x [B, T, E]; key_mask [B, T] bool (True = attend)
        cfg = self.config
        h = cfg.num_attention_heads
        d = cfg.hidden_size // h
        q = w2v_dense((h, d), ("embed", "heads", "kv"), cfg, name="q_proj")(x)
        k = w2v_dense((h, d), ("embed", "heads", "kv"), cfg, name="k_proj")(x)
        v = w2v_dense((h, d), ("embed", "heads", "kv"), cfg, name="v_proj")(x)
        rate = cfg.attention_dropout
        rng = self.make_rng("dropout") if (not self.deterministic and rate > 0.0) else None
        out = dot_product_attention(q, k, v, key_mask, chunk_size=cfg.attention_chunk_size, dropout_rate=rate,
                                    dropout_rng=rng)
        out = out.astype(jnp.dtype(cfg.dtype))
        return w2v_dense(cfg.hidden_size, ("heads", "kv", "embed"), cfg, name="out_proj", axis=(-2, -1))(out)


class FeedForward(nn.Module):
    config: Wav2Vec2Config
    deterministic: bool = True

    @nn.compact
    def __call__(self, x):
        cfg = self.config
        x = w2v_dense(cfg.intermediate_size, ("embed", "mlp"), cfg, name="intermediate_dense")(x)
        x = activation(cfg.hidden_act)(x)
        x = nn.Dropout(cfg.activation_dropout)(x, deterministic=self.deterministic)
        x = w2v_dense(cfg.hidden_size, ("mlp", "embed"), cfg, name="output_dense")(x)
        return nn.Dropout(cfg.hidden_dropout)(x, deterministic=self.deterministic)


class EncoderLayer(nn.Module):
    """Post-LN (``do_stable_layer_norm=False``) or pre-LN encoder layer, with LayerDrop when training."""

    config: Wav2Vec2Config
    deterministic: bool = True

    @nn.compact
    def __call__(self, x, key_mask):
        cfg = self.config
        dtype, pdt = jnp.dtype(cfg.dtype), jnp.dtype(cfg.param_dtype)
        ln = Norm(cfg.hidden_size, eps=cfg.layer_norm_eps, dtype=dtype, param_dtype=pdt, name="layer_norm")
        final_ln = Norm(cfg.hidden_size, eps=cfg.layer_norm_eps, dtype=dtype, param_dtype=pdt,
                        name="final_layer_norm")
        attn = Attention(cfg, self.deterministic, name="attention")
        ff = FeedForward(cfg, self.deterministic, name="feed_forward")
        drop = nn.Dropout(cfg.hidden_dropout)
        if cfg.do_stable_layer_norm:
            y = x + drop(attn(ln(x), key_mask), deterministic=self.deterministic)
            y = y + ff(final_ln(y))
        else:
            y = ln(x + drop(attn(x, key_mask), deterministic=self.deterministic))
            y = final_ln(y + ff(y))
        if not self.deterministic and cfg.layerdrop > 0.0:
            skip = jax.random.uniform(self.make_rng("dropout"), ()) < cfg.layerdrop
            y = jnp.where(skip, x, y)
        return y.astype(dtype), None


class _ScannedLayer(nn.Module):
    """The scanned layout's layer (parameters under ``layers/layer``, as saved checkpoints have them)."""
    config: Wav2Vec2Config
    deterministic: bool = True

    @nn.compact
    def __call__(self, x, key_mask):
        return EncoderLayer(self.config, self.deterministic, name="layer")(x, key_mask)


class Encoder(nn.Module):
    """Positional conv embedding + layer norm + the layer stack (``stack``: remat policy, pipeline stages)."""
    config: Wav2Vec2Config
    stack: StackOptions = StackOptions()

    @nn.compact
    def __call__(self, x, frame_pads, deterministic: bool = True):
        cfg = self.config
        dtype, pdt = jnp.dtype(cfg.dtype), jnp.dtype(cfg.param_dtype)
        key_mask = None
        if frame_pads is not None:
            key_mask = frame_pads < 0.5
            x = jnp.where(key_mask[:, :, None], x, jnp.zeros((), x.dtype))
        x = x + PositionalConvEmbedding(cfg, name="pos_conv_embed")(x)
        ln = Norm(cfg.hidden_size, eps=cfg.layer_norm_eps, dtype=dtype, param_dtype=pdt, name="layer_norm")
        if not cfg.do_stable_layer_norm:
            x = ln(x)
        x = nn.Dropout(cfg.hidden_dropout)(x, deterministic=deterministic)
        x = nn.with_logical_constraint(x, ("batch", "length", "embed"))
        plan = LayerStack(_ScannedLayer if cfg.scan_layers else EncoderLayer, cfg.num_hidden_layers,
                          (("config", cfg), ("deterministic", deterministic)), self.stack, remat=cfg.remat,
                          scan=cfg.scan_layers, in_axes=(nn.broadcast,), rows=(True,))
        x, _ = plan(self, plan.build(), x, key_mask)
        if cfg.do_stable_layer_norm:
            x = ln(x)
        return x


# --------------------------------------------------------------------------------------------------------------------
# SpecAugment-style masking (explicit PRNG keys, static shapes)
# --------------------------------------------------------------------------------------------------------------------

def compute_mask_indices(key: jax.Array, shape: tuple[int, int], mask_prob: float, mask_length: int,
                         paddings: jax.Array | None = None, min_masks: int = 0) -> jax.Array:
    """Random spans to mask, ``bool [B, T]``: the JAX counterpart of transformers' ``_compute_mask_indices``.

    Per row of valid length ``L`` (from ``paddings``, 1.0 = padded), ``n = int(mask_prob * L / mask_length + u)``
    spans (``u ~ U[0, 1)`` shared by the batch, probabilistic rounding) with at least ``min_masks``, at most
    ``T // mask_length`` and at most ``L - mask_length + 1``; span starts are drawn uniformly without replacement
    from ``[0, L - mask_length]``, so spans never reach padding. Overlapping spans merge, so ``mask_prob`` is an
    upper bound of the masked fraction.
    """
    b, t = int(shape[0]), int(shape[1])
    if mask_length < 1:
        raise ValueError("mask_length has to be bigger than 0")
    if mask_length > t:
        raise ValueError(f"mask_length ({mask_length}) has to be smaller than the sequence length ({t})")
    if paddings is None:
        lengths = jnp.full((b,), t, jnp.int32)
    else:
        lengths = jnp.sum(1.0 - paddings.astype(jnp.float32), axis=-1).round().astype(jnp.int32)
    k_eps, k_perm = jax.random.split(key)
    eps = jax.random.uniform(k_eps, ())
    n = jnp.floor(mask_prob * lengths.astype(jnp.float32) / mask_length + eps).astype(jnp.int32)
    n = jnp.maximum(n, min_masks)
    n = jnp.where(n * mask_length > t, t // mask_length, n)
    room = lengths - (mask_length - 1)
    n = jnp.where(room < n, jnp.maximum(room, 0), n)
    kmax = min(max(int(mask_prob * t / mask_length) + 1, min_masks), t // mask_length, t - mask_length + 1)
    if kmax <= 0:
        return jnp.zeros((b, t), bool)
    scores = jax.random.uniform(k_perm, (b, t))
    valid_start = jnp.arange(t)[None, :] < room[:, None]
    scores = jnp.where(valid_start, scores, 2.0)
    starts = jnp.argsort(scores, axis=-1)[:, :kmax]                          # distinct random valid starts
    chosen = (jnp.arange(kmax)[None, :] < n[:, None]).astype(jnp.int32)
    start_ind = jnp.zeros((b, t), jnp.int32).at[jnp.arange(b)[:, None], starts].add(chosen)
    c = jnp.cumsum(start_ind, axis=-1)
    shifted = jnp.pad(c, ((0, 0), (mask_length, 0)))[:, :t]
    return (c - shifted) > 0


def spec_augment_masks(key: jax.Array, config: Wav2Vec2Config, batch: int, num_frames: int,
                       frame_pads: jax.Array | None = None) -> tuple[jax.Array | None, jax.Array | None]:
    """Time mask ``[B, T]`` and feature mask ``[B, hidden]`` as configured (``None`` where the probability is 0)."""
    kt, kf = jax.random.split(key)
    time_mask = feat_mask = None
    if config.mask_time_prob > 0:
        time_mask = compute_mask_indices(kt, (batch, num_frames), config.mask_time_prob, config.mask_time_length,
                                         frame_pads, config.mask_time_min_masks)
    if config.mask_feature_prob > 0:
        feat_mask = compute_mask_indices(kf, (batch, config.hidden_size), config.mask_feature_prob,
                                         config.mask_feature_length, None, config.mask_feature_min_masks)
    return time_mask, feat_mask


# --------------------------------------------------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------------------------------------------------

@flax.struct.dataclass
class Wav2Vec2Output:
    last_hidden_state: jax.Array      # [B, T, hidden]
    extract_features: jax.Array       # [B, T, conv_dim[-1]] layer-normed conv features (quantizer input)
    paddings: jax.Array               # [B, T] frame paddings (1.0 = padded)
    mask_time_indices: jax.Array | None = None


@flax.struct.dataclass
class Wav2Vec2CTCOutput:
    logits: jax.Array                 # [B, T, vocab]
    paddings: jax.Array               # [B, T]
    last_hidden_state: jax.Array


class Wav2Vec2Model(nn.Module):
    """Feature encoder + projection + (optional SpecAugment) + transformer encoder (``stack``: how its layers run,
    remat policy and pipeline stages)."""

    config: Wav2Vec2Config
    stack: StackOptions = StackOptions()

    @nn.compact
    def __call__(self, input_values, paddings=None, *, deterministic: bool = True, mask_time_indices=None,
                 mask_feature_indices=None) -> Wav2Vec2Output:
        cfg = self.config
        check_audio(cfg, input_values, paddings)
        feats = FeatureEncoder(cfg, name="feature_extractor")(input_values)
        b, t = feats.shape[0], feats.shape[1]
        fpads = None if paddings is None else frame_paddings(cfg, paddings, t)
        hidden, normed = FeatureProjection(cfg, name="feature_projection")(feats, deterministic)

        has_embed = cfg.mask_time_prob > 0.0 or cfg.mask_feature_prob > 0.0
        if has_embed:
            embed = self.param("masked_spec_embed", partitioned(nn.initializers.uniform(1.0), ("embed",)),
                               (cfg.hidden_size,), jnp.dtype(cfg.param_dtype))
        if cfg.apply_spec_augment:
            need_t = mask_time_indices is None and cfg.mask_time_prob > 0
            need_f = mask_feature_indices is None and cfg.mask_feature_prob > 0
            if not deterministic and (need_t or need_f):  # as transformers in training: sample what is not given
                tm, fm = spec_augment_masks(self.make_rng("mask"), cfg, b, t, fpads)
                mask_time_indices = tm if need_t else mask_time_indices
                mask_feature_indices = fm if need_f else mask_feature_indices
            if mask_time_indices is not None:
                if not has_embed:
                    raise ValueError("mask_time_indices given but the config has no masked_spec_embed "
                                     "(mask_time_prob == mask_feature_prob == 0)")
                m = jnp.asarray(mask_time_indices).astype(bool)
                if m.shape != (b, t):
                    raise ValueError(f"mask_time_indices shape {m.shape} != (batch, frames) {(b, t)}")
                hidden = jnp.where(m[:, :, None], embed.astype(hidden.dtype), hidden)
            if mask_feature_indices is not None:
                fm = jnp.asarray(mask_feature_indices).astype(bool)
                if fm.shape != (b, cfg.hidden_size):
                    raise ValueError(f"mask_feature_indices shape {fm.shape} != (batch, hidden) "
                                     f"{(b, cfg.hidden_size)}")
                hidden = jnp.where(fm[:, None, :], jnp.zeros((), hidden.dtype), hidden)
        else:
            mask_time_indices = None
        hidden = Encoder(cfg, self.stack, name="encoder")(hidden, fpads, deterministic)
        if fpads is None:
            fpads = jnp.zeros((b, t), jnp.float32)
        return Wav2Vec2Output(hidden, normed, fpads,
                              None if mask_time_indices is None else jnp.asarray(mask_time_indices).astype(bool))


class Wav2Vec2ForCTC(nn.Module):
    config: Wav2Vec2Config
    stack: StackOptions = StackOptions()

    @nn.compact
    def __call__(self, input_values, paddings=None, *, deterministic: bool = True, mask_time_indices=None,
                 mask_feature_indices=None) -> Wav2Vec2CTCOutput:
        cfg = self.config
        if cfg.vocab_size is None:
            raise ValueError("Wav2Vec2ForCTC needs config.vocab_size")
        out = Wav2Vec2Model(cfg, self.stack, name="wav2vec2")(input_values, paddings, deterministic=deterministic,
                                                  mask_time_indices=mask_time_indices,
                                                  mask_feature_indices=mask_feature_indices)
        h = nn.Dropout(cfg.final_dropout)(out.last_hidden_state, deterministic=deterministic)
        logits = w2v_dense(cfg.vocab_size, ("embed", "vocab"), cfg, name="lm_head")(h)
        return Wav2Vec2CTCOutput(logits.astype(jnp.float32), out.paddings, out.last_hidden_state)
