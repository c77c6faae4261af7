"""An attention LSTM decoder (Listen-Attend-Spell style, Chan et al. 2016) in flax.linen.

At output position u (tokens ``y_0 = sos, y_1, ...``):

  x_u   = [embed(y_u); c_{u-1}]                       (input feeding of the previous attention context)
  h_u   = LSTM stack(x_u)                             (num_layers cells, dropout between layers)
  a_u   = softmax_t( (W_q h_u) . (W_k m_t) / sqrt(attention_dim) )   over valid encoder frames m_t
  c_u   = sum_t a_u,t m_t
  logit = W_o tanh(W_c [h_u; c_u])

The LSTM cells use PyTorch's gate layout (i, f, g, o) with one bias (= torch's ``b_ih + b_hh``), so torch.nn.LSTM
weights map over directly. Recurrent state is float32 whatever the compute dtype.

Interface (the same as :class:`models.transformer.TransformerDecoder`, so that the AED model treats both alike):
- ``__call__(tokens [B,U], memory [B,T,Dm], memory_paddings [B,T], train)`` -> logits ``[B,U,V]`` float32
  (teacher forcing; a ``lax.scan`` over positions).
- ``init_state(memory, memory_paddings, max_len)`` -> state pytree (batch on axis 0 of every leaf; ``max_len`` unused).
- ``step(tokens [B], index, state)`` -> ``(logits [B,V], state)`` (``index`` unused: the state carries the history).

Layers are not scanned (the first layer's input size differs); ``remat`` rematerialises each decoding step.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from models.transformer import NEG_INF, canonical_dtype, check_features, dense, partitioned


@dataclasses.dataclass(frozen=True)
class LSTMDecoderConfig:
    vocab_size: int = 0
    memory_dim: int = 256        # encoder output size
    embed_dim: int = 256
    hidden_size: int = 512
    num_layers: int = 2
    attention_dim: int = 256
    dropout_rate: float = 0.1
    dtype: Any = "float32"
    param_dtype: Any = "float32"
    remat: bool = False

    def __post_init__(self):
        for f in ("vocab_size", "memory_dim", "embed_dim", "hidden_size", "num_layers", "attention_dim"):
            if not isinstance(getattr(self, f), int) or getattr(self, f) < 1:
                raise ValueError(f"LSTMDecoderConfig.{f}={getattr(self, f)!r}: must be a positive int")
        if not 0.0 <= self.dropout_rate < 1.0:
            raise ValueError(f"LSTMDecoderConfig.dropout_rate={self.dropout_rate!r}: must be in [0, 1)")
        canonical_dtype(self.dtype, "LSTMDecoderConfig.dtype")
        canonical_dtype(self.param_dtype, "LSTMDecoderConfig.param_dtype")

    @property
    def compute_dtype(self):
        return canonical_dtype(self.dtype)

    @property
    def params_dtype(self):
        return canonical_dtype(self.param_dtype)

    def replace(self, **kw) -> "LSTMDecoderConfig":
        return dataclasses.replace(self, **kw)

    @classmethod
    def tiny(cls, vocab_size: int, memory_dim: int = 32, **kw) -> "LSTMDecoderConfig":
        base = dict(embed_dim=16, hidden_size=32, num_layers=2, attention_dim=16)
        return cls(vocab_size=vocab_size, memory_dim=memory_dim, **{**base, **kw})

    @classmethod
    def demo(cls, vocab_size: int, memory_dim: int = 144, **kw) -> "LSTMDecoderConfig":
        base = dict(embed_dim=128, hidden_size=256, num_layers=1, attention_dim=128)
        return cls(vocab_size=vocab_size, memory_dim=memory_dim, **{**base, **kw})


def _orthogonal_f32(key, shape, dtype=jnp.float32):
    """Orthogonal init computed in float32 (the QR has no bfloat16 kernel on CPU), then cast."""
    return nn.initializers.orthogonal()(key, shape, jnp.float32).astype(dtype)


class LSTMCell(nn.Module):
    """``(x, h, c) -> (h', c')`` with torch's gate order i, f, g, o; gates and state in float32."""
    hidden_size: int
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x, h, c):
        kw = dict(dtype=self.dtype, param_dtype=self.param_dtype)
        z = dense(4 * self.hidden_size, ("embed", "mlp"), name="ih", **kw)(x.astype(self.dtype))
        z = z + dense(4 * self.hidden_size, ("embed", "mlp"), use_bias=False, name="hh",
                      kernel_init=_orthogonal_f32, **kw)(h.astype(self.dtype))
        i, f, g, o = jnp.split(z.astype(jnp.float32), 4, axis=-1)
        c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
        h = jax.nn.sigmoid(o) * jnp.tanh(c)
        return h, c


