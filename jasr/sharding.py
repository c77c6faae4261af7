"""Meshes and logical-axis sharding for training and inference with jax.sharding (jit + NamedSharding).

A run's ``mesh`` section gives the size of each mesh axis (``pipeline``, ``data``, ``fsdp``, ``tensor``; -1 takes
the devices left over). Models name the axes of their parameters and activations logically (``batch``, ``length``,
``embed``, ``mlp``, ``heads``, ``kv``, ``vocab``, ``layers``, ``conv``); a family's *rules* map those names to mesh
axes (:data:`DEFAULT_RULES` unless the family declares its own). flax resolves the rules in order and never uses a
mesh axis twice in one array, so with the default rules

* parameters are sharded over ``fsdp`` along ``embed`` (ZeRO-3 style) and over ``tensor`` along ``mlp``/``heads``/
  ``vocab`` (Megatron-style tensor parallelism); the optimiser state follows its parameter;
* activations and batches are sharded over ``data`` x ``fsdp`` along ``batch`` (``embed`` of an activation then stays
  whole, because ``fsdp`` is taken by ``batch``);
* the stacked parameters of a layer stack (leading ``layers`` axis, scan_layers / pipelined) and the stage dimension
  of a pipeline's activations (``stage``) lie on ``pipeline``. With ``mesh.pipeline`` = 1 that axis has one device
  and changes nothing; with S > 1 stages the model pipelines its layer stacks (models.layer_stack: S stages of
  layers/S layers each, microbatched), so that each pipeline group of devices holds and runs one stage.

Besides the axis sizes the mesh section holds ``mesh.microbatches`` (:data:`MESH_OPTIONS`; the pipeline's
microbatch count, 0 = the number of stages), which :func:`mesh_shape` leaves out.
"""
from __future__ import annotations

import contextlib
import math
from typing import Any, Mapping, Sequence

import flax.linen as nn
import jax
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

__all__ = ["MESH_AXES", "MESH_OPTIONS", "DEFAULT_RULES", "mesh_shape", "pipeline_stages", "make_mesh",
           "logical_specs", "logical_shardings", "state_shardings", "batch_sharding", "replicated", "fit_to_shape",
           "check_batch_divisible", "batch_devices", "shard_batch", "mesh_context", "per_device_mib"]

MESH_AXES = ("pipeline", "data", "fsdp", "tensor")
MESH_OPTIONS = ("microbatches",)      # keys of a mesh section that are settings, not axes
BATCH_AXES = ("data", "fsdp")

DEFAULT_RULES: tuple[tuple[str, Any], ...] = (
    ("batch", BATCH_AXES),
    ("embed", "fsdp"),
    ("mlp", "tensor"),
    ("heads", "tensor"),
    ("vocab", "tensor"),
    ("kv", None),
    ("length", None),
    ("layers", "pipeline"),
    ("stage", "pipeline"),
    ("conv", None),
)


def mesh_shape(sizes: Mapping[str, int], num_devices: int) -> dict[str, int]:
    """The size of every mesh axis: `sizes` maps axis names (of :data:`MESH_AXES`; missing ones are 1) to positive
    ints, at most one of them -1 (the devices left over, at least 1). Without a -1 the product may be less than
    `num_devices` (the mesh then uses the first devices), never more. Keys of :data:`MESH_OPTIONS` are ignored."""
    sizes = {k: sizes[k] for k in sizes if k not in MESH_OPTIONS}
    unknown = sorted(set(sizes) - set(MESH_AXES))
    if unknown:
        raise ValueError(f"mesh: unknown axis {unknown} (axes are {MESH_AXES})")
    shape = {a: int(sizes.get(a, 1)) for a in MESH_AXES}
    rest = [a for a, n in shape.items() if n == -1]
    bad = [f"mesh.{a}={n}" for a, n in shape.items() if n == 0 or n < -1]
    if bad:
        raise ValueError(f"mesh: sizes must be positive or -1, got {', '.join(bad)}")
    if len(rest) > 1:
        raise ValueError(f"mesh: only one axis may be -1 (the rest of the devices), got {rest}")
    fixed = math.prod(n for n in shape.values() if n != -1)
    if rest:
        if num_devices % fixed:
            raise ValueError(f"mesh: {num_devices} devices do not divide by the fixed axes' product {fixed} "
                             f"({shape})")
        shape[rest[0]] = num_devices // fixed
    elif fixed > num_devices:
        raise ValueError(f"mesh: axis sizes {shape} multiply to {fixed}, but there are only {num_devices} devices")
    return shape


def pipeline_stages(sizes: Mapping[str, int], num_devices: int | None = None) -> int:
    """The pipeline stages of a mesh section: ``pipeline`` itself, or when it is -1 the devices left over (of
    `num_devices`, default all devices)."""
    n = int(sizes.get("pipeline", 1))
    if n != -1:
        return n
    return mesh_shape(sizes, jax.device_count() if num_devices is None else num_devices)["pipeline"]


