"""Whisper (encoder-decoder speech recognition) in Flax linen, numerically equal to transformers' PyTorch model.

Layout and conventions
----------------------
- Encoder input ``input_features``: log-mel features ``[B, n_mels, frames]`` (the layout of transformers' and
  openai-whisper's feature extractors) with ``frames == 2 * max_source_positions`` (3000 for every released model).
  Whisper does not mask the encoder: shorter audio is padded to 30 s *before* the log-mel (the feature extractor's
  job), exactly as transformers and openai-whisper do. ``[B, frames, n_mels]`` input is refused with a clear error
  rather than guessed.
- Decoder token masks follow transformers: ``attention_mask`` with 1 = real token, 0 = padding (right padding for
  teacher forcing; in cached decoding the mask covers the whole static cache length, so left padding works too).
- ``dtype`` is the compute dtype, ``param_dtype`` the storage dtype. Layer norms, softmaxes and the output logits
  are computed in float32 whatever ``dtype`` is.
- Every parameter carries logical axis names (``embed``, ``mlp``, ``heads``, ``kv``, ``vocab``, ``length``,
  ``layers``) through :func:`models.logical.partitioned`; ``nn.unbox`` (or
  :func:`flax.linen.meta.unbox`) gives plain arrays. Parameter names follow transformers (``self_attn/q_proj``,
  ``fc1``, ``encoder_attn_layer_norm`` ...), so the checkpoint mapping in :mod:`models.whisper_hf` is mechanical.
- ``remat=True`` wraps every layer in ``nn.remat`` (gradient checkpointing); ``scan_layers=True`` runs the layers
  with ``nn.scan`` and stores their parameters stacked on a leading ``layers`` axis. All four combinations compute
  the same numbers (tested). ``stack`` (:class:`models.layer_stack.StackOptions`) picks a remat policy and
  pipelines both layer stacks over stages (teacher forcing; cached decoding runs the layers unpipelined).
- Incremental decoding uses a static-size KV cache (see :func:`init_cache`): a dict of arrays
  ``self_k/self_v [layers, B, heads, max_length, head_dim]`` and ``cross_k/cross_v [layers, B, heads, frames,
  head_dim]`` (heads-major, so attention reads the cache without transposing it); a decode step writes at ``cache_index`` with ``lax.dynamic_update_slice`` so jit compiles one program
  per (batch, step length), not one per step.
- ``encoder.embed_positions`` (sinusoids) is kept as a parameter because checkpoints store it; transformers freezes
  it, and trainers should do the same (e.g. with an optax mask).
"""
from __future__ import annotations

import dataclasses
import json
import math
from typing import Any, Mapping, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from models.layer_stack import LayerStack, StackOptions
from models.logical import partitioned

Array = jax.Array
Dtype = Any
NEG_INF = float(np.finfo(np.float32).min)

# ----------------------------------------------------------------------------------------------------------------
# Configuration
# ----------------------------------------------------------------------------------------------------------------

_HF_FIELDS = (
    "vocab_size", "num_mel_bins", "d_model", "encoder_layers", "encoder_attention_heads", "encoder_ffn_dim",
    "decoder_layers", "decoder_attention_heads", "decoder_ffn_dim", "max_source_positions", "max_target_positions",
    "activation_function", "scale_embedding", "dropout", "attention_dropout", "activation_dropout",
    "pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id",
)


