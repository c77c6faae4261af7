"""Stacks of N identical layers, the one place where every model family runs its encoder/decoder layers: a plain
loop, ``nn.remat`` with a rematerialisation policy, ``nn.scan`` (parameters stacked on a leading ``layers`` axis),
or a pipeline over stages (GPipe schedule, microbatched).

Parameter layout: unscanned, layer i lives under ``{name}_{i}``; scanned or pipelined, all layers live under
``name`` with a leading ``layers`` axis (logical name ``layers``). A pipelined stack keeps the scanned layout, so a
checkpoint of a scanned run loads into a pipelined one and back; inside the step the ``[layers, ...]`` parameters are
viewed as ``[stages, layers_per_stage, ...]``.

Pipeline (:func:`pipeline_layers`): the batch is cut into M microbatches; a buffer ``[stages, microbatch, ...]``
holds the activation each stage works on. Each of the ``M + S - 1`` iterations (a ``lax.scan``) rotates the buffer
by one stage (stage s takes stage s-1's output, stage 0 takes the next microbatch), then runs every stage on its
slot with a ``jax.vmap`` over the stage dimension (``spmd_axis_name="pipeline"``: under a mesh the stage dimension
of the buffer, of the stage parameters and of every activation constraint inside a layer lies on the ``pipeline``
mesh axis, so each pipeline group of devices computes one stage and the rotation is a collective permute). The last
stage's output of iteration t is microbatch ``t - S + 1``. Per-row inputs (masks, encoder memory) stay
``[M, microbatch, ...]`` and each stage gathers the rows of the microbatch it holds. Fill and drain iterations run
stages on microbatches that are thrown away (the pipeline bubble, ``(S - 1) / (M + S - 1)`` of the work). Loss and
gradients equal the unpipelined stack's (autodiff through the scan); dropout masks differ (one key per layer and
microbatch).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

__all__ = ["REMAT_POLICIES", "checkpoint_policy", "StackOptions", "LayerStack", "pipeline_layers"]

REMAT_POLICIES = ("none", "full", "dots_saveable", "dots_with_no_batch_dims_saveable", "everything_saveable")


def checkpoint_policy(name: str) -> Callable | None:
    """The ``jax.checkpoint`` policy of a remat policy name ("full": save nothing, recompute the whole layer)."""
    if name not in REMAT_POLICIES:
        raise ValueError(f"remat_policy must be one of {REMAT_POLICIES}, got {name!r}")
    if name in ("none", "full"):
        return None
    return getattr(jax.checkpoint_policies, name)


@dataclasses.dataclass(frozen=True)
class StackOptions:
    """How a model's layer stacks run, beyond the model config's ``remat``/``scan_layers``: ``remat_policy`` (one
    of :data:`REMAT_POLICIES`; "none" defers to the config's ``remat`` bool, which means "full"), and pipelining over
    ``stages`` (> 1: needs scanned layers and a layer count divisible by it) with ``microbatches`` (0: = stages)."""
    remat_policy: str = "none"
    stages: int = 1
    microbatches: int = 0

    def __post_init__(self):
        checkpoint_policy(self.remat_policy)
        if not isinstance(self.stages, int) or self.stages < 1:
            raise ValueError(f"StackOptions.stages must be an int >= 1, got {self.stages!r}")
        if not isinstance(self.microbatches, int) or self.microbatches < 0:
            raise ValueError(f"StackOptions.microbatches must be an int >= 0 (0: = stages), got {self.microbatches!r}")

    @property
    def num_microbatches(self) -> int:
        return self.microbatches or self.stages

    def policy(self, remat: bool) -> str:
        """The effective remat policy given a config's ``remat`` bool."""
        if self.remat_policy != "none":
            return self.remat_policy
        return "full" if remat else "none"

    def check(self, num_layers: int, scan: bool, what: str = "layer stack") -> None:
        """ValueError when a stack of `num_layers` (scanned or not) cannot pipeline over ``stages``."""
        if self.stages == 1:
            return
        if not scan:
            raise ValueError(f"{what}: pipelining over {self.stages} stages needs scan_layers=True (parameters "
                             f"stacked on a 'layers' axis)")
        if num_layers % self.stages:
            raise ValueError(f"{what}: {num_layers} layers do not split evenly over {self.stages} pipeline stages")


def _batch_shards() -> int:
    """Devices the logical ``batch`` axis is split over under the mesh and axis rules in context (1 without)."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return 1
    axes = nn.logical_to_mesh_axes(("batch",))[0]
    if axes is None:
        return 1
    names = axes if isinstance(axes, tuple) else (axes,)
    return math.prod(mesh.shape[a] for a in names if a in mesh.shape)


def _constrain(x, names):
    return nn.with_logical_constraint(x, tuple(names) + (None,) * (x.ndim - len(names)))


def pipeline_layers(layer_fn: Callable, params: Any, x: jax.Array, rows: tuple, *, stages: int, microbatches: int,
                    key: jax.Array | None = None) -> jax.Array:
    """Runs ``layer_fn(layer_params, h, rows_mb, key) -> h`` for every layer of `params` (a pytree whose leaves
    carry the layers on axis 0) over ``x [B, ...]`` as a pipeline of `stages` stages and `microbatches`
    microbatches (see the module docstring). `rows` is a tuple of arrays ``[B, ...]`` cut into microbatches with
    `x` (``rows_mb`` holds the current microbatch's rows); `key` (or None) is folded with the layer and microbatch
    index into each call's key. B is padded (repeating the last row) to a multiple of microbatches x the devices
    the batch is split over, and the padding is dropped from the result. Returns ``[B, ...]``."""
    num_layers = jax.tree.leaves(params)[0].shape[0]
    if num_layers % stages:
        raise ValueError(f"pipeline: {num_layers} layers do not split over {stages} stages")
    lps, m = num_layers // stages, microbatches
    b = x.shape[0]
    for r in rows:
        if r.shape[0] != b:
            raise ValueError(f"pipeline: a per-row input has {r.shape[0]} rows, the activations {b}")
    pad = -b % (m * _batch_shards())
    pad_rows = lambda a: jnp.concatenate([a, jnp.repeat(a[-1:], pad, axis=0)], axis=0) if pad else a  # noqa: E731
    x, rows = pad_rows(x), tuple(pad_rows(r) for r in rows)
    mb = x.shape[0] // m
    split = lambda a: a.reshape(m, mb, *a.shape[1:])  # noqa: E731
    xs = _constrain(split(x), (None, "batch"))
    rows_m = tuple(_constrain(split(r), (None, "batch")) for r in rows)
    stage_params = jax.tree.map(lambda p: p.reshape(stages, lps, *p.shape[1:]), params)

    def stage_fn(p_stage, h, rows_s, stage, mb_index):
        def body(h, inp):
            p_layer, j = inp
            k = None if key is None else jax.random.fold_in(jax.random.fold_in(key, stage * lps + j), mb_index)
            return layer_fn(p_layer, h, rows_s, k), None
        return jax.lax.scan(body, h, (p_stage, jnp.arange(lps)))[0]

    run_stages = jax.vmap(stage_fn, spmd_axis_name="pipeline")
    stage_ids = jnp.arange(stages)

    def step(carry, t):
        state, out = carry
        first = jax.lax.dynamic_index_in_dim(xs, jnp.minimum(t, m - 1), 0, keepdims=False)
        state = jnp.roll(state, 1, axis=0).at[0].set(first)      # stage s takes stage s-1's output
        mb_index = jnp.clip(t - stage_ids, 0, m - 1)              # the microbatch each stage holds
        rows_s = tuple(jnp.take(r, mb_index, axis=0) for r in rows_m)
        state = run_stages(stage_params, _constrain(state, ("stage", "batch")), rows_s, stage_ids, mb_index)
        # the last stage finished microbatch t - S + 1; before the pipe is full it writes slot 0, overwritten later
        done = jnp.clip(t - stages + 1, 0, m - 1)
        out = jax.lax.dynamic_update_index_in_dim(out, state[-1], done, 0)
        return (state, out), None

    state0 = jnp.zeros((stages, mb) + x.shape[1:], x.dtype)
    (_, out), _ = jax.lax.scan(step, (state0, jnp.zeros_like(xs)), jnp.arange(m + stages - 1))
    # rows back in their batch layout (without this GSPMD may keep the microbatch axis split over the pipeline axis
    # for the layers around the stack, and it got a grouped convolution's weight gradient wrong that way)
    return _constrain(out.reshape(m * mb, *x.shape[1:])[:b], ("batch",))


@dataclasses.dataclass(frozen=True)
class LayerStack:
    """A stack of ``num_layers`` modules ``block(**kwargs)``, each called ``(x, *args) -> (x, out)``.

    ``in_axes`` has one entry per extra argument: ``nn.broadcast`` (every layer sees it) or the axis of a per-layer
    input (e.g. a KV cache with its layer axis); ``rows`` marks the broadcast arguments whose leading axis is the
    batch (microbatched when pipelined; one with a leading axis of 1 is shared). Per-layer outputs are stacked on
    ``out_axis``. :meth:`build` makes the modules (in ``setup`` or a compact method), :meth:`__call__` runs them.
    """
    block: type
    num_layers: int
    kwargs: tuple = ()                  # (name, value) pairs: the block's fields
    options: StackOptions = StackOptions()
    remat: bool = False
    scan: bool = False
    in_axes: tuple = ()
    rows: tuple = ()
    out_axis: int = 0
    name: str = "layers"

    def __post_init__(self):
        if len(self.rows) not in (0, len(self.in_axes)):
            raise ValueError("LayerStack: rows needs one entry per extra argument (as in_axes)")
        self.options.check(self.num_layers, self.scan, f"{self.block.__name__} stack")

    def build(self):
        """The scanned module named ``name`` (scan_layers / pipelined), else a list of modules ``{name}_{i}``."""
        policy = self.options.policy(self.remat)
        cls = self.block
        if policy != "none":
            cls = nn.remat(cls, prevent_cse=not self.scan, policy=checkpoint_policy(policy))
        kw = dict(self.kwargs)
        if self.scan:
            return nn.scan(cls, variable_axes={"params": 0, "batch_stats": 0},
                           split_rngs={"params": True, "dropout": True}, in_axes=self.in_axes,
                           out_axes=self.out_axis, length=self.num_layers,
                           metadata_params={nn.PARTITION_NAME: "layers"})(name=self.name, **kw)
        return [cls(name=f"{self.name}_{i}", **kw) for i in range(self.num_layers)]

    def __call__(self, parent: nn.Module, layers, x, *args):
        """``(x, outs)``: `layers` from :meth:`build` run on `x`; `parent` is the module that owns them (its RNGs
        feed a pipelined stack's dropout)."""
        if len(args) != len(self.in_axes):
            raise ValueError(f"LayerStack: {len(args)} extra arguments, in_axes has {len(self.in_axes)}")
        per_layer = [a is not None and ax is not nn.broadcast for a, ax in zip(args, self.in_axes)]
        if self.options.stages > 1 and not parent.is_initializing() and not any(per_layer):
            return self._pipelined(parent, layers, x, args), None
        if self.scan:
            return layers(x, *args)
        outs = []
        for i, layer in enumerate(layers):
            layer_args = [jax.tree.map(lambda a: jnp.take(a, i, axis=ax), a) if p else a
                          for a, ax, p in zip(args, self.in_axes, per_layer)]
            x, out = layer(x, *layer_args)
            outs.append(out)
        if all(o is None for o in outs):
            return x, None
        return x, jax.tree.map(lambda *a: jnp.stack(a, axis=self.out_axis), *outs)

    def _pipelined(self, parent, layers, x, args):
        variables = layers.variables
        if set(variables) - {"params"}:
            raise ValueError(f"{self.block.__name__} stack: a pipelined stack cannot carry mutable state "
                             f"({sorted(set(variables) - {'params'})}, e.g. batch norm statistics)")
        params = nn.unbox(variables["params"])
        b = x.shape[0]
        is_row = [bool(self.rows and self.rows[i]) and a is not None and a.shape[0] == b and b != 1
                  for i, a in enumerate(args)]
        row_vals = tuple(a for a, r in zip(args, is_row) if r)
        block = self.block(**dict(self.kwargs), parent=None)   # detached: applied functionally per layer
        policy = self.options.policy(self.remat)

        def layer_fn(p, h, rows_mb, key):
            it = iter(rows_mb)
            layer_args = [next(it) if r else a for a, r in zip(args, is_row)]
            rngs = None if key is None else {"dropout": key}
            h, out = block.apply({"params": p}, h, *layer_args, rngs=rngs)
            if out is not None:
                raise ValueError(f"{self.block.__name__} stack: a pipelined layer cannot return per-layer outputs")
            return h

        if policy != "none":
            layer_fn = jax.checkpoint(layer_fn, policy=checkpoint_policy(policy), prevent_cse=False)
        key = parent.make_rng("dropout") if (parent.has_rng("dropout") and not dict(self.kwargs).get(
            "deterministic", True)) else None
        return pipeline_layers(layer_fn, params, x, row_vals, stages=self.options.stages,
                               microbatches=self.options.num_microbatches, key=key)
