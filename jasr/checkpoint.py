"""Checkpoints with orbax: every N steps and at the end, keep the last K plus the best by a dev metric, atomic,
exact resume (train state incl. optimiser state and PRNG key, step, data-iterator position), verified on restore.

Atomicity: orbax writes each step into a temporary folder (``<step>.orbax-checkpoint-tmp-*``) and renames it to
``<step>`` only once every file is on disk; a process killed mid-save leaves only the temporary folder, which
``latest_step`` never reports and which is removed when the manager is opened again
(``cleanup_tmp_directories``).

Integrity: :meth:`Checkpointer.save` stores a checksum of every array of the state (two sums of its bits, plain and
position-weighted, computed on device) and a SHA-256 of the extra JSON; a restore recomputes them, so a checkpoint
whose files were truncated or overwritten after the save is an error (:class:`CheckpointError`) naming the step
and the array, never a silently different state (orbax's own checks catch truncated files but not a changed byte
of array data). :meth:`Checkpointer.restore_intact` falls back to the next checkpoint when one does not read back
whole, and reports which it skipped and why.

Write errors (a full disk) are one :class:`CheckpointError` naming the step and the folder, with the cause first;
the checkpoints already written stay as they were (orbax deletes old steps only after a new one is committed).
What orbax and tensorstore print around such a failure (their absl log records, the "Event loop is closed"
reports of callbacks that arrive after orbax closed its event loop) repeats the error and is filtered out.

Layout of a step folder: ``state`` (the TrainState pytree, orbax StandardSave), ``extra`` (JSON: data-iterator
state, anything else the loop needs, and the checksums), ``metrics`` (JSON, written by orbax when dev metrics are
given).
"""
from __future__ import annotations

import base64
import errno
import glob
import hashlib
import json
import logging
import os
import shutil
import sys
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils
from jax.tree_util import keystr, tree_flatten_with_path
from orbax.checkpoint import checkpoint_managers as ocm

from jasr.distributed import sync_processes

__all__ = ["CheckpointError", "Checkpointer", "is_disk_full", "state_checksums"]

_INTEGRITY = "__integrity__"     # key of the checksums in the extra JSON


class CheckpointError(ValueError):
    """A checkpoint does not read back whole (truncated, overwritten or missing files), or cannot be written (a
    full disk); the message names the step and the folder, the cause first. `reason`: the cause alone."""

    def __init__(self, message: str, reason: str | None = None):
        super().__init__(message)
        self.reason = reason or message


# ------------------------------------------------------------------------------------------------------------
# JSON

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


def _json_digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()


# ------------------------------------------------------------------------------------------------------------
# checksums

def _leaf_checksum(x):
    if jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
        x = jax.random.key_data(x)
    if x.dtype == jnp.bool_:
        u = x.astype(jnp.uint32)
    else:
        unsigned = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint32}[x.dtype.itemsize]
        u = jax.lax.bitcast_convert_type(x, unsigned).astype(jnp.uint32)   # 8 bytes -> [..., 2] words
    u = u.reshape(-1)
    pos = jnp.arange(1, u.size + 1, dtype=jnp.uint32)
    return jnp.stack([jnp.sum(u, dtype=jnp.uint32), jnp.sum(u * pos, dtype=jnp.uint32)])


@jax.jit
def _checksums(tree):
    rows = [_leaf_checksum(x) for x in jax.tree.leaves(tree)]
    return jnp.stack(rows) if rows else jnp.zeros((0, 2), jnp.uint32)


def state_checksums(tree) -> list[list[int]]:
    """Per array of `tree` (in ``jax.tree.leaves`` order): [sum of its 32-bit words, sum of word * position], both
    modulo 2**32 (exact and independent of reduction order and sharding; computed on device; the same in every
    process of a multi-process run)."""
    sums = _checksums(tree)
    if not sums.is_fully_addressable:     # spread over the devices of several processes: every process reads all
        sums = multihost_utils.process_allgather(sums, tiled=True)
    return np.asarray(jax.device_get(sums)).tolist()


