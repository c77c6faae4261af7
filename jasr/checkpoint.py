"""Checkpoints with orbax: every N steps and at the end, keep the last K plus the best by a dev metric, atomic,
exact resume (train state incl. optimiser state and PRNG key, step, data-iterator position).

Atomicity: orbax writes each step into a temporary folder (``<step>.orbax-checkpoint-tmp-*``) and renames it to
``<step>`` only once every file is on disk; a process killed mid-save leaves only the temporary folder, which
``latest_step`` never reports and which is removed when the manager is opened again
(``cleanup_tmp_directories``).

Layout of a step folder: ``state`` (the TrainState pytree, orbax StandardSave), ``extra`` (JSON: data-iterator
state, anything else the loop needs), ``metrics`` (JSON, written by orbax when dev metrics are given).
"""
from __future__ import annotations

import base64
import os
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from orbax.checkpoint import checkpoint_managers as ocm


def _to_json(obj):
    """Makes iterator states JSON-safe (bytes -> tagged base64, numpy -> lists/scalars)."""
    if isinstance(obj, bytes):
        return {"__bytes__": base64.b64encode(obj).decode("ascii")}
    if isinstance(obj, dict):
        return {str(k): _to_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_to_json(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, np.generic):
        return obj.item()
    return obj


def _from_json(obj):
    if isinstance(obj, dict):
        if set(obj) == {"__bytes__"}:
            return base64.b64decode(obj["__bytes__"])
        return {k: _from_json(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_from_json(v) for v in obj]
    return obj


class Checkpointer:
    """Saves and restores (TrainState, extra JSON) pairs under `directory`.

    Args:
      directory: where step folders go (created if missing).
      keep_last: how many of the most recent checkpoints to keep (>= 1).
      keep_best: how many of the best checkpoints by `best_metric` to keep as well (0 disables).
      best_metric: key of the metrics dict passed to :meth:`save`; lower is better (a WER).
      async_save: write in a background thread (the loop keeps training); :meth:`wait` blocks until done.
    """

    def __init__(self, directory: str, *, keep_last: int = 3, keep_best: int = 1, best_metric: str = "dev_wer",
                 async_save: bool = True):
        if keep_last < 1:
            raise ValueError(f"checkpoint keep_last must be >= 1, got {keep_last}")
        if keep_best < 0:
            raise ValueError(f"checkpoint keep_best must be >= 0, got {keep_best}")
        self.directory = os.path.abspath(directory)
        self.best_metric = best_metric
        policies = [ocm.LatestN(n=keep_last)]
        if keep_best > 0:
            policies.append(ocm.BestN(get_metric_fn=lambda m: m[best_metric], reverse=True, n=keep_best,
                                      keep_checkpoints_without_metrics=False))
        options = ocp.CheckpointManagerOptions(
            preservation_policy=ocm.AnyPreservationPolicy(policies),
            # best_fn also makes orbax write the metrics into the step folder, so that the best checkpoint is
            # still known (and kept) after a restart
            best_fn=lambda m: m[best_metric], best_mode="min", keep_checkpoints_without_metrics=True,
            enable_async_checkpointing=async_save,
            cleanup_tmp_directories=True,
            create=True,
        )
        self._mngr = ocp.CheckpointManager(self.directory, item_names=("state", "extra"), options=options)

    # -- queries ---------------------------------------------------------------------------------------------
    def all_steps(self) -> list[int]:
        return sorted(self._mngr.all_steps())

    def latest_step(self) -> int | None:
        return self._mngr.latest_step()

    def metrics(self, step: int) -> dict | None:
        return self._mngr.metrics(step)

    def best_step(self) -> int | None:
        """The kept step with the lowest `best_metric`, or None if no kept step has one."""
        best = None
        for s in self.all_steps():
            m = self.metrics(s)
            if m and self.best_metric in m and (best is None or m[self.best_metric] < best[1]):
                best = (s, m[self.best_metric])
        return None if best is None else best[0]

    # -- save / restore --------------------------------------------------------------------------------------
    def save(self, step: int, state: Any, extra: dict | None = None, metrics: dict | None = None) -> bool:
        """Saves `state` (a pytree of arrays) and `extra` (JSON-able; bytes allowed) as `step`."""
        if step in self._mngr.all_steps():
            return False
        args = ocp.args.Composite(state=ocp.args.StandardSave(state),
                                  extra=ocp.args.JsonSave(_to_json(extra or {})))
        return self._mngr.save(step, args=args, metrics=metrics, force=True)

    def restore(self, step: int | None, target: Any) -> tuple[Any, dict]:
        """Restores `step` (latest if None) into the structure, shapes and dtypes of `target`.

        `target` may be a concrete state or its ``jax.eval_shape`` abstraction. Returns (state, extra).
        """
        if step is None:
            step = self.latest_step()
        if step is None:
            raise FileNotFoundError(f"no checkpoint in {self.directory}")
        if step not in self._mngr.all_steps():
            raise FileNotFoundError(f"no checkpoint for step {step} in {self.directory} "
                                    f"(have {self.all_steps()})")
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, target)
        out = self._mngr.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract),
                                                               extra=ocp.args.JsonRestore()))
        return out["state"], _from_json(out["extra"] or {})

    def wait(self):
        self._mngr.wait_until_finished()

    def close(self):
        self._mngr.wait_until_finished()
        self._mngr.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
