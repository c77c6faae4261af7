"""Multi-process (multi-host) runs on JAX's own runtime: ``jax.distributed`` start-up and per-process batches.

One Python process runs per host (or per GPU, as the launcher chooses); all of them run the same program. The mesh
(:func:`jasr.sharding.make_mesh`) spans the devices of every process; each process builds only the rows of every
global batch that its own devices hold (:func:`process_row_block`, the ``row_index``/``row_count`` of
:func:`jasr.data.make_loader`) and :func:`global_batch` joins the processes' rows into one ``jax.Array`` with
``jax.make_array_from_process_local_data``.

How the processes find each other (:func:`distributed_settings`), first match wins:

1. explicit ``coordinator`` (``host:port`` of process 0), ``num_processes`` and ``process_id`` (train.py's
   ``--coordinator``, ``--num-processes``, ``--process-id``), each falling back to the environment variables
   ``JASR_COORDINATOR``, ``JASR_NUM_PROCESSES``, ``JASR_PROCESS_ID``;
2. ``coordinator="auto"``, or a SLURM job step with more than one task (``SLURM_JOB_ID`` and ``SLURM_NTASKS`` > 1),
   or a multi-host TPU slice (``TPU_WORKER_HOSTNAMES`` / ``TPU_PROCESS_ADDRESSES`` naming more than one host, or
   ``MEGASCALE_COORDINATOR_ADDRESS``): ``jax.distributed.initialize()`` without arguments, which reads the cluster
   from its environment (SLURM, Cloud TPU, GKE, Open MPI, ...);
3. otherwise a single process: nothing to initialise.

On CPU the cross-process collectives use gloo (``jax_cpu_collectives_implementation``; jax's default).
"""
from __future__ import annotations

import dataclasses
import os
from typing import Mapping

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh

from jasr.sharding import batch_devices, batch_sharding, shard_batch

__all__ = ["DistributedSettings", "distributed_settings", "initialize_distributed", "is_main_process",
           "process_row_block", "global_batch", "sync_processes", "host_sum"]

ENV_COORDINATOR = "JASR_COORDINATOR"
ENV_NUM_PROCESSES = "JASR_NUM_PROCESSES"
ENV_PROCESS_ID = "JASR_PROCESS_ID"


@dataclasses.dataclass(frozen=True)
class DistributedSettings:
    """How to call ``jax.distributed.initialize``: ``auto`` (no arguments: the cluster environment says) or the
    explicit coordinator address, process count and this process's id; `source` says where they came from."""
    auto: bool
    coordinator: str | None = None
    num_processes: int | None = None
    process_id: int | None = None
    source: str = ""


def _int_setting(value, name: str) -> int | None:
    if value is None or value == "":
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be an integer, got {value!r}") from None


def distributed_settings(coordinator: str | None = None, num_processes: int | None = None,
                         process_id: int | None = None, env: Mapping[str, str] | None = None
                         ) -> DistributedSettings | None:
    """The multi-process settings of this run (see the module docstring for the order), or None for a single
    process. Arguments left None fall back to ``JASR_COORDINATOR`` / ``JASR_NUM_PROCESSES`` / ``JASR_PROCESS_ID``
    in `env` (default ``os.environ``). ValueError names a missing or inconsistent setting."""
    env = os.environ if env is None else env
    coordinator = coordinator or env.get(ENV_COORDINATOR) or None
    num_processes = _int_setting(num_processes if num_processes is not None else env.get(ENV_NUM_PROCESSES),
                                 f"--num-processes / {ENV_NUM_PROCESSES}")
    process_id = _int_setting(process_id if process_id is not None else env.get(ENV_PROCESS_ID),
                              f"--process-id / {ENV_PROCESS_ID}")
    if coordinator == "auto":
        if num_processes is not None or process_id is not None:
            raise ValueError("coordinator 'auto' reads the process count and id from the cluster environment; "
                             "do not also pass --num-processes / --process-id")
        return DistributedSettings(auto=True, source="--coordinator auto")
    if coordinator or num_processes is not None or process_id is not None:
        missing = [n for n, v in (("--coordinator HOST:PORT", coordinator), ("--num-processes", num_processes),
                                  ("--process-id", process_id)) if v is None]
        if missing:
            raise ValueError(f"a multi-process run needs the coordinator address, the process count and this "
                             f"process's id; missing {', '.join(missing)} (or {ENV_COORDINATOR}, "
                             f"{ENV_NUM_PROCESSES}, {ENV_PROCESS_ID})")
        host, sep, port = coordinator.rpartition(":")
        if not (sep and host and port.isdigit()):
            raise ValueError(f"coordinator must be HOST:PORT (process 0's address), got {coordinator!r}")
        if num_processes < 1:
            raise ValueError(f"num_processes must be >= 1, got {num_processes}")
        if not 0 <= process_id < num_processes:
            raise ValueError(f"process_id must be in [0, {num_processes}), got {process_id}")
        return DistributedSettings(False, coordinator, num_processes, process_id, source="explicit")
    if env.get("SLURM_JOB_ID") and _int_setting(env.get("SLURM_NTASKS"), "SLURM_NTASKS") not in (None, 0, 1):
        return DistributedSettings(auto=True, source=f"SLURM job {env['SLURM_JOB_ID']}")
    hosts = env.get("TPU_PROCESS_ADDRESSES") or env.get("TPU_WORKER_HOSTNAMES") or ""
    if len([h for h in hosts.split(",") if h.strip()]) > 1 or env.get("MEGASCALE_COORDINATOR_ADDRESS"):
        return DistributedSettings(auto=True, source="TPU slice")
    return None