def _verify(state, extra: dict, integrity) -> None:
    """Raises CheckpointError (the reason) if `state` or `extra` differ from the checksums saved with them."""
    try:
        want_state, want_extra = integrity["state"], integrity["extra"]
    except (TypeError, KeyError):
        raise CheckpointError("its checksum record is damaged") from None
    got = state_checksums(state)
    if len(got) != len(want_state):
        raise CheckpointError(f"the state has {len(got)} arrays, but {len(want_state)} checksums were saved with it")
    if got != want_state:
        paths = [keystr(p) for p, _ in tree_flatten_with_path(state)[0]]
        bad = [p for p, a, b in zip(paths, got, want_state) if a != b]
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        raise CheckpointError(f"array {bad[0]}{more} differs from the checksum saved with it (a data file changed "
                              f"after the save)")
    if _json_digest(extra) != want_extra:
        raise CheckpointError("its extra JSON (data-iterator state) differs from the checksum saved with it")


# ------------------------------------------------------------------------------------------------------------
# errors and the noise around them

def _brief(e: BaseException, limit: int = 400) -> str:
    """One line of the message of the exception `e` was raised from (its root cause): tensorstore's spec dumps cut
    off, long messages shortened in the middle."""
    e = list(_chain(e))[-1]
    msg = " ".join(str(e).split())
    for cut in (" [tensorstore_spec=", " See full TensorStore details"):
        msg = msg.split(cut)[0]
    if type(e) not in (Exception, ValueError, RuntimeError, OSError):
        msg = f"{type(e).__name__}: {msg}" if msg else type(e).__name__
    return msg if len(msg) <= limit else msg[:limit // 2 - 3] + " ... " + msg[-(limit // 2 - 2):]


def _chain(e: BaseException):
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        yield e
        e = e.__cause__ or e.__context__


def is_disk_full(e: BaseException) -> bool:
    """True if `e` (or an exception it was raised from) says the disk or the quota is full."""
    for x in _chain(e):
        if isinstance(x, OSError) and x.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        text = str(x)
        if ("No space left on device" in text or "Disk quota exceeded" in text
                or f"os_error_code='{errno.ENOSPC}'" in text):
            return True
    return False


def _is_orbax_frame(path: str) -> bool:
    return f"{os.sep}orbax{os.sep}" in path or f"{os.sep}tensorstore{os.sep}" in path


class _OrbaxLogFilter(logging.Filter):
    """Drops orbax's absl log records below CRITICAL (its errors come back as exceptions, re-raised here as
    CheckpointError; its warnings are about options this module does not use), and asyncio's reports of orbax
    tasks whose exception nobody retrieved (the same error, once per array that was being written)."""

    def filter(self, record):
        if record.levelno >= logging.CRITICAL:
            return True
        if record.name == "asyncio":
            return not (str(record.msg).startswith("Task exception was never retrieved")
                        and _is_orbax_frame(record.getMessage()))
        return not _is_orbax_frame(record.pathname or "")


def _unraisable_filter(previous):
    def hook(u):
        exc, obj = u.exc_value, u.object
        if isinstance(exc, RuntimeError) and str(exc) == "Event loop is closed":
            return      # a tensorstore callback for an orbax event loop that was closed after an error
        code = getattr(obj, "cr_code", None)
        if code is not None and _is_orbax_frame(code.co_filename):
            return      # an orbax coroutine that never ran because its event loop was closed after an error
        previous(u)
    hook._jasr_checkpoint = True
    return hook


def _quiet_orbax_noise() -> None:
    """Installs (once per process) the filters for what orbax and tensorstore print around a failed read or
    write; the CheckpointError this module raises says it once."""
    for name in ("absl", "asyncio"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, _OrbaxLogFilter) for f in logger.filters):
            logger.addFilter(_OrbaxLogFilter())
    if not getattr(sys.unraisablehook, "_jasr_checkpoint", False):
        sys.unraisablehook = _unraisable_filter(sys.unraisablehook)