class LSTMDecoderStep(nn.Module):
    """One decoding position: ``(state, tokens [B]) -> (state, logits [B,V])``."""
    config: LSTMDecoderConfig
    deterministic: bool = True

    @nn.compact
    def __call__(self, state, tokens):
        cfg = self.config
        dt, pdt = cfg.compute_dtype, cfg.params_dtype
        emb = self.param("embedding", partitioned(nn.initializers.normal(1.0), ("vocab", "embed")),
                         (cfg.vocab_size, cfg.embed_dim), pdt)
        x = jnp.concatenate([jnp.take(emb, tokens, axis=0).astype(dt), state["context"].astype(dt)], axis=-1)
        drop = nn.Dropout(cfg.dropout_rate, deterministic=self.deterministic)
        hs, cs = [], []
        for layer in range(cfg.num_layers):
            h, c = LSTMCell(cfg.hidden_size, dt, pdt, name=f"lstm_{layer}")(x, state["h"][:, layer],
                                                                             state["c"][:, layer])
            hs.append(h)
            cs.append(c)
            x = drop(h)
        query = dense(cfg.attention_dim, ("embed", "kv"), use_bias=False, dtype=dt, param_dtype=pdt,
                      name="query_proj")(h.astype(dt))
        scores = jnp.einsum("ba,bta->bt", query, state["keys"], preferred_element_type=jnp.float32)
        scores = jnp.where(state["memory_valid"], scores / math.sqrt(cfg.attention_dim), NEG_INF)
        probs = jax.nn.softmax(scores, axis=-1)
        context = jnp.einsum("bt,btd->bd", probs, state["memory"].astype(jnp.float32))
        att = jnp.tanh(dense(cfg.hidden_size, ("embed", "mlp"), dtype=dt, param_dtype=pdt, name="combine")(
            jnp.concatenate([h, context], axis=-1).astype(dt)))
        logits = dense(cfg.vocab_size, ("mlp", "vocab"), dtype=jnp.float32, param_dtype=pdt, name="output")(
            drop(att).astype(jnp.float32))
        new_state = {**state, "h": jnp.stack(hs, 1), "c": jnp.stack(cs, 1), "context": context}
        return new_state, logits


class LSTMDecoder(nn.Module):
    """Attention LSTM decoder; see the module docstring for the interface."""
    config: LSTMDecoderConfig

    def init_state(self, memory, memory_paddings, max_len: int = 0):
        return self(None, memory, memory_paddings, mode="prefill")

    def step(self, tokens, index, state):
        return self(tokens, mode="step", state=state)

    @nn.compact
    def __call__(self, tokens, memory=None, memory_paddings=None, train: bool = False, *, mode: str = "full",
                 state=None, index=None, max_len: int = 0):
        cfg = self.config
        dt = cfg.compute_dtype
        step_cls = nn.remat(LSTMDecoderStep) if cfg.remat else LSTMDecoderStep
        if mode in ("full", "prefill"):
            check_features(memory, memory_paddings, cfg.memory_dim, what="memory")
            b = memory.shape[0]
            keys = dense(cfg.attention_dim, ("embed", "kv"), use_bias=False, dtype=dt,
                         param_dtype=cfg.params_dtype, name="key_proj")(memory.astype(dt))
            state = {"h": jnp.zeros((b, cfg.num_layers, cfg.hidden_size), jnp.float32),
                     "c": jnp.zeros((b, cfg.num_layers, cfg.hidden_size), jnp.float32),
                     "context": jnp.zeros((b, cfg.memory_dim), jnp.float32),
                     "keys": keys, "memory": memory.astype(dt), "memory_valid": memory_paddings < 0.5}
            if mode == "prefill":
                return state
            if tokens.ndim != 2 or not jnp.issubdtype(tokens.dtype, jnp.integer):
                raise ValueError(f"tokens must be [batch, length] integers, got {tokens.shape} {tokens.dtype}")
            scan = nn.scan(step_cls, variable_broadcast="params", split_rngs={"params": False, "dropout": True},
                           in_axes=1, out_axes=1)
            _, logits = scan(cfg, not train, name="step")(state, tokens)
            return logits
        if mode != "step":
            raise ValueError(f"mode must be 'full', 'prefill' or 'step', got {mode!r}")
        state, logits = step_cls(cfg, True, name="step")(state, tokens)
        return logits, state