def initialize_distributed(coordinator: str | None = None, num_processes: int | None = None,
                           process_id: int | None = None, env: Mapping[str, str] | None = None) -> str | None:
    """Starts ``jax.distributed`` as :func:`distributed_settings` says (before any other JAX call of the
    program). Returns a line describing the processes, or None for a single-process run."""
    settings = distributed_settings(coordinator, num_processes, process_id, env)
    if settings is None:
        return None
    if settings.auto:
        jax.distributed.initialize()
    else:
        jax.distributed.initialize(coordinator_address=settings.coordinator, num_processes=settings.num_processes,
                                   process_id=settings.process_id)
    return (f"process {jax.process_index()} of {jax.process_count()} ({settings.source}); "
            f"{jax.local_device_count()} local of {jax.device_count()} devices")


def is_main_process() -> bool:
    """True in the process that writes logs, configs and other run files (process 0)."""
    return jax.process_index() == 0


def process_row_block(mesh: Mesh) -> tuple[int, int]:
    """(index, count): this process's devices hold block `index` of `count` equal row blocks of every batch sharded
    by :func:`jasr.sharding.batch_sharding` over `mesh` (its rows [index * B / count, (index + 1) * B / count)).
    (0, 1) for one process, or when each process holds every row (e.g. the batch axes do not cross processes).
    ValueError when the process's rows are not one such block (a device layout that interleaves processes)."""
    n = batch_devices(mesh)
    if jax.process_count() == 1:
        return 0, 1
    grid = mesh.devices
    data, fsdp = mesh.axis_names.index("data"), mesh.axis_names.index("fsdp")
    mine = sorted({idx[data] * mesh.shape["fsdp"] + idx[fsdp] for idx in np.ndindex(grid.shape)
                   if grid[idx].process_index == jax.process_index()})
    if not mine:
        raise ValueError(f"process {jax.process_index()} has no device in the mesh {dict(mesh.shape)}")
    k = len(mine)
    if mine != list(range(mine[0], mine[0] + k)) or n % k or mine[0] % k:
        raise ValueError(f"process {jax.process_index()} holds batch positions {mine} of {n} (mesh "
                         f"{dict(mesh.shape)}), not one contiguous block: the processes cannot each load a slice "
                         f"of the batch")
    return mine[0] // k, n // k


def global_batch(batch: dict, mesh: Mesh) -> dict:
    """One ``jax.Array`` per key of `batch` (this process's rows, block :func:`process_row_block` of each global
    batch), sharded by :func:`jasr.sharding.batch_sharding`: the rows of all processes joined
    (``jax.make_array_from_process_local_data``). With one process the same as :func:`jasr.sharding.shard_batch`."""
    if jax.process_count() == 1:
        return shard_batch(batch, mesh)
    _, count = process_row_block(mesh)

    def put(x):
        x = np.asarray(x)
        if x.ndim == 0:
            return jax.make_array_from_process_local_data(batch_sharding(mesh, 0), x, ())
        return jax.make_array_from_process_local_data(batch_sharding(mesh, x.ndim), x,
                                                      (x.shape[0] * count,) + x.shape[1:])
    return jax.tree.map(put, batch)


def sync_processes(name: str) -> None:
    """A barrier across all processes (no-op for one process): e.g. before reading what process 0 wrote."""
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices(name)


def host_sum(values, mesh: Mesh) -> np.ndarray:
    """Sums host-side numbers (e.g. this process's utterance and audio-second counts) over the row blocks of all
    processes; a block held by several processes counts once. `values` itself for one process."""
    values = np.asarray(values, np.float32)
    if jax.process_count() == 1:
        return values
    index, _ = process_row_block(mesh)
    rows = np.asarray(multihost_utils.process_allgather(np.concatenate([[index], values]).astype(np.float32)))
    seen, total = set(), np.zeros_like(values)
    for r in rows:
        if int(r[0]) not in seen:
            seen.add(int(r[0]))
            total += r[1:]
    return total