# ------------------------------------------------------------------------------------------------------------

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
        _quiet_orbax_noise()
        self.directory = os.path.abspath(directory)
        self.best_metric = best_metric
        self._pending = None     # the step an asynchronous save is still writing
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
        # several processes: process 0 repairs the (shared) folder, the others wait for it
        self.repaired = self._set_aside_bad_metrics() if jax.process_index() == 0 else []
        sync_processes("jasr.checkpoint: folder repaired")
        self._mngr = ocp.CheckpointManager(self.directory, item_names=("state", "extra"), options=options)

    def _set_aside_bad_metrics(self) -> list[str]:
        """orbax reads every step's dev metrics when it opens the folder and fails on one that does not parse: such
        a file is renamed ``metrics.corrupt`` (the step then has no dev metric; its state is checked on restore).
        Returns a line per file renamed."""
        notes = []
        for path in sorted(glob.glob(os.path.join(self.directory, "*", "metrics", "metrics"))):
            if not os.path.basename(os.path.dirname(os.path.dirname(path))).isdigit():
                continue
            try:
                with open(path, "rb") as f:
                    json.loads(f.read().decode("utf-8"))
                continue
            except (ValueError, UnicodeDecodeError) as e:
                why = _brief(e)
            os.replace(path, path + ".corrupt")
            notes.append(f"the dev metrics of checkpoint {os.path.dirname(os.path.dirname(path))} do not read back "
                         f"({why}); renamed to metrics.corrupt (that step counts as one without a dev metric)")
        return notes

    # -- queries ---------------------------------------------------------------------------------------------
    def all_steps(self) -> list[int]:
        return sorted(self._mngr.all_steps())

    def latest_step(self) -> int | None:
        return self._mngr.latest_step()

    def metrics(self, step: int) -> dict | None:
        return self._mngr.metrics(step)

    def best_step(self) -> int | None:
        """The kept step with the lowest `best_metric`, or None if no kept step has one."""
        ranked = self._by_metric()
        return ranked[0] if ranked else None

    def _by_metric(self) -> list[int]:
        """Kept steps that have `best_metric`, best first (ties: the earlier step first). A metrics file that does
        not read back counts as none."""
        scored = []
        for s in self.all_steps():
            try:
                m = self.metrics(s)
            except Exception:   # noqa: BLE001 (a damaged metrics file: the step's state may still be whole)
                m = None
            if isinstance(m, dict) and isinstance(m.get(self.best_metric), (int, float)):
                scored.append((m[self.best_metric], s))
        return [s for _, s in sorted(scored)]

    # -- save ------------------------------------------------------------------------------------------------
    def save(self, step: int, state: Any, extra: dict | None = None, metrics: dict | None = None) -> bool:
        """Saves `state` (a pytree of arrays) and `extra` (JSON-able; bytes allowed) as `step`, with their
        checksums. Raises :class:`CheckpointError` if this or the previous (asynchronous) save cannot be written."""
        self.wait()
        if step in self._mngr.all_steps():
            return False
        extra_json = _to_json(extra or {})
        integrity = {"state": state_checksums(state), "extra": _json_digest(extra_json)}
        args = ocp.args.Composite(state=ocp.args.StandardSave(state),
                                  extra=ocp.args.JsonSave({**extra_json, _INTEGRITY: integrity}))
        try:
            saved = self._mngr.save(step, args=args, metrics=metrics, force=True)
        except Exception as e:
            raise self._write_error(step, e) from e
        self._pending = step
        return saved

    def wait(self):
        """Blocks until an asynchronous save is on disk; raises :class:`CheckpointError` if it failed."""
        step, self._pending = self._pending, None
        try:
            self._mngr.wait_until_finished()
        except Exception as e:
            raise self._write_error(step, e) from e

    def _write_error(self, step: int | None, e: Exception) -> CheckpointError:
        for tmp in glob.glob(os.path.join(self.directory, f"{step}.orbax-checkpoint-tmp*")):
            shutil.rmtree(tmp, ignore_errors=True)     # what the failed save wrote: free the space
        try:
            self._mngr.reload()
            kept = [s for s in self.all_steps() if s != step]
        except Exception:   # noqa: BLE001 (the folder may be unreadable too; the message says so below)
            kept = None
        what = "no space left on device" if is_disk_full(e) else "cannot write"
        msg = f"{what} while writing checkpoint step {step} to {self.directory} ({_brief(e)}); "
        if kept:
            msg += f"the checkpoints before it are kept (latest: step {max(kept)})"
        elif kept is None:
            msg += "could not list the checkpoints before it"
        else:
            msg += "there is no earlier checkpoint"
        return CheckpointError(msg)

    # -- restore ---------------------------------------------------------------------------------------------
    def restore(self, step: int | None, target: Any) -> tuple[Any, dict]:
        """Restores `step` (latest if None) into the structure, shapes and dtypes of `target`, checking it
        against the checksums stored by :meth:`save`.

        `target` may be a concrete state or its ``jax.eval_shape`` abstraction. Returns (state, extra). Raises
        FileNotFoundError if there is no such step, :class:`CheckpointError` if it does not read back whole.
        """
        if step is None:
            step = self.latest_step()
        if step is None:
            raise FileNotFoundError(f"no checkpoint in {self.directory}")
        if step not in self._mngr.all_steps():
            raise FileNotFoundError(f"no checkpoint for step {step} in {self.directory} "
                                    f"(have {self.all_steps()})")
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, target)
        try:
            try:
                out = self._mngr.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract),
                                                                       extra=ocp.args.JsonRestore()))
            except Exception as e:
                raise CheckpointError(_brief(e)) from e
            state, extra = out["state"], out["extra"] or {}
            if not isinstance(extra, dict):
                raise CheckpointError(f"its extra JSON is a {type(extra).__name__}, not an object")
            integrity = extra.pop(_INTEGRITY, None)
            if integrity is not None:   # (checkpoints written before checksums were stored have none)
                _verify(state, extra, integrity)
        except CheckpointError as e:
            raise CheckpointError(f"checkpoint step {step} in {self.directory} does not read back whole: {e}",
                                  reason=str(e)) from e.__cause__
        return state, _from_json(extra)

    def restore_intact(self, target: Any, *, prefer: str = "latest") -> tuple[int, Any, dict, list[tuple[int, str]]]:
        """The first checkpoint that reads back whole (:meth:`restore`), trying the latest first
        (`prefer` = "latest") or the best by `best_metric` first, then the rest latest first ("best").

        Returns (step, state, extra, skipped): `skipped` lists (step, reason) of the checkpoints tried before
        it. Raises FileNotFoundError if there is none, :class:`CheckpointError` naming each if none is intact."""
        if prefer not in ("latest", "best"):
            raise ValueError(f"prefer must be 'latest' or 'best', got {prefer!r}")
        steps = self.all_steps()[::-1]
        if not steps:
            raise FileNotFoundError(f"no checkpoint in {self.directory}")
        if prefer == "best":
            best = self._by_metric()
            steps = best + [s for s in steps if s not in best]
        skipped = []
        for s in steps:
            try:
                state, extra = self.restore(s, target)
            except CheckpointError as e:
                skipped.append((s, e.reason))
                continue
            return s, state, extra, skipped
        raise CheckpointError(f"no checkpoint in {self.directory} reads back whole: "
                              + "; ".join(f"step {s}: {why}" for s, why in skipped))

    def set_aside(self, step: int) -> str:
        """Renames step folder `step` to ``<step>.corrupt`` (no longer a checkpoint, kept for inspection; an older
        one of that name is replaced), so that the step can be written again. Returns the new path."""
        src = os.path.join(self.directory, str(step))
        dst = src + ".corrupt"
        if jax.process_index() == 0:      # several processes: process 0 renames, the others wait for it
            if os.path.exists(dst):
                shutil.rmtree(dst)
            os.rename(src, dst)
        sync_processes(f"jasr.checkpoint: step {step} set aside")
        self._mngr.reload()
        return dst

    def close(self):
        try:
            self.wait()
        finally:
            self._mngr.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
