"""Parameter averaging for evaluation: an exponential moving average (EMA) of the parameters kept during training,
and the plain mean of several checkpoints' parameters (icefall's ``--avg N``). Pure functions over pytrees.

EMA of step s (s = 1, 2, ... updates done): ``ema_s = d_s * ema_{s-1} + (1 - d_s) * params_s`` with
``d_s = min(decay, (1 + s) / (10 + s))`` (the warm-up of TensorFlow's ExponentialMovingAverage with
``num_updates``), so that early averages are not dominated by the random initialisation; ``ema_0 = params_0``.
Floating-point leaves are averaged in float32 and cast back to their dtype; integer leaves take the new value.
"""
from __future__ import annotations

from typing import Any, Sequence

import jax
import jax.numpy as jnp

__all__ = ["ema_decay_at", "ema_update", "average_params"]


def _check_decay(decay) -> None:
    if isinstance(decay, (int, float)) and not 0.0 <= float(decay) < 1.0:
        raise ValueError(f"ema decay must be in [0, 1), got {decay}")


def ema_decay_at(step, decay: float) -> jax.Array:
    """The EMA decay used for update number `step` (>= 1; a scalar, may be traced): min(decay, (1+s)/(10+s))."""
    _check_decay(decay)
    s = jnp.asarray(step, jnp.float32)
    return jnp.minimum(jnp.float32(decay), (1.0 + s) / (10.0 + s))


def _is_float(x) -> bool:
    return jnp.issubdtype(jnp.asarray(x).dtype, jnp.floating)


def ema_update(ema: Any, params: Any, decay) -> Any:
    """One EMA step: ``decay * ema + (1 - decay) * params`` leaf by leaf (same tree structure and shapes).

    `decay` is a scalar in [0, 1) (e.g. from :func:`ema_decay_at`). Float leaves accumulate in float32."""
    _check_decay(decay)
    if jax.tree.structure(ema) != jax.tree.structure(params):
        raise ValueError(f"ema_update: ema and params differ in structure ({jax.tree.structure(ema)} vs "
                         f"{jax.tree.structure(params)})")
    d = jnp.asarray(decay, jnp.float32)

    def one(e, p):
        if jnp.shape(e) != jnp.shape(p):
            raise ValueError(f"ema_update: leaf shapes differ: ema {jnp.shape(e)} vs params {jnp.shape(p)}")
        if not _is_float(p):
            return p
        out = d * jnp.asarray(e, jnp.float32) + (1.0 - d) * jnp.asarray(p, jnp.float32)
        return out.astype(jnp.asarray(p).dtype)
    return jax.tree.map(one, ema, params)


def average_params(trees: Sequence[Any]) -> Any:
    """The leaf-wise mean of several parameter trees (e.g. the last N checkpoints' params), float32 accumulation;
    integer leaves are taken from the last tree."""
    trees = list(trees)
    if not trees:
        raise ValueError("average_params needs at least one parameter tree, got none")
    structure = jax.tree.structure(trees[0])
    for i, t in enumerate(trees[1:], 1):
        if jax.tree.structure(t) != structure:
            raise ValueError(f"average_params: tree {i} differs in structure from tree 0")
    leaves = [jax.tree.leaves(t) for t in trees]
    out = []
    for parts in zip(*leaves):
        shapes = {jnp.shape(x) for x in parts}
        if len(shapes) != 1:
            raise ValueError(f"average_params: leaf shapes differ across trees: {sorted(shapes)}")
        if not _is_float(parts[-1]):
            out.append(parts[-1])
            continue
        acc = sum(jnp.asarray(x, jnp.float32) for x in parts) / jnp.float32(len(parts))
        out.append(acc.astype(jnp.asarray(parts[-1]).dtype))
    return jax.tree.unflatten(structure, out)