@dataclasses.dataclass(frozen=True)
class WhisperConfig:
    """Architecture of a Whisper model; field names and defaults as transformers' ``WhisperConfig``.

    ``extra_json`` keeps the other keys of a loaded ``config.json`` (suppress lists, forced ids ...) as a JSON
    string so that an export writes them back; it does not affect the network.
    """

    vocab_size: int = 51865
    num_mel_bins: int = 80
    d_model: int = 384
    encoder_layers: int = 4
    encoder_attention_heads: int = 6
    encoder_ffn_dim: int = 1536
    decoder_layers: int = 4
    decoder_attention_heads: int = 6
    decoder_ffn_dim: int = 1536
    max_source_positions: int = 1500
    max_target_positions: int = 448
    activation_function: str = "gelu"
    scale_embedding: bool = False
    dropout: float = 0.0
    attention_dropout: float = 0.0
    activation_dropout: float = 0.0
    pad_token_id: Optional[int] = 50256
    bos_token_id: Optional[int] = 50256
    eos_token_id: Optional[int] = 50256
    decoder_start_token_id: int = 50257
    layer_norm_eps: float = 1e-5
    extra_json: str = dataclasses.field(default="{}", compare=False)

    def __post_init__(self):
        for heads, name in ((self.encoder_attention_heads, "encoder"), (self.decoder_attention_heads, "decoder")):
            if heads <= 0 or self.d_model % heads:
                raise ValueError(f"d_model={self.d_model} is not divisible by {name}_attention_heads={heads}")
        for f in ("vocab_size", "num_mel_bins", "d_model", "encoder_layers", "decoder_layers", "encoder_ffn_dim",
                  "decoder_ffn_dim", "max_source_positions", "max_target_positions"):
            if int(getattr(self, f)) <= 0:
                raise ValueError(f"WhisperConfig.{f} must be positive, got {getattr(self, f)!r}")
        if self.d_model % 2:
            raise ValueError(f"d_model={self.d_model} must be even (sinusoidal positions)")
        if self.activation_function not in _ACTIVATIONS:
            raise ValueError(f"activation_function={self.activation_function!r}; supported: {sorted(_ACTIVATIONS)}")

    @property
    def num_frames(self) -> int:
        """Mel frames the encoder takes (two convolutions, the second with stride 2)."""
        return 2 * self.max_source_positions

    @classmethod
    def from_hf_dict(cls, d: Mapping[str, Any]) -> "WhisperConfig":
        """From a transformers ``config.json`` dict (unknown keys are kept in ``extra_json``)."""
        if d.get("model_type", "whisper") != "whisper":
            raise ValueError(f"not a Whisper config: model_type={d.get('model_type')!r}")
        kw = {k: d[k] for k in _HF_FIELDS if k in d}
        eos = kw.get("eos_token_id")
        if isinstance(eos, (list, tuple)):
            kw["eos_token_id"] = int(eos[0])
        extra = {k: v for k, v in d.items() if k not in _HF_FIELDS}
        return cls(**kw, extra_json=json.dumps(extra, sort_keys=True))

    def to_hf_dict(self) -> dict[str, Any]:
        """A ``config.json`` dict that transformers' ``WhisperForConditionalGeneration`` loads."""
        d = json.loads(self.extra_json)
        d.update({k: getattr(self, k) for k in _HF_FIELDS})
        d["model_type"] = "whisper"
        d.setdefault("architectures", ["WhisperForConditionalGeneration"])
        d["num_hidden_layers"] = self.encoder_layers
        d["tie_word_embeddings"] = True
        d["is_encoder_decoder"] = True
        return d

    @classmethod
    def preset(cls, name: str, **overrides) -> "WhisperConfig":
        """The architecture of a released checkpoint: tiny, base, small, medium, large (v1/v2), large-v3,
        large-v3-turbo; ``.en`` suffix for the English-only models (tiny .. medium)."""
        english = name.endswith(".en")
        base = name[:-3] if english else name
        dims = {"tiny": (384, 4, 4, 6), "base": (512, 6, 6, 8), "small": (768, 12, 12, 12),
                "medium": (1024, 24, 24, 16), "large": (1280, 32, 32, 20), "large-v2": (1280, 32, 32, 20),
                "large-v3": (1280, 32, 32, 20), "large-v3-turbo": (1280, 32, 4, 20)}
        if base not in dims or (english and base not in ("tiny", "base", "small", "medium")):
            raise ValueError(f"unknown Whisper preset {name!r}; known: {sorted(dims)} and tiny.en .. medium.en")
        d, enc, dec, heads = dims[base]
        v3 = base.startswith("large-v3")
        kw = dict(d_model=d, encoder_layers=enc, decoder_layers=dec, encoder_attention_heads=heads,
                  decoder_attention_heads=heads, encoder_ffn_dim=4 * d, decoder_ffn_dim=4 * d,
                  num_mel_bins=128 if v3 else 80, vocab_size=51864 if english else (51866 if v3 else 51865))
        if english:
            kw.update(pad_token_id=50256, bos_token_id=50256, eos_token_id=50256, decoder_start_token_id=50257)
        else:
            kw.update(pad_token_id=50256 if not v3 else 50257, bos_token_id=50257, eos_token_id=50257,
                      decoder_start_token_id=50258)
        kw.update(overrides)
        return cls(**kw)


