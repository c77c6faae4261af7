"""Logical axis names on parameters and activations, the names jasr.sharding's rules map to mesh axes.

Parameters are boxed at init (:func:`partitioned`) and carry their names through ``jax.eval_shape`` /
``nn.get_partition_spec``; activations are constrained with :func:`constrain`. Both are no-ops for the
computation itself: without logical axis rules and a mesh in context nothing is sharded.
"""
from __future__ import annotations

from typing import Callable, Sequence

import flax.linen as nn
import numpy as np

__all__ = ["LogicalBox", "partitioned", "constrain"]


class LogicalBox(nn.LogicallyPartitioned):
    """flax's LogicallyPartitioned, except that a value whose rank differs from its names is returned without a
    sharding constraint. ``nn.DenseGeneral`` initialises a multi-axis kernel flat (e.g. ``[embed, heads * kv]``) and
    unboxes it before reshaping it to the named shape ``[embed, heads, kv]``; with rules and a mesh in context the
    stock box would constrain the flat value with three names and fail. The reshaped parameter is constrained as
    usual."""

    def unbox(self, apply_constraint=True):
        ndim = getattr(self.value, "ndim", None)
        if ndim is None:
            ndim = np.ndim(self.value)
        if apply_constraint and ndim != len(self.names):
            return self.value
        return super().unbox(apply_constraint)


def partitioned(init: Callable, names: Sequence[str | None]) -> Callable:
    """An initializer whose parameter carries the logical axis ``names`` (one per dimension)."""
    names = tuple(names)

    def init_boxed(*args, **kwargs):
        return LogicalBox(init(*args, **kwargs), names)

    return init_boxed


def constrain(x, names: Sequence[str | None]):
    """Logical sharding constraint on an activation (a no-op without logical axis rules and a mesh)."""
    return nn.with_logical_constraint(x, tuple(names))
