"""Transformer building blocks shared by the speech models, a plain Transformer encoder, and a Transformer decoder.

Conventions (see DESIGN.md):
- ``paddings`` arrays: 1.0 = padded, 0.0 = valid, shape ``[B, T]``; valid frames come first.
- ``dtype`` is the compute dtype, ``param_dtype`` the storage dtype; layer norms, softmaxes and logits are float32.
- Every parameter carries logical axis names (``embed``, ``mlp``, ``heads``, ``kv``, ``vocab``, ``layers`` ...)
  through :func:`flax.linen.with_logical_partitioning`; ``nn.unbox`` gives plain arrays.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

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


def partitioned(init: Callable, names: Sequence[str | None]) -> Callable:
    """An initializer whose parameter carries the logical axis ``names``."""
    return nn.with_logical_partitioning(init, tuple(names))


def constrain(x: jax.Array, names: Sequence[str | None]) -> jax.Array:
    """Logical sharding constraint on an activation (a no-op without logical axis rules)."""
    return nn.with_logical_constraint(x, tuple(names))


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