def _gelu(x):
    return jax.nn.gelu(x, approximate=False)


_ACTIVATIONS = {
    "gelu": _gelu,
    "gelu_new": lambda x: jax.nn.gelu(x, approximate=True),
    "gelu_pytorch_tanh": lambda x: jax.nn.gelu(x, approximate=True),
    "relu": jax.nn.relu,
    "silu": jax.nn.silu,
    "swish": jax.nn.silu,
}


def sinusoids(length: int, channels: int, max_timescale: float = 10000.0) -> np.ndarray:
    """Whisper's encoder positions ``[length, channels]``: sin of the first half, cos of the second."""
    if channels % 2:
        raise ValueError(f"channels={channels} must be even")
    inc = math.log(max_timescale) / (channels // 2 - 1)
    inv = np.exp(-inc * np.arange(channels // 2, dtype=np.float32)).astype(np.float32)
    t = np.arange(length, dtype=np.float32)[:, None] * inv[None, :]
    return np.concatenate([np.sin(t), np.cos(t)], axis=1).astype(np.float32)


# ----------------------------------------------------------------------------------------------------------------
# Building blocks
# ----------------------------------------------------------------------------------------------------------------

_KERNEL_INIT = nn.initializers.normal(0.02)


class LayerNormF32(nn.Module):
    """Layer norm computed in float32 (output cast back to ``dtype``); params ``scale``/``bias`` [embed]."""

    epsilon: float = 1e-5
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32

    @nn.compact
    def __call__(self, x):
        d = x.shape[-1]
        scale = self.param("scale", partitioned(nn.initializers.ones_init(), ("embed",)), (d,), self.param_dtype)
        bias = self.param("bias", partitioned(nn.initializers.zeros_init(), ("embed",)), (d,), self.param_dtype)
        xf = x.astype(jnp.float32)
        mean = jnp.mean(xf, axis=-1, keepdims=True)
        var = jnp.mean(jnp.square(xf - mean), axis=-1, keepdims=True)
        y = (xf - mean) * jax.lax.rsqrt(var + self.epsilon)
        y = y * scale.astype(jnp.float32) + bias.astype(jnp.float32)
        return y.astype(self.dtype)


def _dense(features, names, *, dtype, param_dtype, name, axis=-1, use_bias=True):
    nfeat = 1 if isinstance(features, int) else len(features)
    return nn.DenseGeneral(features=features, axis=axis, use_bias=use_bias, dtype=dtype, param_dtype=param_dtype,
                           kernel_init=partitioned(_KERNEL_INIT, names),
                           bias_init=partitioned(nn.initializers.zeros_init(), tuple(names)[-nfeat:]), name=name)


def _query_chunks(lq: int, target: int = 512) -> int:
    """Number of equal query blocks of at most ``target`` rows (1 when ``lq`` is small or has no such divisor)."""
    if lq <= 2 * target:
        return 1
    for n in range(-(-lq // target), lq // 16 + 1):
        if lq % n == 0:
            return n
    return 1


def _attend(q, k, v, bias, dtype, dropout: Optional[nn.Dropout] = None):
    """q [B,Lq,H,D] (already scaled), k/v [B,H,Lk,D] (heads-major, the KV-cache layout, so that decoding never
    transposes the cache), bias broadcastable to [B,H,Lq,Lk] (float32). Returns [B,Lq,H,D].

    Scores and softmax are float32. Long unmasked queries (the encoder's 1500) are processed one (example, head) at
    a time in blocks of <= 512 rows (``lax.map``), with the softmax normalisation applied to the [rows, D] output
    instead of the [rows, Lk] probabilities: the score block stays in cache (unlike one [B, H, Lq, Lk] matrix or
    blocks over all heads), and memory is linear in the batch size."""
    qt = jnp.swapaxes(q, 1, 2)                                                                # [B, H, Lq, D]
    kt, vt = k.astype(q.dtype), v.astype(dtype)

    def block(qb, kb, vb, bias_b):
        w = jnp.einsum("...qd,...kd->...qk", qb, kb, preferred_element_type=jnp.float32)
        if bias_b is not None:
            w = w + bias_b
        p = jax.nn.softmax(w, axis=-1)
        if dropout is not None:
            p = dropout(p)
        return jnp.einsum("...qk,...kd->...qd", p.astype(dtype), vb,
                          preferred_element_type=jnp.float32).astype(dtype)

    b, h, lq, d = qt.shape
    n = _query_chunks(lq) if (bias is None and dropout is None) else 1
    if n == 1:
        return jnp.swapaxes(block(qt, kt, vt, bias), 1, 2)

    def head_block(qb, kb, vb):                       # [rows, D] x [Lk, D]: softmax normalised after P @ V
        w = jnp.einsum("qd,kd->qk", qb, kb, preferred_element_type=jnp.float32)
        e = jnp.exp(w - jax.lax.stop_gradient(jnp.max(w, axis=-1, keepdims=True)))
        o = jnp.einsum("qk,kd->qd", e.astype(dtype), vb, preferred_element_type=jnp.float32)
        return (o / jnp.sum(e, axis=-1, keepdims=True)).astype(dtype)

    def one_head(args):
        qe, ke, ve = args                                                                     # [L, D]
        return jax.lax.map(lambda qb: head_block(qb, ke, ve), qe.reshape(n, lq // n, d)).reshape(lq, d)

    flat = lambda x: x.reshape((b * h,) + x.shape[2:])
    out = jax.lax.map(one_head, (flat(qt), flat(kt), flat(vt))).reshape(b, h, lq, d)
    return jnp.swapaxes(out, 1, 2)


class WhisperAttention(nn.Module):
    """Multi-head attention with transformers' Whisper parameterisation (``k_proj`` has no bias; the query is
    scaled by ``head_dim ** -0.5`` after its projection, bias included). Kernels: q/k/v ``[embed, heads, kv]``,
    out ``[heads, kv, embed]``."""

    embed_dim: int
    num_heads: int
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32
    attention_dropout: float = 0.0
    deterministic: bool = True

    def setup(self):
        kw = dict(dtype=self.dtype, param_dtype=self.param_dtype)
        hd = (self.num_heads, self.embed_dim // self.num_heads)
        names = ("embed", "heads", "kv")
        self.q_proj = _dense(hd, names, use_bias=True, name="q_proj", **kw)
        self.k_proj = _dense(hd, names, use_bias=False, name="k_proj", **kw)
        self.v_proj = _dense(hd, names, use_bias=True, name="v_proj", **kw)
        self.out_proj = _dense(self.embed_dim, ("heads", "kv", "embed"), axis=(-2, -1), name="out_proj", **kw)
        self.drop = nn.Dropout(self.attention_dropout, deterministic=self.deterministic)

    def query(self, x):
        q = self.q_proj(x)
        return q * jnp.asarray(q.shape[-1] ** -0.5, q.dtype)

    def keys_values(self, x):
        """Keys and values of ``x [B, L, embed]`` in the heads-major layout ``[B, H, L, Dh]``."""
        return jnp.swapaxes(self.k_proj(x), 1, 2), jnp.swapaxes(self.v_proj(x), 1, 2)

    def __call__(self, q, k, v, bias):
        drop = self.drop if self.attention_dropout > 0.0 and not self.deterministic else None
        return self.out_proj(_attend(q, k, v, bias, self.dtype, drop))


def _mlp(module: nn.Module, x, ffn_dim: int):
    """fc1 -> activation -> dropout -> fc2, parameters created in ``module`` (a compact layer)."""
    c = module.config
    kw = dict(dtype=module.dtype, param_dtype=module.param_dtype)
    h = _dense(ffn_dim, ("embed", "mlp"), name="fc1", **kw)(x)
    h = _ACTIVATIONS[c.activation_function](h)
    h = nn.Dropout(c.activation_dropout, deterministic=module.deterministic)(h)
    return _dense(x.shape[-1], ("mlp", "embed"), name="fc2", **kw)(h)


class WhisperEncoderLayer(nn.Module):
    config: WhisperConfig
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32
    deterministic: bool = True

    @nn.compact
    def __call__(self, x, _unused=None):
        c = self.config
        kw = dict(dtype=self.dtype, param_dtype=self.param_dtype)
        ln = lambda name: LayerNormF32(c.layer_norm_eps, name=name, **kw)
        drop = nn.Dropout(c.dropout, deterministic=self.deterministic)
        attn = WhisperAttention(c.d_model, c.encoder_attention_heads, attention_dropout=c.attention_dropout,
                                deterministic=self.deterministic, name="self_attn", **kw)
        h = ln("self_attn_layer_norm")(x)
        k, v = attn.keys_values(h)
        x = x + drop(attn(attn.query(h), k, v, None))
        h = ln("final_layer_norm")(x)
        x = x + drop(_mlp(self, h, c.encoder_ffn_dim))
        x = nn.with_logical_constraint(x, ("batch", "length", "embed"))
        return x, None


class WhisperDecoderLayer(nn.Module):
    """One decoder layer. ``cache`` (per layer) is None for teacher forcing, else a dict with ``self_k/self_v``
    ``[B, H, S, Dh]`` and, unless ``encoder_hidden`` is given, ``cross_k/cross_v``."""

    config: WhisperConfig
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32
    deterministic: bool = True

    @nn.compact
    def __call__(self, x, cache, encoder_hidden, self_bias, cache_index):
        c = self.config
        kw = dict(dtype=self.dtype, param_dtype=self.param_dtype)
        ln = lambda name: LayerNormF32(c.layer_norm_eps, name=name, **kw)
        drop = nn.Dropout(c.dropout, deterministic=self.deterministic)
        mk_attn = lambda name: WhisperAttention(c.d_model, c.decoder_attention_heads, attention_dropout=c.attention_dropout,
                                                deterministic=self.deterministic, name=name, **kw)
        self_attn, cross_attn = mk_attn("self_attn"), mk_attn("encoder_attn")

        h = ln("self_attn_layer_norm")(x)
        q = self_attn.query(h)
        k, v = self_attn.keys_values(h)
        written = None
        if cache is not None:
            # attend over the cache with this step's keys written in; return only the new keys/values (the
            # decoder writes them into the stacked cache, so the big buffers are never copied per layer)
            zero = jnp.zeros((), jnp.int32)
            idx = (zero, zero, jnp.asarray(cache_index, jnp.int32), zero)
            dt = cache["self_k"].dtype
            written = {"self_k": k.astype(dt), "self_v": v.astype(dt)}
            k = jax.lax.dynamic_update_slice(cache["self_k"], written["self_k"], idx)
            v = jax.lax.dynamic_update_slice(cache["self_v"], written["self_v"], idx)
        x = x + drop(self_attn(q, k, v, self_bias))

        h = ln("encoder_attn_layer_norm")(x)
        q = cross_attn.query(h)
        if encoder_hidden is not None:
            ck, cv = cross_attn.keys_values(encoder_hidden)
            if written is not None:
                written["cross_k"] = ck.astype(written["self_k"].dtype)
                written["cross_v"] = cv.astype(written["self_k"].dtype)
        else:
            if cache is None or "cross_k" not in cache:
                raise ValueError("decoder needs encoder_hidden or a cache holding cross_k/cross_v")
            ck, cv = cache["cross_k"], cache["cross_v"]
        x = x + drop(cross_attn(q, ck, cv, None))

        h = ln("final_layer_norm")(x)
        x = x + drop(_mlp(self, h, c.decoder_ffn_dim))
        x = nn.with_logical_constraint(x, ("batch", "length", "embed"))
        return x, written


def _layer_stack(module, layer_cls, n, in_axes, rows) -> LayerStack:
    kwargs = (("config", module.config), ("dtype", module.dtype), ("param_dtype", module.param_dtype),
              ("deterministic", module.deterministic))
    return LayerStack(layer_cls, n, kwargs, module.stack, remat=module.remat, scan=module.scan_layers,
                      in_axes=in_axes, rows=rows)


class WhisperEncoder(nn.Module):
    config: WhisperConfig
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32
    remat: bool = False
    scan_layers: bool = False
    deterministic: bool = True
    stack: StackOptions = StackOptions()

    def setup(self):
        c = self.config
        kw = dict(dtype=self.dtype, param_dtype=self.param_dtype)
        conv = lambda stride, name: nn.Conv(c.d_model, (3,), strides=(stride,), padding=((1, 1),), name=name,
                                            kernel_init=partitioned(_KERNEL_INIT, (None, None, "embed")),
                                            bias_init=partitioned(nn.initializers.zeros_init(), ("embed",)), **kw)
        self.conv1 = conv(1, "conv1")
        self.conv2 = conv(2, "conv2")
        self.embed_positions = self.param(
            "embed_positions",
            partitioned(lambda key, shape, dtype: jnp.asarray(sinusoids(*shape), dtype), ("length", "embed")),
            (c.max_source_positions, c.d_model), self.param_dtype)
        self.plan = _layer_stack(self, WhisperEncoderLayer, c.encoder_layers, (nn.broadcast,), (False,))
        self.layers = self.plan.build()
        self.layer_norm = LayerNormF32(c.layer_norm_eps, **kw)
        self.drop = nn.Dropout(c.dropout, deterministic=self.deterministic)

    def __call__(self, input_features):
        c = self.config
        if input_features.ndim != 3:
            raise ValueError(f"input_features must be [batch, n_mels, frames], got shape {input_features.shape}")
        if input_features.shape[1] != c.num_mel_bins:
            hint = (" (it looks like [batch, frames, n_mels]: transpose it)"
                    if input_features.shape[2] == c.num_mel_bins else "")
            raise ValueError(f"input_features must be [batch, n_mels={c.num_mel_bins}, frames], got shape "
                             f"{input_features.shape}{hint}")
        if input_features.shape[2] != c.num_frames:
            raise ValueError(f"Whisper takes exactly {c.num_frames} mel frames (30 s), got {input_features.shape[2]};"
                             " pad the audio/features to 30 s, or use the long-form chunkers for longer audio")
        x = jnp.swapaxes(input_features, 1, 2).astype(self.dtype)          # [B, T, n_mels]
        x = _gelu(self.conv1(x))
        x = _gelu(self.conv2(x))
        x = x + self.embed_positions.astype(self.dtype)[None]
        x = self.drop(x)
        x = nn.with_logical_constraint(x, ("batch", "length", "embed"))
        x, _ = self.plan(self, self.layers, x, None)
        return self.layer_norm(x)


class WhisperDecoder(nn.Module):
    config: WhisperConfig
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32
    remat: bool = False
    scan_layers: bool = False
    deterministic: bool = True
    stack: StackOptions = StackOptions()

    def setup(self):
        c = self.config
        kw = dict(dtype=self.dtype, param_dtype=self.param_dtype)
        self.embed_tokens = self.param("embed_tokens", partitioned(_KERNEL_INIT, ("vocab", "embed")),
                                       (c.vocab_size, c.d_model), self.param_dtype)
        self.embed_positions = self.param("embed_positions", partitioned(_KERNEL_INIT, ("length", "embed")),
                                          (c.max_target_positions, c.d_model), self.param_dtype)
        self.plan = _layer_stack(self, WhisperDecoderLayer, c.decoder_layers,
                                 (0, nn.broadcast, nn.broadcast, nn.broadcast), (False, True, True, False))
        self.layers = self.plan.build()
        self.layer_norm = LayerNormF32(c.layer_norm_eps, **kw)
        self.drop = nn.Dropout(c.dropout, deterministic=self.deterministic)

    def __call__(self, input_ids, encoder_hidden=None, attention_mask=None, cache=None, cache_index=None):
        """Logits ``[B, L, vocab]`` (float32) and the updated cache (None without a cache).

        Without ``cache`` (teacher forcing): positions ``0..L-1``, causal self-attention, ``attention_mask [B, L]``
        (1 = token, 0 = padding) masks padded keys. With ``cache``: the L tokens sit at positions
        ``cache_index .. cache_index+L-1``; ``attention_mask`` (optional) is ``[B, S]`` over the whole cache.
        """
        c = self.config
        if input_ids.ndim != 2:
            raise ValueError(f"input_ids must be [batch, length], got shape {input_ids.shape}")
        b, length = input_ids.shape
        if cache is None:
            if length > c.max_target_positions:
                raise ValueError(f"{length} decoder tokens > max_target_positions={c.max_target_positions}")
            pos = jnp.arange(length)
            q_pos, k_pos = pos, pos
            start = 0
        else:
            s = cache["self_k"].shape[3]
            if s > c.max_target_positions:
                raise ValueError(f"cache length {s} > max_target_positions={c.max_target_positions}")
            if cache_index is None:
                raise ValueError("cached decoding needs cache_index (number of tokens already in the cache)")
            start = jnp.asarray(cache_index, jnp.int32)
            q_pos = start + jnp.arange(length)
            k_pos = jnp.arange(s)
        allowed = k_pos[None, :] <= q_pos[:, None]                                 # [Lq, Lk] causal
        allowed = allowed[None, None]
        if attention_mask is not None:
            want = (length if cache is None else cache["self_k"].shape[3])
            if attention_mask.shape != (b, want):
                raise ValueError(f"attention_mask must be [batch={b}, {want}], got {attention_mask.shape}")
            allowed = allowed & (attention_mask[:, None, None, :] > 0)
        self_bias = jnp.where(allowed, 0.0, NEG_INF).astype(jnp.float32)

        emb = jnp.take(self.embed_tokens, input_ids, axis=0).astype(self.dtype)
        if c.scale_embedding:
            emb = emb * jnp.asarray(math.sqrt(c.d_model), self.dtype)
        if cache is None:
            positions = self.embed_positions[:length]
        else:
            positions = jax.lax.dynamic_slice_in_dim(self.embed_positions, start, length, axis=0)
        x = self.drop(emb + positions.astype(self.dtype)[None])
        x = nn.with_logical_constraint(x, ("batch", "length", "embed"))
        if encoder_hidden is not None:
            encoder_hidden = encoder_hidden.astype(self.dtype)

        x, written = self.plan(self, self.layers, x, cache, encoder_hidden, self_bias, start)
        new_cache = None
        if cache is not None:
            zero = jnp.zeros((), jnp.int32)
            idx = (zero, zero, zero, start, zero)
            new_cache = dict(cache)
            new_cache["self_k"] = jax.lax.dynamic_update_slice(cache["self_k"], written["self_k"], idx)
            new_cache["self_v"] = jax.lax.dynamic_update_slice(cache["self_v"], written["self_v"], idx)
            if encoder_hidden is not None:
                new_cache["cross_k"], new_cache["cross_v"] = written["cross_k"], written["cross_v"]
        x = self.layer_norm(x)
        logits = jnp.einsum("bld,vd->blv", x, self.embed_tokens.astype(self.dtype),
                            preferred_element_type=jnp.float32)
        logits = nn.with_logical_constraint(logits, ("batch", "length", "vocab"))
        return logits.astype(jnp.float32), new_cache


class WhisperModel(nn.Module):
    """Whisper encoder-decoder with a tied output embedding (transformers' ``WhisperForConditionalGeneration``).

    Methods (use with ``model.apply(params, ..., method=...)``): ``__call__`` (features + decoder ids -> logits),
    ``encode``, ``decode`` (teacher forcing, or one cached step).
    """

    config: WhisperConfig
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32
    remat: bool = False
    scan_layers: bool = False
    deterministic: bool = True
    stack: StackOptions = StackOptions()

    def setup(self):
        kw = dict(config=self.config, dtype=self.dtype, param_dtype=self.param_dtype, remat=self.remat,
                  scan_layers=self.scan_layers, deterministic=self.deterministic, stack=self.stack)
        self.encoder = WhisperEncoder(**kw)
        self.decoder = WhisperDecoder(**kw)

    def encode(self, input_features):
        """``[B, n_mels, 2*max_source_positions]`` log-mel -> ``[B, max_source_positions, d_model]``."""
        return self.encoder(input_features)

    def decode(self, input_ids, encoder_hidden=None, attention_mask=None, cache=None, cache_index=None):
        return self.decoder(input_ids, encoder_hidden, attention_mask, cache, cache_index)

    def __call__(self, input_features, decoder_input_ids, decoder_attention_mask=None):
        """Teacher-forced logits ``[B, L, vocab]`` (float32); ``decoder_attention_mask`` 1 = token, 0 = pad."""
        enc = self.encode(input_features)
        logits, _ = self.decoder(decoder_input_ids, enc, decoder_attention_mask)
        return logits


def init_cache(config: WhisperConfig, batch_size: int, max_length: int, dtype: Dtype = jnp.float32,
               encoder_length: Optional[int] = None) -> dict[str, Array]:
    """A zero KV cache of static size: ``self_k/self_v [layers, B, heads, max_length, head_dim]`` and
    ``cross_k/cross_v [layers, B, heads, encoder_length, head_dim]`` (filled by the first cached decode step, the
    one given ``encoder_hidden``)."""
    if max_length > config.max_target_positions:
        raise ValueError(f"max_length={max_length} > max_target_positions={config.max_target_positions}")
    h = config.decoder_attention_heads
    dh = config.d_model // h
    t = config.max_source_positions if encoder_length is None else encoder_length
    nl = config.decoder_layers
    z = lambda n: jnp.zeros((nl, batch_size, h, n, dh), dtype)
    return {"self_k": z(max_length), "self_v": z(max_length), "cross_k": z(t), "cross_v": z(t)}


def init_params(model: WhisperModel, rng: Array, batch_size: int = 1, decoder_length: int = 4):
    """Random parameters (boxed with logical axis names; ``nn.unbox`` for plain arrays)."""
    c = model.config
    feats = jnp.zeros((batch_size, c.num_mel_bins, c.num_frames), jnp.float32)
    ids = jnp.zeros((batch_size, decoder_length), jnp.int32)
    return jax.jit(model.init)(rng, feats, ids)["params"]
