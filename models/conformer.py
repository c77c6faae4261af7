"""Conformer encoder (Gulati et al. 2020) and a Conformer CTC model, in flax.linen.

Architecture (ESPnet / WeNet / NeMo layout, pre-norm):

  features [B,T,F] -> Conv2d subsampling (4x; or 6x/8x) -> x * sqrt(d_model) -> dropout
  -> N x ConformerBlock -> (ConformerCTC) linear -> logits [B,T',V] float32

  ConformerBlock:  x += 0.5 * FFN(LN(x));  x += MHSA_relpos(LN(x));  x += ConvModule(LN(x));
                   x += 0.5 * FFN(LN(x));  x = LN(x)

Positional information: Transformer-XL style relative positional self-attention (Dai et al. 2019, sec. 3.3) with the
learned content/position biases u, v and the "rel shift" trick, exactly as ESPnet's ``RelPositionMultiHeadedAttention``
(``rel_pos_type=latest``), WeNet, icefall's conformer and NeMo's FastConformer / HF ``ParakeetEncoder``. We pick it
over rotary embeddings because it is what the Conformer paper and nearly all public Conformer checkpoints use (so
weights can be imported), and because it lets the tests compare the whole encoder number-for-number against
``transformers.ParakeetEncoder``. The relative position table is sinusoidal, positions ``T'-1 .. -(T'-1)``.

Subsampling front ends (``subsampling_type``):
- ``"conv2d"`` (ESPnet/WeNet ``Conv2dSubsampling``): valid (unpadded) 2-D convolutions with ReLU, then a linear layer.
  4x: two 3x3 stride-2 convs, ``T' = ((T - 1) // 2 - 1) // 2``;
  6x: 3x3 stride 2 then 5x5 stride 3, ``T' = ((T - 1) // 2 - 2) // 3``;
  8x: three 3x3 stride-2 convs, ``T' = (((T - 1) // 2 - 1) // 2 - 1) // 2``.
- ``"dw_striding"`` (NeMo FastConformer / Parakeet): a 3x3 stride-2 conv (padding 1) then depthwise-separable
  stride-2 convs, factor 2^n (4x or 8x); each stage maps ``T -> (T - 1) // 2 + 1``.
The same formulas, applied to each row's valid length, give ``out_paddings``; ``ConformerConfig.output_length(T)``
computes ``T'`` statically. Rows must be prefix-valid (valid frames first, then padding).

Padding: padded frames never influence valid ones (attention masks padded keys, the conv module zeroes padded frames
before its depthwise conv, the front end zeroes padded frames after every conv), so a padded batch gives the same
outputs on valid frames as each utterance alone (eval mode; batch norm in train mode uses masked batch statistics).

Conv module norm: ``conv_norm="layer"`` (default; no mutable state) or ``"batch"`` (as in the paper; then training
``apply`` needs ``mutable=['batch_stats']`` and returns ``(outputs, updates)``).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from models.hf_io import StrictKeys
from models.layer_stack import LayerStack, StackOptions
from models.transformer import (NEG_INF, canonical_dtype, check_features, constrain, dense, layer_norm,
                                lengths_from_paddings, paddings_from_lengths, partitioned, sinusoidal_positions)

_SUBSAMPLING = {"conv2d": (4, 6, 8), "dw_striding": (2, 4, 8, 16)}


@dataclasses.dataclass(frozen=True)
class ConformerConfig:
    """Hyper-parameters of a Conformer encoder / Conformer CTC model (frozen, hashable: usable as a static arg)."""
    input_dim: int = 80
    d_model: int = 256
    num_layers: int = 12
    num_heads: int = 4
    ff_mult: int = 4
    conv_kernel: int = 31
    subsampling: int = 4
    subsampling_type: str = "conv2d"          # "conv2d" (ESPnet) or "dw_striding" (FastConformer)
    subsampling_channels: int | None = None   # None -> d_model
    conv_norm: str = "layer"                  # "layer" or "batch"
    vocab_size: int = 0                       # CTC output size including blank (id 0); 0 = encoder only
    dropout_rate: float = 0.1                 # residual / input dropout
    attention_dropout_rate: float = 0.1       # on attention probabilities
    ff_dropout_rate: float = 0.1              # inside the feed-forward modules
    pos_dropout_rate: float = 0.0             # on the relative position table
    xscale: bool = True                       # multiply the front-end output by sqrt(d_model) (ESPnet)
    use_bias: bool = True
    layer_norm_eps: float = 1e-5
    batch_norm_momentum: float = 0.9          # flax convention (torch momentum 0.1)
    dtype: Any = "float32"                    # compute dtype
    param_dtype: Any = "float32"              # parameter storage dtype
    remat: bool = False                       # gradient checkpointing per layer (nn.remat)
    scan_layers: bool = False                 # nn.scan over layers (params stacked along a "layers" axis)

    def __post_init__(self):
        def bad(field, msg):
            raise ValueError(f"ConformerConfig.{field}={getattr(self, field)!r}: {msg}")
        for f in ("input_dim", "d_model", "num_layers", "num_heads", "ff_mult", "conv_kernel"):
            if not isinstance(getattr(self, f), int) or getattr(self, f) < 1:
                bad(f, "must be a positive int")
        if self.d_model % self.num_heads:
            bad("d_model", f"must be divisible by num_heads={self.num_heads}")
        if self.d_model % 2:
            bad("d_model", "must be even (sinusoidal relative positions)")
        if self.conv_kernel % 2 == 0:
            bad("conv_kernel", "must be odd ('same' depthwise convolution)")
        if self.subsampling_type not in _SUBSAMPLING:
            bad("subsampling_type", f"must be one of {sorted(_SUBSAMPLING)}")
        if self.subsampling not in _SUBSAMPLING[self.subsampling_type]:
            bad("subsampling", f"{self.subsampling_type!r} supports {_SUBSAMPLING[self.subsampling_type]}")
        if self.conv_norm not in ("layer", "batch"):
            bad("conv_norm", "must be 'layer' or 'batch'")
        if self.vocab_size < 0:
            bad("vocab_size", "must be >= 0")
        for f in ("dropout_rate", "attention_dropout_rate", "ff_dropout_rate", "pos_dropout_rate"):
            if not 0.0 <= getattr(self, f) < 1.0:
                bad(f, "must be in [0, 1)")
        canonical_dtype(self.dtype, "ConformerConfig.dtype")
        canonical_dtype(self.param_dtype, "ConformerConfig.param_dtype")
        if self.input_dim < self.min_input_dim():
            bad("input_dim", f"too small for {self.subsampling}x {self.subsampling_type} subsampling")

    # -- derived -----------------------------------------------------------------------------------------------------
    @property
    def compute_dtype(self) -> jnp.dtype:
        return canonical_dtype(self.dtype)

    @property
    def params_dtype(self) -> jnp.dtype:
        return canonical_dtype(self.param_dtype)

    @property
    def channels(self) -> int:
        return self.subsampling_channels or self.d_model

    def _stages(self) -> list[tuple[int, int, int]]:
        """(kernel, stride, padding) of each strided conv stage along time (and frequency)."""
        if self.subsampling_type == "conv2d":
            return {4: [(3, 2, 0)] * 2, 6: [(3, 2, 0), (5, 3, 0)], 8: [(3, 2, 0)] * 3}[self.subsampling]
        return [(3, 2, 1)] * int(round(math.log2(self.subsampling)))

    def output_length(self, length):
        """Frames after subsampling; works on Python ints and integer arrays alike (floor division)."""
        for k, s, p in self._stages():
            length = (length + 2 * p - k) // s + 1
        return length

    def subsampled_dim(self) -> int:
        return self.output_length(self.input_dim)

    def min_input_dim(self) -> int:
        n = 1
        while self.output_length(n) < 1:
            n += 1
        return n

    def min_frames(self) -> int:
        """The fewest input frames that give one output frame."""
        return self.min_input_dim()

    def replace(self, **kw) -> "ConformerConfig":
        return dataclasses.replace(self, **kw)

    # -- presets -----------------------------------------------------------------------------------------------------
    @classmethod
    def tiny(cls, vocab_size: int = 0, **kw) -> "ConformerConfig":
        """For unit tests: a few thousand parameters."""
        base = dict(input_dim=20, d_model=32, num_layers=2, num_heads=4, ff_mult=2, conv_kernel=7,
                    subsampling_channels=8)
        return cls(vocab_size=vocab_size, **{**base, **kw})

    @classmethod
    def demo(cls, vocab_size: int, **kw) -> "ConformerConfig":
        """Trains in minutes on a few CPU cores (spoken digit strings from 80-dim fbank)."""
        base = dict(input_dim=80, d_model=144, num_layers=4, num_heads=4, ff_mult=4, conv_kernel=15,
                    subsampling_channels=64, dropout_rate=0.1, attention_dropout_rate=0.0, ff_dropout_rate=0.1)
        return cls(vocab_size=vocab_size, **{**base, **kw})

    @classmethod
    def small(cls, vocab_size: int, **kw) -> "ConformerConfig":
        """Conformer (S) of the paper: ~10M parameters."""
        base = dict(d_model=144, num_layers=16, num_heads=4, conv_kernel=31)
        return cls(vocab_size=vocab_size, **{**base, **kw})

    @classmethod
    def medium(cls, vocab_size: int, **kw) -> "ConformerConfig":
        """Conformer (M): ~30M parameters."""
        base = dict(d_model=256, num_layers=16, num_heads=4, conv_kernel=31)
        return cls(vocab_size=vocab_size, **{**base, **kw})

    @classmethod
    def large(cls, vocab_size: int, **kw) -> "ConformerConfig":
        """Conformer (L): ~120M parameters."""
        base = dict(d_model=512, num_layers=17, num_heads=8, conv_kernel=31)
        return cls(vocab_size=vocab_size, **{**base, **kw})


# ----------------------------------------------------------------------------------------------------------------
# Front end
# ----------------------------------------------------------------------------------------------------------------

class Conv2dSubsampling(nn.Module):
    """Conv2d subsampling: ``[B,T,F]`` -> ``[B,T',d_model]`` plus ``out_paddings [B,T']``."""
    config: ConformerConfig

    @nn.compact
    def __call__(self, x: jax.Array, paddings: jax.Array):
        cfg = self.config
        dt, pdt, c = cfg.compute_dtype, cfg.params_dtype, cfg.channels
        lengths = lengths_from_paddings(paddings)

        def mask_time(h, lens):  # h [B,T,F,C]
            valid = jnp.arange(h.shape[1])[None, :] < lens[:, None]
            return jnp.where(valid[:, :, None, None], h, jnp.zeros((), h.dtype))

        def conv(features, k, s, p, groups=1, name=None):
            return nn.Conv(features, (k, k), strides=(s, s), padding=[(p, p), (p, p)], feature_group_count=groups,
                           dtype=dt, param_dtype=pdt,
                           kernel_init=partitioned(nn.initializers.lecun_normal(), (None, None, None, "conv")),
                           bias_init=partitioned(nn.initializers.zeros_init(), ("conv",)), name=name)

        h = mask_time(x.astype(dt)[..., None], lengths)  # [B,T,F,1]
        stages = cfg._stages()
        for i, (k, s, p) in enumerate(stages):
            if cfg.subsampling_type == "conv2d" or i == 0:
                h = conv(c, k, s, p, name=f"conv_{i}")(h)
                lengths = (lengths + 2 * p - k) // s + 1
                if cfg.subsampling_type == "dw_striding":
                    h = mask_time(h, lengths)
            else:  # depthwise-separable stage (FastConformer)
                h = conv(c, k, s, p, groups=c, name=f"dw_conv_{i}")(h)
                lengths = (lengths + 2 * p - k) // s + 1
                h = mask_time(h, lengths)
                h = conv(c, 1, 1, 0, name=f"pw_conv_{i}")(h)
                h = mask_time(h, lengths)
            h = nn.relu(h)
        b, t, f, _ = h.shape
        h = jnp.transpose(h, (0, 1, 3, 2)).reshape(b, t, c * f)  # channel-major, as torch's flatten of [B,C,T,F]
        h = dense(cfg.d_model, ("mlp", "embed"), dtype=dt, param_dtype=pdt, name="out")(h)
        lengths = jnp.maximum(lengths, 0)
        return h, paddings_from_lengths(lengths, t)


# ----------------------------------------------------------------------------------------------------------------
# Blocks
# ----------------------------------------------------------------------------------------------------------------

class FeedForward(nn.Module):
    config: ConformerConfig
    deterministic: bool = True

    @nn.compact
    def __call__(self, x):
        cfg = self.config
        dt, pdt = cfg.compute_dtype, cfg.params_dtype
        h = dense(cfg.d_model * cfg.ff_mult, ("embed", "mlp"), dtype=dt, param_dtype=pdt, use_bias=cfg.use_bias,
                  name="linear1")(x)
        h = nn.silu(h)
        h = constrain(h, ("batch", "length", "mlp"))
        h = nn.Dropout(cfg.ff_dropout_rate, deterministic=self.deterministic)(h)
        return dense(cfg.d_model, ("mlp", "embed"), dtype=dt, param_dtype=pdt, use_bias=cfg.use_bias,
                     name="linear2")(h)


def rel_shift(scores: jax.Array) -> jax.Array:
    """Transformer-XL relative shift: ``[..., T, 2T-1]`` scores against positions ``T-1 .. -(T-1)`` ->
    ``[..., T, T]`` with ``out[i, j]`` the score for relative position ``i - j``."""
    *lead, t, p = scores.shape
    x = jnp.pad(scores, [(0, 0)] * len(lead) + [(0, 0), (1, 0)])
    x = x.reshape(*lead, p + 1, t)[..., 1:, :].reshape(*lead, t, p)
    return x[..., :t]


class RelPositionMultiHeadAttention(nn.Module):
    """Multi-head self-attention with Transformer-XL relative positions (content bias u, position bias v)."""
    config: ConformerConfig
    deterministic: bool = True

    @nn.compact
    def __call__(self, x, valid, pos):
        """x [B,T,D]; valid [B,T] bool; pos [2T-1, D] sinusoidal table for positions T-1..-(T-1)."""
        cfg = self.config
        dt, pdt = cfg.compute_dtype, cfg.params_dtype
        h, dh = cfg.num_heads, cfg.d_model // cfg.num_heads
        proj = lambda name, bias=cfg.use_bias: dense((h, dh), ("embed", "heads", "kv"), dtype=dt, param_dtype=pdt,
                                                     use_bias=bias, name=name)
        q, k, v = proj("q_proj")(x), proj("k_proj")(x), proj("v_proj")(x)  # [B,T,H,Dh]
        p = proj("pos_proj", False)(pos.astype(dt))  # [P,H,Dh]
        init = partitioned(nn.initializers.normal(0.02), ("heads", "kv"))
        bias_u = self.param("bias_u", init, (h, dh), pdt).astype(dt)
        bias_v = self.param("bias_v", init, (h, dh), pdt).astype(dt)
        ac = jnp.einsum("bqhd,bkhd->bhqk", q + bias_u, k, preferred_element_type=jnp.float32)
        bd = jnp.einsum("bqhd,phd->bhqp", q + bias_v, p, preferred_element_type=jnp.float32)
        scores = (ac + rel_shift(bd)) * (1.0 / math.sqrt(dh))
        scores = jnp.where(valid[:, None, None, :], scores, NEG_INF)
        probs = jax.nn.softmax(scores, axis=-1)
        probs = nn.Dropout(cfg.attention_dropout_rate, deterministic=self.deterministic)(probs)
        out = jnp.einsum("bhqk,bkhd->bqhd", probs.astype(dt), v)
        return dense(cfg.d_model, ("heads", "kv", "embed"), axis=(-2, -1), dtype=dt, param_dtype=pdt,
                     use_bias=cfg.use_bias, name="o_proj")(out)


class ConvModule(nn.Module):
    """Pointwise conv + GLU -> depthwise conv -> batch/layer norm -> SiLU -> pointwise conv."""
    config: ConformerConfig
    deterministic: bool = True

    @nn.compact
    def __call__(self, x, valid):
        cfg = self.config
        dt, pdt, d, k = cfg.compute_dtype, cfg.params_dtype, cfg.d_model, cfg.conv_kernel
        h = dense(2 * d, ("embed", "mlp"), dtype=dt, param_dtype=pdt, use_bias=cfg.use_bias,
                  name="pointwise_conv1")(x)
        h = h[..., :d] * jax.nn.sigmoid(h[..., d:])  # GLU
        h = jnp.where(valid[..., None], h, jnp.zeros((), h.dtype))
        h = nn.Conv(d, (k,), padding=[((k - 1) // 2, (k - 1) // 2)], feature_group_count=d, use_bias=cfg.use_bias,
                    dtype=dt, param_dtype=pdt,
                    kernel_init=partitioned(nn.initializers.lecun_normal(), ("conv", None, "embed")),
                    bias_init=partitioned(nn.initializers.zeros_init(), ("embed",)), name="depthwise_conv")(h)
        if cfg.conv_norm == "batch":
            hf = h.astype(jnp.float32)
            h = nn.BatchNorm(use_running_average=self.deterministic, momentum=cfg.batch_norm_momentum, epsilon=1e-5,
                             dtype=jnp.float32, param_dtype=pdt,
                             scale_init=partitioned(nn.initializers.ones_init(), ("embed",)),
                             bias_init=partitioned(nn.initializers.zeros_init(), ("embed",)),
                             name="norm")(hf, mask=jnp.broadcast_to(valid[..., None], hf.shape))
        else:
            h = layer_norm(epsilon=cfg.layer_norm_eps, param_dtype=pdt, name="norm")(h)
        h = nn.silu(h.astype(dt))
        return dense(d, ("mlp", "embed"), dtype=dt, param_dtype=pdt, use_bias=cfg.use_bias,
                     name="pointwise_conv2")(h)


class ConformerBlock(nn.Module):
    """One Conformer layer. ``(x, valid, pos) -> (x, None)`` so that it can be ``nn.scan``-ned."""
    config: ConformerConfig
    deterministic: bool = True

    @nn.compact
    def __call__(self, x, valid, pos):
        cfg = self.config
        dt, pdt = cfg.compute_dtype, cfg.params_dtype
        ln = lambda name: (lambda y: layer_norm(epsilon=cfg.layer_norm_eps, param_dtype=pdt, name=name)(y).astype(dt))
        drop = nn.Dropout(cfg.dropout_rate, deterministic=self.deterministic)
        det = self.deterministic
        x = x + 0.5 * drop(FeedForward(cfg, det, name="ff1")(ln("norm_ff1")(x)))
        x = x + drop(RelPositionMultiHeadAttention(cfg, det, name="self_attn")(ln("norm_attn")(x), valid, pos))
        x = x + drop(ConvModule(cfg, det, name="conv")(ln("norm_conv")(x), valid))
        x = x + 0.5 * drop(FeedForward(cfg, det, name="ff2")(ln("norm_ff2")(x)))
        x = ln("norm_out")(x)
        return constrain(x, ("batch", "length", "embed")), None


def conformer_stack(cfg: ConformerConfig, deterministic: bool, options: StackOptions = StackOptions()) -> LayerStack:
    """The encoder's layer stack: ``(x, valid [B,T'] per row, pos shared)``."""
    return LayerStack(ConformerBlock, cfg.num_layers, (("config", cfg), ("deterministic", deterministic)), options,
                      remat=cfg.remat, scan=cfg.scan_layers, in_axes=(nn.broadcast, nn.broadcast), rows=(True, False))


def check_encoder_inputs(cfg: ConformerConfig, features, paddings) -> None:
    """Shape/dtype checks of encoder inputs with errors naming the input."""
    check_features(features, paddings, cfg.input_dim)
    if cfg.output_length(features.shape[1]) < 1:
        raise ValueError(f"features has {features.shape[1]} frames; {cfg.subsampling}x {cfg.subsampling_type} "
                         f"subsampling needs at least {cfg.min_frames()}")


class ConformerEncoder(nn.Module):
    """``(features [B,T,F], paddings [B,T], train) -> (x [B,T',d_model] compute dtype, out_paddings [B,T'])``;
    ``stack`` says how the layers run (remat policy, pipeline stages)."""
    config: ConformerConfig
    stack: StackOptions = StackOptions()

    @nn.compact
    def __call__(self, features, paddings, train: bool = False):
        cfg = self.config
        check_encoder_inputs(cfg, features, paddings)
        dt = cfg.compute_dtype
        x, out_paddings = Conv2dSubsampling(cfg, name="subsampling")(features, paddings)
        t = x.shape[1]
        if cfg.xscale:
            x = x * math.sqrt(cfg.d_model)
        pos = jnp.asarray(sinusoidal_positions(np.arange(t - 1, -t, -1), cfg.d_model), dt)
        x = nn.Dropout(cfg.dropout_rate, deterministic=not train)(x)
        pos = nn.Dropout(cfg.pos_dropout_rate, deterministic=not train)(pos)
        x = constrain(x.astype(dt), ("batch", "length", "embed"))
        valid = out_paddings < 0.5
        plan = conformer_stack(cfg, not train, self.stack)
        x, _ = plan(self, plan.build(), x, valid, pos)
        return x, out_paddings


class ConformerCTC(nn.Module):
    """Conformer encoder + linear CTC head (blank id 0).

    ``logits, out_paddings = model.apply(params, features, feature_paddings, train, rngs={'dropout': key})``;
    logits ``[B, T', vocab_size]`` float32, ``T' = config.output_length(T)``.
    """
    config: ConformerConfig
    stack: StackOptions = StackOptions()

    @nn.compact
    def __call__(self, features, feature_paddings, train: bool = False):
        cfg = self.config
        if cfg.vocab_size < 1:
            raise ValueError("ConformerCTC needs ConformerConfig.vocab_size >= 1 (blank id 0 included)")
        x, out_paddings = ConformerEncoder(cfg, self.stack, name="encoder")(features, feature_paddings, train)
        logits = dense(cfg.vocab_size, ("embed", "vocab"), dtype=jnp.float32, param_dtype=cfg.params_dtype,
                       name="ctc_head")(x.astype(jnp.float32))
        return constrain(logits, ("batch", "length", "vocab")), out_paddings


# ----------------------------------------------------------------------------------------------------------------
# Weight import: Hugging Face Parakeet (NeMo FastConformer) encoders / CTC models
# ----------------------------------------------------------------------------------------------------------------

def stack_layers(layer_trees: list) -> Any:
    """Per-layer trees (``layers_0 .. layers_{N-1}``) -> one tree with a leading layer axis (the ``scan_layers``
    layout)."""
    return jax.tree_util.tree_map(lambda *xs: np.stack([np.asarray(x) for x in xs]), *layer_trees)


def unstack_layers(tree: Any, num_layers: int) -> list:
    """Inverse of :func:`stack_layers`."""
    return [jax.tree_util.tree_map(lambda x: np.asarray(x)[i], tree) for i in range(num_layers)]


def conformer_variables_from_parakeet(state_dict, config: ConformerConfig, prefix: str = "") -> dict:
    """Map a ``transformers`` ``ParakeetEncoder`` state dict (``prefix=""``) or ``ParakeetForCTC`` state dict
    (``prefix="encoder."``; then ``ctc_head.*`` fills the CTC head) onto ``{'params', 'batch_stats'}`` of
    :class:`ConformerEncoder` / :class:`ConformerCTC`. The config must match: ``subsampling_type="dw_striding"``,
    ``conv_norm="batch"``, ``xscale`` = ``scale_input``, ``ff_mult * d_model`` = ``intermediate_size``.
    Fails loudly (``CheckpointKeyError``) on a missing or an unused tensor."""
    if config.subsampling_type != "dw_striding" or config.conv_norm != "batch":
        raise ValueError("Parakeet weights need ConformerConfig(subsampling_type='dw_striding', conv_norm='batch')")
    keys = StrictKeys(state_dict, ignore=("num_batches_tracked",))
    h, dh, d = config.num_heads, config.d_model // config.num_heads, config.d_model
    pdt = config.params_dtype
    t = lambda name: keys.take(prefix + name).astype(np.float32)

    def lin(name, in_shape=None, out_shape=None, bias=True):
        w = t(name + ".weight")
        if w.ndim == 3:  # Conv1d with kernel 1
            w = w[:, :, 0]
        k = w.T
        k = k.reshape(*(in_shape or k.shape[:1]), *(out_shape or k.shape[1:]))
        out = {"kernel": k}
        if bias:
            out["bias"] = t(name + ".bias").reshape(out_shape or k.shape[-1:])
        return out

    def conv(name, bias=True):
        w = t(name + ".weight")  # [out, in/groups, *kernel]
        out = {"kernel": np.transpose(w, tuple(range(2, w.ndim)) + (1, 0))}
        if bias:
            out["bias"] = t(name + ".bias")
        return out

    def ln(name):
        return {"scale": t(name + ".weight"), "bias": t(name + ".bias")}

    sub = {"conv_0": conv("subsampling.layers.0")}
    for i in range(1, len(config._stages())):
        sub[f"dw_conv_{i}"] = conv(f"subsampling.layers.{2 + 3 * (i - 1)}")
        sub[f"pw_conv_{i}"] = conv(f"subsampling.layers.{3 + 3 * (i - 1)}")
    sub["out"] = lin("subsampling.linear")
    params: dict = {"subsampling": sub}
    stats_layers, param_layers = [], []
    for i in range(config.num_layers):
        p = f"layers.{i}."
        b = config.use_bias
        blk = {
            "ff1": {"linear1": lin(p + "feed_forward1.linear1", bias=b), "linear2": lin(p + "feed_forward1.linear2", bias=b)},
            "ff2": {"linear1": lin(p + "feed_forward2.linear1", bias=b), "linear2": lin(p + "feed_forward2.linear2", bias=b)},
            "self_attn": {
                "q_proj": lin(p + "self_attn.q_proj", out_shape=(h, dh), bias=b),
                "k_proj": lin(p + "self_attn.k_proj", out_shape=(h, dh), bias=b),
                "v_proj": lin(p + "self_attn.v_proj", out_shape=(h, dh), bias=b),
                "pos_proj": lin(p + "self_attn.relative_k_proj", out_shape=(h, dh), bias=False),
                "o_proj": lin(p + "self_attn.o_proj", in_shape=(h, dh), bias=b),
                "bias_u": t(p + "self_attn.bias_u"), "bias_v": t(p + "self_attn.bias_v")},
            "conv": {"pointwise_conv1": lin(p + "conv.pointwise_conv1", bias=b),
                     "depthwise_conv": conv(p + "conv.depthwise_conv", bias=b),
                     "norm": {"scale": t(p + "conv.norm.weight"), "bias": t(p + "conv.norm.bias")},
                     "pointwise_conv2": lin(p + "conv.pointwise_conv2", bias=b)},
            "norm_ff1": ln(p + "norm_feed_forward1"), "norm_attn": ln(p + "norm_self_att"),
            "norm_conv": ln(p + "norm_conv"), "norm_ff2": ln(p + "norm_feed_forward2"), "norm_out": ln(p + "norm_out"),
        }
        param_layers.append(blk)
        stats_layers.append({"conv": {"norm": {"mean": t(p + "conv.norm.running_mean"),
                                               "var": t(p + "conv.norm.running_var")}}})
    stats: dict = {}
    if config.scan_layers:
        params["layers"], stats["layers"] = stack_layers(param_layers), stack_layers(stats_layers)
    else:
        for i in range(config.num_layers):
            params[f"layers_{i}"], stats[f"layers_{i}"] = param_layers[i], stats_layers[i]
    if prefix:  # a CTC model
        head = {"kernel": keys.take("ctc_head.weight")[:, :, 0].T.astype(np.float32),
                "bias": keys.take("ctc_head.bias").astype(np.float32)}
        params, stats = {"encoder": params, "ctc_head": head}, {"encoder": stats}
    keys.finish()
    cast = lambda tree: jax.tree_util.tree_map(lambda x: jnp.asarray(x, pdt), tree)
    return {"params": cast(params), "batch_stats": jax.tree_util.tree_map(jnp.asarray, stats)}
