"""Transformer building blocks shared by the speech models, a plain Transformer encoder, and a Transformer decoder.

Conventions (see DESIGN.md):
- ``paddings`` arrays: 1.0 = padded, 0.0 = valid, shape ``[B, T]``; valid frames come first.
- ``dtype`` is the compute dtype, ``param_dtype`` the storage dtype; layer norms, softmaxes and logits are float32.
- Every parameter carries logical axis names (``embed``, ``mlp``, ``heads``, ``kv``, ``vocab``, ``layers`` ...)
  through :func:`models.logical.partitioned`; ``nn.unbox`` gives plain arrays.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from models.layer_stack import LayerStack, StackOptions
from models.logical import constrain, partitioned

Dtype = Any
NEG_INF = float(np.finfo(np.float32).min)


# --------------------------------------------------------------------------------------------------------------------
# Small helpers
# --------------------------------------------------------------------------------------------------------------------

def canonical_dtype(x: Any, what: str = "dtype") -> jnp.dtype:
    """``'float32'``/``'bfloat16'``/``jnp.float32``... -> a numpy dtype; anything else is a ValueError naming ``what``."""
    try:
        dt = jnp.dtype(x)
    except TypeError as e:
        raise ValueError(f"{what}={x!r} is not a dtype") from e
    if dt not in (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
        raise ValueError(f"{what}={x!r}: expected float32, bfloat16 or float16")
    return dt


def dense(features: int | Sequence[int], names: Sequence[str | None], *, dtype: Dtype, param_dtype: Dtype,
          axis: int | Sequence[int] = -1, use_bias: bool = True, name: str | None = None,
          kernel_init: Callable = nn.initializers.lecun_normal()) -> nn.DenseGeneral:
    """``nn.DenseGeneral`` with logical names on kernel (``names``) and bias (the trailing output names)."""
    nfeat = 1 if isinstance(features, int) else len(features)
    return nn.DenseGeneral(
        features=features, axis=axis, use_bias=use_bias, dtype=dtype, param_dtype=param_dtype,
        kernel_init=partitioned(kernel_init, names),
        bias_init=partitioned(nn.initializers.zeros_init(), tuple(names)[-nfeat:]),
        name=name)


def layer_norm(*, epsilon: float, param_dtype: Dtype, name: str | None = None) -> nn.LayerNorm:
    """A LayerNorm computed in float32 (callers cast the result back to the compute dtype)."""
    return nn.LayerNorm(epsilon=epsilon, dtype=jnp.float32, param_dtype=param_dtype,
                        scale_init=partitioned(nn.initializers.ones_init(), ("embed",)),
                        bias_init=partitioned(nn.initializers.zeros_init(), ("embed",)), name=name)


def lengths_from_paddings(paddings: jax.Array) -> jax.Array:
    """Number of valid frames per row (int32) of a ``[B, T]`` paddings array."""
    return jnp.sum(1.0 - paddings.astype(jnp.float32), axis=-1).round().astype(jnp.int32)


def paddings_from_lengths(lengths: jax.Array, max_len: int) -> jax.Array:
    """``[B, max_len]`` float32 paddings (1.0 = padded) for row lengths."""
    return (jnp.arange(max_len)[None, :] >= lengths[:, None]).astype(jnp.float32)


def check_features(features: jax.Array, paddings: jax.Array, input_dim: int | None = None,
                   what: str = "features") -> None:
    """Static shape checks with errors that name the input."""
    if features.ndim != 3:
        raise ValueError(f"{what} must be [batch, frames, dim], got shape {features.shape}")
    if input_dim is not None and features.shape[-1] != input_dim:
        raise ValueError(f"{what} has feature dim {features.shape[-1]}, the config says input_dim={input_dim}")
    if not jnp.issubdtype(features.dtype, jnp.floating):
        raise ValueError(f"{what} must be floating point, got {features.dtype}")
    if paddings.shape != features.shape[:2]:
        raise ValueError(f"{what}_paddings must be [batch, frames] = {features.shape[:2]}, got {paddings.shape}")


def sinusoidal_positions(positions: np.ndarray | int, dim: int) -> np.ndarray:
    """Sinusoidal encodings ``[len(positions), dim]`` as in "Attention is all you need" / ESPnet / WeNet:
    ``pe[:, 2i] = sin(p / 10000^(2i/dim))``, ``pe[:, 2i+1] = cos(...)``. ``positions`` may be negative (relative
    positions); an int ``n`` means ``0..n-1``. Computed with numpy: shapes are static."""
    if dim % 2:
        raise ValueError(f"sinusoidal positions need an even dim, got {dim}")
    pos = np.arange(positions) if np.isscalar(positions) else np.asarray(positions)
    inv_freq = 1.0 / (10000.0 ** (np.arange(0, dim, 2, dtype=np.float64) / dim))
    ang = pos.astype(np.float64)[:, None] * inv_freq[None, :]
    return np.stack([np.sin(ang), np.cos(ang)], axis=-1).reshape(len(pos), dim).astype(np.float32)


# --------------------------------------------------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------------------------------------------------

_ACTIVATIONS = {"relu": nn.relu, "gelu": nn.gelu, "silu": nn.silu, "swish": nn.silu}


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
    """A Transformer encoder or decoder stack (frozen, hashable).

    ``normalize_before=True`` is the pre-norm layout (ESPnet/WeNet default, ``torch`` ``norm_first=True``) with a
    final LayerNorm after the stack; ``False`` is the post-norm layout of the original paper (no final norm).
    For a decoder, ``vocab_size`` is the output size (and the token embedding size); the token ids ``sos_id`` /
    ``eos_id`` are the model's (AED) business, not the decoder's.
    """
    d_model: int = 256
    num_heads: int = 4
    num_layers: int = 6
    ff_dim: int = 2048
    activation: str = "relu"
    dropout_rate: float = 0.1
    attention_dropout_rate: float = 0.0
    ff_dropout_rate: float = 0.0
    normalize_before: bool = True
    layer_norm_eps: float = 1e-5
    use_bias: bool = True
    vocab_size: int = 0               # decoder only
    scale_embedding: bool = True      # decoder: token embedding * sqrt(d_model) before adding positions (ESPnet)
    positions: str = "sinusoidal"     # "sinusoidal" or "none"
    dtype: Any = "float32"
    param_dtype: Any = "float32"
    remat: bool = False
    scan_layers: bool = False

    def __post_init__(self):
        def bad(field, msg):
            raise ValueError(f"TransformerConfig.{field}={getattr(self, field)!r}: {msg}")
        for f in ("d_model", "num_heads", "num_layers", "ff_dim"):
            if not isinstance(getattr(self, f), int) or getattr(self, f) < 1:
                bad(f, "must be a positive int")
        if self.d_model % self.num_heads:
            bad("d_model", f"must be divisible by num_heads={self.num_heads}")
        if self.activation not in _ACTIVATIONS:
            bad("activation", f"must be one of {sorted(_ACTIVATIONS)}")
        if self.positions not in ("sinusoidal", "none"):
            bad("positions", "must be 'sinusoidal' or 'none'")
        if self.positions == "sinusoidal" and self.d_model % 2:
            bad("d_model", "must be even for sinusoidal positions")
        for f in ("dropout_rate", "attention_dropout_rate", "ff_dropout_rate"):
            if not 0.0 <= getattr(self, f) < 1.0:
                bad(f, "must be in [0, 1)")
        canonical_dtype(self.dtype, "TransformerConfig.dtype")
        canonical_dtype(self.param_dtype, "TransformerConfig.param_dtype")

    @property
    def compute_dtype(self):
        return canonical_dtype(self.dtype)

    @property
    def params_dtype(self):
        return canonical_dtype(self.param_dtype)

    @property
    def head_dim(self) -> int:
        return self.d_model // self.num_heads

    def replace(self, **kw) -> "TransformerConfig":
        return dataclasses.replace(self, **kw)

    @classmethod
    def tiny(cls, vocab_size: int = 0, **kw) -> "TransformerConfig":
        base = dict(d_model=32, num_heads=4, num_layers=2, ff_dim=64)
        return cls(vocab_size=vocab_size, **{**base, **kw})

    @classmethod
    def demo(cls, vocab_size: int = 0, **kw) -> "TransformerConfig":
        base = dict(d_model=144, num_heads=4, num_layers=2, ff_dim=576, dropout_rate=0.1)
        return cls(vocab_size=vocab_size, **{**base, **kw})


# --------------------------------------------------------------------------------------------------------------------
# Attention and feed-forward
# --------------------------------------------------------------------------------------------------------------------

class MultiHeadAttention(nn.Module):
    """Scaled dot-product multi-head attention; ``kv`` and ``attend`` are separate so that keys/values can be cached.

    Masks are boolean, broadcastable to ``[B, heads, Tq, Tk]``, True = may attend. Scores and softmax in float32.
    """
    config: TransformerConfig
    deterministic: bool = True

    def setup(self):
        cfg = self.config
        kw = dict(dtype=cfg.compute_dtype, param_dtype=cfg.params_dtype, use_bias=cfg.use_bias)
        shape = (cfg.num_heads, cfg.head_dim)
        self.q_proj = dense(shape, ("embed", "heads", "kv"), **kw)
        self.k_proj = dense(shape, ("embed", "heads", "kv"), **kw)
        self.v_proj = dense(shape, ("embed", "heads", "kv"), **kw)
        self.o_proj = dense(cfg.d_model, ("heads", "kv", "embed"), axis=(-2, -1), **kw)
        self.dropout = nn.Dropout(cfg.attention_dropout_rate, deterministic=self.deterministic)

    def kv(self, x):
        """``[B,T,D]`` -> keys, values ``[B,T,H,Dh]``."""
        return self.k_proj(x), self.v_proj(x)

    def attend(self, x, k, v, mask):
        q = self.q_proj(x)
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k, preferred_element_type=jnp.float32)
        scores = jnp.where(mask, scores * (1.0 / math.sqrt(self.config.head_dim)), NEG_INF)
        probs = self.dropout(jax.nn.softmax(scores, axis=-1))
        out = jnp.einsum("bhqk,bkhd->bqhd", probs.astype(self.config.compute_dtype), v)
        return self.o_proj(out)

    def __call__(self, x, kv_input, mask):
        k, v = self.kv(kv_input)
        return self.attend(x, k, v, mask)


class PositionwiseFeedForward(nn.Module):
    config: TransformerConfig
    deterministic: bool = True

    @nn.compact
    def __call__(self, x):
        cfg = self.config
        kw = dict(dtype=cfg.compute_dtype, param_dtype=cfg.params_dtype, use_bias=cfg.use_bias)
        h = _ACTIVATIONS[cfg.activation](dense(cfg.ff_dim, ("embed", "mlp"), name="linear1", **kw)(x))
        h = constrain(h, ("batch", "length", "mlp"))
        h = nn.Dropout(cfg.ff_dropout_rate, deterministic=self.deterministic)(h)
        return dense(cfg.d_model, ("mlp", "embed"), name="linear2", **kw)(h)


def _norm(cfg, name):
    return layer_norm(epsilon=cfg.layer_norm_eps, param_dtype=cfg.params_dtype, name=name)


def _sublayer(cfg, norm, fn, x, drop):
    """Residual sub-layer in pre-norm (``x + f(LN(x))``) or post-norm (``LN(x + f(x))``) layout."""
    dt = cfg.compute_dtype
    if cfg.normalize_before:
        return x + drop(fn(norm(x).astype(dt)))
    return norm(x + drop(fn(x))).astype(dt)


def stacked(module: nn.Module, block_cls, cfg, deterministic: bool, carry, per_layer, *broadcast_args, name="layers",
            stack: StackOptions = StackOptions(), rows: tuple = (), **block_kw):
    """Run ``cfg.num_layers`` blocks ``(carry, per_layer_i, *broadcast) -> (carry, out_i)`` of `module` (call inside
    its compact method) through :class:`models.layer_stack.LayerStack`: nn.remat / nn.scan as configured, pipelined
    when ``stack.stages > 1`` and ``per_layer`` is None. ``per_layer`` (a pytree or None) and the returned outputs
    carry the layer axis at position 1 (batch stays first, so that beam search can reorder states along axis 0);
    ``rows`` flags the broadcast arguments whose leading axis is the batch. Parameters: under ``name`` with a leading
    "layers" axis when scanned, else under ``{name}_{i}``."""
    kwargs = (("config", cfg), ("deterministic", deterministic)) + tuple(block_kw.items())
    plan = LayerStack(block_cls, cfg.num_layers, kwargs, stack, remat=cfg.remat, scan=cfg.scan_layers,
                      in_axes=(1,) + (nn.broadcast,) * len(broadcast_args),
                      rows=(False,) + (tuple(rows) or (False,) * len(broadcast_args)), out_axis=1, name=name)
    return plan(module, plan.build(), carry, per_layer, *broadcast_args)


# --------------------------------------------------------------------------------------------------------------------
# Encoder
# --------------------------------------------------------------------------------------------------------------------

class TransformerEncoderLayer(nn.Module):
    config: TransformerConfig
    deterministic: bool = True

    @nn.compact
    def __call__(self, x, _unused, mask):
        cfg = self.config
        drop = nn.Dropout(cfg.dropout_rate, deterministic=self.deterministic)
        attn = MultiHeadAttention(cfg, self.deterministic, name="self_attn")
        x = _sublayer(cfg, _norm(cfg, "norm1"), lambda h: attn(h, h, mask), x, drop)
        x = _sublayer(cfg, _norm(cfg, "norm2"), PositionwiseFeedForward(cfg, self.deterministic, name="ff"), x, drop)
        return constrain(x, ("batch", "length", "embed")), None


class TransformerEncoder(nn.Module):
    """A plain Transformer encoder over already-embedded frames:
    ``(x [B,T,D], paddings [B,T], train) -> (y [B,T,D], paddings)``. With ``positions="sinusoidal"`` absolute
    sinusoidal positions are added first (scale the input yourself, e.g. the front end's ``xscale``). ``stack``:
    remat policy and pipeline stages of the layer stack."""
    config: TransformerConfig
    stack: StackOptions = StackOptions()

    @nn.compact
    def __call__(self, x, paddings, train: bool = False):
        cfg = self.config
        check_features(x, paddings, cfg.d_model, what="x")
        dt = cfg.compute_dtype
        if cfg.positions == "sinusoidal":
            x = x + jnp.asarray(sinusoidal_positions(x.shape[1], cfg.d_model), x.dtype)
        x = nn.Dropout(cfg.dropout_rate, deterministic=not train)(x).astype(dt)
        mask = (paddings < 0.5)[:, None, None, :]
        x, _ = stacked(self, TransformerEncoderLayer, cfg, not train, x, None, mask, stack=self.stack, rows=(True,))
        if cfg.normalize_before:
            x = _norm(cfg, "final_norm")(x).astype(dt)
        return x, paddings


# --------------------------------------------------------------------------------------------------------------------
# Decoder with a static KV cache
# --------------------------------------------------------------------------------------------------------------------

class TransformerDecoderLayer(nn.Module):
    """Causal self-attention + cross-attention + FFN. ``mode`` (static) selects what the call does:

    - ``"full"``: teacher forcing over all positions; ``state`` is None, returns None.
    - ``"prefill"``: computes this layer's cross-attention keys/values from ``memory`` and an empty self-attention
      cache of ``max_len`` positions; returns the layer state ``{self_k, self_v, cross_k, cross_v}`` (batch first).
    - ``"step"``: one new position ``index`` (``x`` is ``[B,1,D]``), reads/updates the cached state.
    """
    config: TransformerConfig
    deterministic: bool = True
    mode: str = "full"
    max_len: int = 0

    def setup(self):
        cfg = self.config
        self.self_attn = MultiHeadAttention(cfg, self.deterministic)
        self.cross_attn = MultiHeadAttention(cfg, self.deterministic)
        self.ff = PositionwiseFeedForward(cfg, self.deterministic)
        self.norm1, self.norm2, self.norm3 = _norm(cfg, None), _norm(cfg, None), _norm(cfg, None)
        self.drop = nn.Dropout(cfg.dropout_rate, deterministic=self.deterministic)

    def __call__(self, x, state, memory, memory_valid, index):
        cfg = self.config
        mem_mask = memory_valid[:, None, None, :]
        if self.mode == "prefill":
            ck, cv = self.cross_attn.kv(memory)
            b = memory.shape[0]
            z = jnp.zeros((b, self.max_len, cfg.num_heads, cfg.head_dim), cfg.compute_dtype)
            return x, {"self_k": z, "self_v": z, "cross_k": ck, "cross_v": cv}
        if self.mode == "full":
            t = x.shape[1]
            causal = jnp.tril(jnp.ones((t, t), bool))[None, None]
            x = _sublayer(cfg, self.norm1, lambda h: self.self_attn(h, h, causal), x, self.drop)
            x = _sublayer(cfg, self.norm2, lambda h: self.cross_attn(h, memory, mem_mask), x, self.drop)
            x = _sublayer(cfg, self.norm3, self.ff, x, self.drop)
            return constrain(x, ("batch", "length", "embed")), None
        # step
        new_state = dict(state)

        def self_attend(h):
            k, v = self.self_attn.kv(h)
            sk = jax.lax.dynamic_update_slice_in_dim(state["self_k"], k.astype(state["self_k"].dtype), index, 1)
            sv = jax.lax.dynamic_update_slice_in_dim(state["self_v"], v.astype(state["self_v"].dtype), index, 1)
            new_state["self_k"], new_state["self_v"] = sk, sv
            mask = (jnp.arange(sk.shape[1]) <= index)[None, None, None, :]
            return self.self_attn.attend(h, sk, sv, mask)

        x = _sublayer(cfg, self.norm1, self_attend, x, self.drop)
        x = _sublayer(cfg, self.norm2, lambda h: self.cross_attn.attend(h, state["cross_k"], state["cross_v"],
                                                                           mem_mask), x, self.drop)
        x = _sublayer(cfg, self.norm3, self.ff, x, self.drop)
        return x, new_state


class TransformerDecoder(nn.Module):
    """Token embedding + sinusoidal positions + N decoder layers (+ final norm) + output projection.

    - ``__call__(tokens [B,U] int, memory [B,T,D], memory_paddings [B,T], train)`` -> logits ``[B,U,V]`` float32
      (teacher forcing; position u sees tokens 0..u).
    - ``init_state(memory, memory_paddings, max_len)`` -> decoding state (a pytree, batch on axis 0 of every leaf):
      the cross-attention keys/values of every layer and an empty ``max_len``-position self-attention cache.
    - ``step(tokens [B] int, index (int scalar), state)`` -> ``(logits [B,V] float32, state)``: the token at position
      ``index``; equals ``__call__``'s logits at that position.

    ``stack`` (remat policy, pipeline stages) applies to teacher forcing; cached decoding runs the layers unpipelined.
    """
    config: TransformerConfig
    stack: StackOptions = StackOptions()

    def init_state(self, memory, memory_paddings, max_len: int):
        return self(None, memory, memory_paddings, mode="prefill", max_len=max_len)

    def step(self, tokens, index, state):
        return self(tokens, mode="step", state=state, index=index)

    @nn.compact
    def __call__(self, tokens, memory=None, memory_paddings=None, train: bool = False, *, mode: str = "full",
                 state=None, index=None, max_len: int = 0):
        cfg = self.config
        dt = cfg.compute_dtype
        if cfg.vocab_size < 1:
            raise ValueError("TransformerDecoder needs TransformerConfig.vocab_size >= 1")
        if mode in ("full", "prefill"):
            check_features(memory, memory_paddings, cfg.d_model, what="memory")
        emb = self.param("embedding", partitioned(nn.initializers.normal(1.0), ("vocab", "embed")),
                         (cfg.vocab_size, cfg.d_model), cfg.params_dtype)

        def table(n):
            if cfg.positions == "none":
                return jnp.zeros((n, cfg.d_model), dt)
            return jnp.asarray(sinusoidal_positions(n, cfg.d_model), dt)

        def embed(tok, pos):
            x = jnp.take(emb, tok, axis=0).astype(dt)
            if cfg.scale_embedding:
                x = x * math.sqrt(cfg.d_model)
            return x + pos

        def head(x):
            if cfg.normalize_before:
                x = _norm(cfg, "final_norm")(x)
            return dense(cfg.vocab_size, ("embed", "vocab"), dtype=jnp.float32, param_dtype=cfg.params_dtype,
                         name="output")(x.astype(jnp.float32))

        unpiped = dataclasses.replace(self.stack, stages=1, microbatches=0)   # cached decoding runs unpipelined
        if mode == "prefill":
            if max_len < 1:
                raise ValueError(f"max_len must be >= 1, got {max_len}")
            x = jnp.zeros((memory.shape[0], 1, cfg.d_model), dt)
            _, layers = stacked(self, TransformerDecoderLayer, cfg, True, x, None, memory, memory_paddings < 0.5,
                                jnp.int32(0), name="layers", mode="prefill", max_len=max_len, stack=unpiped)
            return {"layers": layers, "memory_valid": memory_paddings < 0.5}
        if mode == "step":
            n = state["layers"]["self_k"].shape[2]
            pos = jax.lax.dynamic_slice_in_dim(table(n), index, 1, 0)
            x = embed(tokens[:, None], pos[None])
            x, layers = stacked(self, TransformerDecoderLayer, cfg, True, x, state["layers"], None,
                                state["memory_valid"], index, name="layers", mode="step", stack=unpiped)
            return head(x)[:, 0], {**state, "layers": layers}
        if mode != "full":
            raise ValueError(f"mode must be 'full', 'prefill' or 'step', got {mode!r}")
        if tokens.ndim != 2 or not jnp.issubdtype(tokens.dtype, jnp.integer):
            raise ValueError(f"tokens must be [batch, length] integers, got {tokens.shape} {tokens.dtype}")
        x = embed(tokens, table(tokens.shape[1])[None])
        x = nn.Dropout(cfg.dropout_rate, deterministic=not train)(x)
        x, _ = stacked(self, TransformerDecoderLayer, cfg, not train, x, None, memory, memory_paddings < 0.5,
                       jnp.int32(0), name="layers", mode="full", stack=self.stack, rows=(True, True, False))
        return head(x)