def make_mesh(sizes: Mapping[str, int], devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A :class:`jax.sharding.Mesh` over `devices` (default: all devices of all processes) with axes
    :data:`MESH_AXES`, laid out by :func:`jax.experimental.mesh_utils.create_device_mesh` (``tensor`` innermost,
    so that it spans the fastest links)."""
    devices = list(jax.devices() if devices is None else devices)
    shape = mesh_shape(sizes, len(devices))
    dims = tuple(shape[a] for a in MESH_AXES)
    devices = devices[:math.prod(dims)]
    try:
        grid = mesh_utils.create_device_mesh(dims, devices=devices)
    except (AssertionError, NotImplementedError, ValueError):   # topologies it does not know: plain order
        grid = np.asarray(devices, dtype=object).reshape(dims)
    return Mesh(grid, MESH_AXES)


def logical_specs(tree) -> Any:
    """Logical PartitionSpecs of a tree whose leaves may be flax ``Partitioned`` boxes (from ``model.init`` or
    ``jax.eval_shape`` of it); unboxed leaves get ``PartitionSpec()`` (replicated)."""
    return nn.get_partition_spec(tree)


def logical_shardings(specs, mesh: Mesh, rules=DEFAULT_RULES) -> Any:
    """NamedShardings of a tree of logical PartitionSpecs under `rules`."""
    return nn.logical_to_mesh_sharding(specs, mesh, list(rules))


def fit_to_shape(sharding: NamedSharding, shape: Sequence[int]) -> NamedSharding:
    """`sharding` with every dimension that its mesh axes do not divide evenly left whole (e.g. a vocabulary of 17
    over tensor = 2): such an array is replicated along that dimension instead of failing to place."""
    spec = list(sharding.spec) + [None] * (len(shape) - len(sharding.spec))
    for i, axes in enumerate(spec):
        if axes is None:
            continue
        names = axes if isinstance(axes, tuple) else (axes,)
        if shape[i] % math.prod(sharding.mesh.shape[a] for a in names):
            spec[i] = None
    return NamedSharding(sharding.mesh, PartitionSpec(*spec))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec())


def batch_sharding(mesh: Mesh, ndim: int) -> NamedSharding:
    """Leading (batch) dimension over ``data`` x ``fsdp``; the rest whole. Scalars are replicated."""
    if ndim == 0:
        return replicated(mesh)
    return NamedSharding(mesh, PartitionSpec(BATCH_AXES, *([None] * (ndim - 1))))


def check_batch_divisible(batch_size: int, mesh: Mesh, what: str = "batch") -> None:
    """A clear error when `batch_size` rows cannot split evenly over the batch axes of `mesh`."""
    n = batch_devices(mesh)
    if batch_size % n:
        raise ValueError(f"{what} of {batch_size} rows does not split over mesh data x fsdp = {n} devices; "
                         f"use a batch size (data.max_frames / bucket shapes) that is a multiple of {n}")


def per_device_mib(tree) -> float:
    """MiB that the arrays of `tree` hold on the most loaded device (the bytes of every array's shards summed per
    device; an array on one device counts whole there)."""
    per_device: dict = {}
    for x in jax.tree.leaves(tree):
        if isinstance(x, jax.Array):
            for shard in x.addressable_shards:
                per_device[shard.device] = per_device.get(shard.device, 0) + shard.data.nbytes
    return max(per_device.values(), default=0) / 2 ** 20


def batch_devices(mesh: Mesh) -> int:
    """Devices a batch is split over (data x fsdp): batch sizes must be multiples of it."""
    return mesh.shape["data"] * mesh.shape["fsdp"]


def shard_batch(batch, mesh: Mesh):
    """A batch (dict of host arrays, leading dim = rows) placed with :func:`batch_sharding`."""
    return jax.tree.map(lambda x: jax.device_put(x, batch_sharding(mesh, np.ndim(x))), batch)


@contextlib.contextmanager
def mesh_context(mesh: Mesh | None, rules=DEFAULT_RULES):
    """`mesh` and logical axis `rules` in effect (jit, with_logical_constraint) inside the block; mesh None: no
    mesh and no rules (one device)."""
    if mesh is None:
        yield None
        return
    with jax.set_mesh(mesh), nn.logical_axis_rules(list(rules)):
        yield mesh


def _path_key(path) -> tuple:
    """A key path as a tuple of plain keys, without the ``.value`` of flax's Partitioned boxes."""
    out = []
    for k in path:
        if isinstance(k, jax.tree_util.GetAttrKey) and k.name == "value":
            continue
        for attr in ("key", "name", "idx"):
            if hasattr(k, attr):
                out.append(getattr(k, attr))
                break
    return tuple(out)


def state_shardings(state, params_specs, mesh: Mesh, rules=DEFAULT_RULES) -> Any:
    """NamedShardings for a whole train state (any pytree, e.g. jasr.steps.TrainState, concrete or abstract).

    `params_specs` is the logical PartitionSpec tree of the parameters (:func:`logical_specs` of the boxed init).
    Every leaf of `state` whose key path ends with a parameter's key path and has at least that parameter's rank
    (the params themselves, Adam's moments, an EMA copy, ...) gets the parameter's sharding, with the dimensions the
    mesh does not divide left whole (:func:`fit_to_shape`); every other leaf (step counters, RNG keys, scalars) is
    replicated."""
    param_sh = logical_shardings(params_specs, mesh, rules)
    by_path = {}
    for path, sh in jax.tree_util.tree_flatten_with_path(param_sh, is_leaf=lambda x: isinstance(x, NamedSharding))[0]:
        by_path[_path_key(path)] = sh
    lengths = sorted({len(k) for k in by_path}, reverse=True)

    def pick(path, leaf):
        key = _path_key(path)
        shape = np.shape(leaf)
        for n in lengths:
            if len(key) >= n and key[-n:] in by_path:
                sh = by_path[key[-n:]]
                if len(sh.spec) <= len(shape):
                    return fit_to_shape(sh, shape)
        return replicated(mesh)

    return jax.tree_util.tree_map_with_path(pick, state)
