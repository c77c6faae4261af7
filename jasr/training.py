"""The training loop (``train``) and loading a trained run for inference (``load_run``, ``evaluate_utterances``).

The loop does I/O only: it reads the config, data and tokenizer (:mod:`jasr.run_data`), asks the model family
(:mod:`jasr.tasks`) for the task, creates or restores the :class:`~jasr.steps.TrainState`, runs the jitted
:func:`~jasr.steps.train_step`, logs, evaluates dev WER and checkpoints. A run killed at any moment resumes at
the same step, optimiser state, PRNG key and data position (the data iterator's state is checkpointed with the
train state), and logs the same losses as a run that was never interrupted. With ``train.ema_decay`` > 0 the loop
also keeps an exponential moving average of the params (:mod:`jasr.averaging`), checkpointed with the state; dev
evaluation, the best checkpoint and ``load_run`` then use the EMA params. A run of several processes
(:mod:`jasr.distributed`) has one mesh over all their devices: each process loads its own rows of every batch,
process 0 alone writes the run files and logs, and all of them write the checkpoints together.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import os
import shutil
import sys
import contextlib
import tempfile
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from jax.tree_util import keystr, tree_flatten_with_path

from jasr import metrics as metrics_lib
from jasr.averaging import ema_decay_at, ema_update
from jasr.checkpoint import Checkpointer
from jasr.config import ConfigError, base_config, load_saved_config, save_config, validate_config
from jasr.distributed import global_batch, host_sum, is_main_process, process_row_block, sync_processes
from jasr.logs import SkipLog, TrainLogger
from jasr.manifests import Utterance, check_utterances
from jasr.optim import make_optimizer_from_config
from jasr.sharding import (DEFAULT_RULES, batch_devices, logical_specs, make_mesh, mesh_context, per_device_mib,
                           replicated, state_shardings)
from jasr.run_data import (RunData, check_bad_fraction, cut_dev_summary, device_inputs, dummy_batch, feature_config,
                           make_eval_loader, make_train_loader, prepare_data, raw_audio_batches, reference_texts,
                           resolve, unencodable_summary)
from jasr.steps import AUDIO_KEYS, TrainState, create_train_state, decode_step, eval_step, step_key, train_step
from jasr.tasks import Task, build_task, family
from jasr.tokenizers import load_tokenizer

# config keys that may change when a run resumes
_RESUMABLE_CHANGES = {("train", "num_steps"), ("train", "progress"), ("train", "stop_after"),
                      ("train", "tensorboard"), ("train", "async_checkpoint")}


def enable_compilation_cache(root: str) -> None:
    """JAX's persistent compilation cache ($JAX_COMPILATION_CACHE_DIR or <root>/.cache/jax): a resumed run and
    decode.py reuse the programs a run compiled."""
    path = os.environ.get("JAX_COMPILATION_CACHE_DIR") or os.path.join(root, ".cache", "jax")
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)


# ------------------------------------------------------------------------------------------------------------
# the loop

def train(cfg: ml_collections.ConfigDict, workdir: str, *, root: str | None = None) -> dict:
    """Trains (or resumes) the run in `workdir`. Returns the final metrics (train loss, dev WER/CER, steps)."""
    t = cfg.train
    # -- setup: config, data, task, optimiser ------------------------------------------------------------------
    root = os.path.abspath(root or os.getcwd())
    validate_config(cfg, repo_root=root)
    workdir = os.path.abspath(workdir)
    os.makedirs(workdir, exist_ok=True)
    ckpt_dir = os.path.join(workdir, "checkpoints")
    if os.path.isdir(ckpt_dir) and any(n.isdigit() for n in os.listdir(ckpt_dir)):
        _check_resume_config(cfg, workdir)
    # several processes: process 0 writes the run files (config, tokenizer, demo corpus, init_from copy) first;
    # the others then read them (a shared folder) or make their own identical copies (a host-local one)
    main = is_main_process()
    say = functools.partial(print, flush=True) if main else (lambda *a, **k: None)
    if main:
        save_config(cfg, os.path.join(workdir, "config.json"))
        data, hf_dir = prepare_data(cfg, workdir, root), init_source(cfg, workdir, root)
    sync_processes("jasr.training: run files")
    if not main:
        data, hf_dir = prepare_data(cfg, workdir, root), init_source(cfg, workdir, root)
    task = build_task(cfg, data.tokenizer.vocab_size, data.feature_config, tokenizer=data.tokenizer, hf_dir=hf_dir)
    # -- devices: a mesh over the devices of all processes; each process loads its rows of every batch ----------
    mesh = make_mesh(cfg.mesh)
    if jax.process_count() > 1 and mesh.size != jax.device_count():
        raise ConfigError(f"config 'mesh': a run of {jax.process_count()} processes needs a mesh over all "
                          f"{jax.device_count()} devices, got {dict(mesh.shape)} ({mesh.size} devices)")
    sharded = mesh.size > 1
    rows = process_row_block(mesh)
    train_loader = make_train_loader(cfg, data, task, rows=rows)
    tx, schedule = make_optimizer_from_config(cfg.optim, t.num_steps, frozen=task.frozen)
    init_batch = dummy_batch(train_loader.bucket_shapes[0], data.feature_config, raw_audio_batches(cfg))
    init_fn = jax.jit(functools.partial(create_train_state, task=task, tx=tx))
    init_key = jax.random.PRNGKey(cfg.seed)
    abstract = jax.eval_shape(init_fn, init_key, batch=init_batch)
    n_params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(abstract.params))
    # params and optimiser state sharded by logical names
    rules = getattr(task, "logical_axis_rules", DEFAULT_RULES)
    shardings = None
    if sharded:
        boxed = jax.eval_shape(task.init_boxed, jax.random.fold_in(init_key, 2), init_batch)["params"]
        shardings = state_shardings(abstract, logical_specs(boxed), mesh, rules)
        # a fresh or imported state is created sharded (each device computes its own shards)
        init_fn = jax.jit(functools.partial(create_train_state, task=task, tx=tx), out_shardings=shardings)
        say(f"[train] mesh {dict(mesh.shape)} over {mesh.size} of {jax.device_count()} devices "
            f"({jax.devices()[0].platform}); batch rows split over {batch_devices(mesh)}"
            + (f"; {jax.process_count()} processes, each loading 1/{rows[1]} of every batch"
               if jax.process_count() > 1 else ""))
    edges = [float(b.max_duration) for b in train_loader.buckets]
    dev_loader = make_eval_loader(cfg, data.dev, data.tokenizer, edges=edges, task=task) if data.dev else None
    say(f"[train] model {cfg.model.name}: {n_params / 1e6:.2f}M parameters; vocab {data.tokenizer.vocab_size}; "
        f"{train_loader.num_utterances} train / {dev_loader.num_utterances if dev_loader else 0} dev utterances"
        f"{_left_out_note(data, train_loader)}; batch shapes {train_loader.bucket_shapes}")
    if main:
        with open(os.path.join(workdir, "buckets.json"), "w") as f:
            json.dump({"bucket_boundaries": edges, "bucket_shapes": train_loader.bucket_shapes}, f)

    # -- initialise, or restore the latest checkpoint ---------------------------------------------------------
    it = iter(train_loader)
    ckpt = Checkpointer(ckpt_dir, keep_last=t.keep_last, keep_best=t.keep_best, async_save=t.async_checkpoint,
                        best_metric=task.best_metric)
    start, ema = 0, None
    for note in ckpt.repaired:
        say(f"[train] {note}")
    if ckpt.latest_step() is not None:
        # the newest checkpoint that reads back whole; newer ones that do not are set aside (<step>.corrupt), so
        # that the run writes those steps again
        target = checkpoint_tree(abstract, t.ema_decay)
        _, saved, extra, skipped = ckpt.restore_intact(_abstract_like(
            target, checkpoint_tree(shardings, t.ema_decay) if sharded else None))
        state, ema = split_checkpoint_tree(saved, t.ema_decay)
        for s, why in skipped:
            moved = ckpt.set_aside(s)
            say(f"[train] checkpoint step {s} does not read back whole ({why}); skipped it, moved to {moved}")
        it.set_state(extra["data_state"])
        start = int(state.step)
        say(f"[train] resumed from {ckpt_dir} at step {start}")
    elif t.init_from:
        src = resolve(t.init_from, root)
        params = task.load_pretrained(src, jax.random.fold_in(init_key, 1))
        if sharded:     # host arrays: the sharded init_fn takes them on every process
            params = jax.device_get(params)
        _check_same_tree(params, abstract.params, src)
        state = _commit(init_fn(init_key, batch=init_batch, params=params))
        say(f"[train] initialised from {src}")
    else:
        state = _commit(init_fn(init_key, batch=init_batch))
    if start == 0:
        # ema_0 = params_0, a copy: the train step donates the state's buffers
        ema = jax.tree.map(jnp.copy, state.params) if t.ema_decay > 0 else None
    say(f"[train] per device: {per_device_mib(state.params):.2f} MiB of parameters, "
        f"{per_device_mib((state.opt_state, ema)):.2f} MiB of optimiser state and EMA (activations not counted)")
    if start >= t.num_steps:
        say(f"[train] already at step {start} >= train.num_steps={t.num_steps}; nothing to do")
        ckpt.close()
        return {"step": start}

    # -- steps, logs, dev evaluation, checkpoints ---------------------------------------------------------------
    # the old state is donated: the compiler may write the new one into its buffers (XLA:CPU then grows its
    # temporaries by about as much: bench/results/scale.md)
    train_fn = jax.jit(functools.partial(train_step, task=task, tx=tx), donate_argnums=0,
                       **({"out_shardings": (shardings, replicated(mesh))} if sharded else {}))
    ema_fn = jax.jit(lambda e, p, s: ema_update(e, p, ema_decay_at(s, t.ema_decay)))
    # several processes: dev batches are whole on every process, the outputs replicated (read by each)
    eval_fn = eval_function(task, mesh if jax.process_count() > 1 else None)
    dev_texts = reference_texts(data.dev)
    # only process 0 writes the run's logs; the others log into a scratch folder of their own
    log_dir = workdir if main else tempfile.mkdtemp(prefix=f"jasr-process{jax.process_index()}-")
    logger = TrainLogger(log_dir, t.num_steps, start, progress=t.progress and main, tensorboard=t.tensorboard and main)
    # (a file that fails to load on another process is named on that process's stderr)
    skips = SkipLog(log_dir, start, echo=logger.write if main else functools.partial(print, file=sys.stderr,
                                                                                    flush=True))
    counts = functools.partial(_counts, skips, data, train_loader, dev_loader)
    logger.log_data(start, _log_left_out(skips, data, train_loader, dev_loader, logger.write,
                                         cfg.data.max_bad_fraction))
    acc, n_acc, counted = None, 0, np.zeros(2)
    infeasible = []      # (step, batch ids, per-row flags on device) until the next log line reads them
    step = start
    final = {}
    t0 = time.time()
    scope = contextlib.ExitStack()      # the mesh and axis rules, for the steps and evaluations below
    try:
        if sharded:
            scope.enter_context(mesh_context(mesh, rules))
        while step < t.num_steps:
            batch = next(it)
            if any(batch["errors"]):     # files that failed on first read: padding rows, named and counted
                _log_failed(skips, step + 1, "train", batch["ids"], batch["errors"], data, counts, logger,
                            cfg.data.max_bad_fraction)
            inputs = device_inputs(batch)
            state, m = train_fn(state, global_batch(inputs, mesh) if sharded else inputs, step_key(state))
            step += 1
            if ema is not None:
                ema = ema_fn(ema, state.params, state.step)
            infeasible.append((step, batch.get("global_ids", batch["ids"]), m.pop("infeasible_rows")))
            acc = m if acc is None else jax.tree.map(jnp.add, acc, m)
            n_acc += 1
            counted += (float(inputs["row_weights"].sum()), float(np.sum(batch["durations"])))
            if step % t.log_every == 0 or step == t.num_steps:
                logger.count(*(float(x) for x in host_sum(counted, mesh)))     # all processes' rows
                counted[:] = 0
                host = jax.device_get(acc)
                rec = {"loss": float(host["loss"]) / n_acc, "grad_norm": float(host["grad_norm"]) / n_acc,
                       "skipped": float(host["skipped"]), "skipped_total": int(state.skipped),
                       "lr": float(schedule(step // cfg.optim.grad_accum)),
                       "param_norm": float(host["param_norm"]) / n_acc}
                rec.update({k: float(host[k]) / n_acc for k in task.logged_aux if k in host})
                rec["infeasible_rows"] = _log_infeasible(skips, infeasible, data, counts, logger)
                infeasible = []
                final.update(logger.log_train(step, rec))
                acc, n_acc = None, 0
            dev_metrics = None
            if dev_loader is not None and (step % t.eval_every == 0 or step == t.num_steps):
                dev_metrics, dev_results = evaluate(_eval_state(state, ema), eval_fn, dev_loader, data.tokenizer,
                                                    dev_texts, max_batches=t.max_eval_batches)
                failed = [r for r in dev_results if "error" in r]
                if failed:
                    _log_failed(skips, step, "dev", [r["id"] for r in failed], [r["error"] for r in failed], data,
                                counts, logger, cfg.data.max_bad_fraction)
                logger.log_eval(step, "dev", dev_metrics)
                final.update({f"dev_{k}": v for k, v in dev_metrics.items()})
            stop_now = bool(t.stop_after) and step - start >= t.stop_after and step % t.log_every == 0
            if step % t.checkpoint_every == 0 or step == t.num_steps or stop_now:
                key = task.best_metric[len("dev_"):]
                ckpt_metrics = ({task.best_metric: float(dev_metrics[key])} if dev_metrics and key in dev_metrics
                                else None)
                ckpt.save(step, checkpoint_tree(state, t.ema_decay, ema),
                          extra={"data_state": it.get_state(), "step": step}, metrics=ckpt_metrics)
            logger.advance(step)
            if stop_now:
                logger.write(f"[train] stopping after {step - start} steps (train.stop_after)")
                break
    finally:
        scope.close()
        ckpt.close()
        logger.close()
        if not main:
            shutil.rmtree(log_dir, ignore_errors=True)
    final.update({"step": step, "wall_s": time.time() - t0, "skipped_total": int(state.skipped)})
    return final


def checkpoint_tree(state, ema_decay: float, ema=None):
    """What a checkpoint holds: the TrainState, or ``{"state", "ema"}`` for a run with train.ema_decay > 0 (`ema`
    defaults to ``state.params``: the restore target's structure)."""
    return state if ema_decay <= 0 else {"state": state, "ema": state.params if ema is None else ema}


def split_checkpoint_tree(tree, ema_decay: float):
    """(TrainState, EMA params or None) from what :func:`checkpoint_tree` saved."""
    return (tree, None) if ema_decay <= 0 else (tree["state"], tree["ema"])


def _eval_state(state: TrainState, ema):
    """The state evaluated on dev: with the EMA params when the run keeps an EMA."""
    return state if ema is None else state.replace(params=ema)


def _left_out_note(data: RunData, train_loader) -> str:
    """For the start line: how many utterances the header check and the train loader left out."""
    parts = []
    for split in ("train", "dev"):
        n = sum(r["split"] == split for r in data.skipped)
        if split == "train":
            n += sum(r["cause"] == "unencodable" for r in train_loader.skipped)
        if n:
            parts.append(f"{n} {split} skipped")
    dropped = sum(r["cause"] != "unencodable" for r in train_loader.skipped)
    if dropped:
        parts.append(f"{dropped} train dropped")
    return f" ({', '.join(parts)}: see skipped.jsonl)" if parts else ""


def _counts(skips: SkipLog, data: RunData, train_loader, dev_loader) -> dict:
    """The "data" record of metrics.jsonl: utterances used, skipped (bad input) and dropped (by config)."""
    return {"train_utterances": train_loader.num_utterances, "train_total": data.totals.get("train", len(data.train)),
            "skipped_utterances": skips.count("train", "skipped"),
            "dropped_utterances": skips.count("train", "dropped"),
            "no_loss_utterances": skips.count("train", "no_loss"),
            "dev_utterances": dev_loader.num_utterances if dev_loader else 0,
            "dev_total": data.totals.get("dev", len(data.dev)),
            "dev_skipped_utterances": skips.count("dev", "skipped"),
            "dev_no_loss_utterances": skips.count("dev", "no_loss")}


def _log_left_out(skips: SkipLog, data: RunData, train_loader, dev_loader, write, max_bad_fraction: float) -> dict:
    """Names every utterance left out before the first step (header check, train loader) and every dev utterance
    without a dev loss in `skips`; DataError past data.max_bad_fraction; returns the counts for metrics.jsonl."""
    for split in ("train", "dev"):
        skips.add(0, split, [r for r in data.skipped if r["split"] == split], "skipped")
    bad_text = [r for r in train_loader.skipped if r["cause"] == "unencodable"]
    skips.add(0, "train", bad_text, "skipped")
    skips.add(0, "train", [r for r in train_loader.skipped if r["cause"] != "unencodable"], "dropped")
    check_bad_fraction("train", [r for r in skips.records if r["split"] == "train" and r["action"] == "skipped"],
                       data.totals.get("train", len(data.train)), max_bad_fraction)
    line = unencodable_summary("train", bad_text, len(data.train))
    if line:
        write(f"[data] {line}: skipped (see skipped.jsonl)")
    if dev_loader is not None:
        skips.add(0, "dev", dev_loader.placeholders, "no_loss", echo=False)
        unfit = [r for r in dev_loader.placeholders if r["cause"] == "unfit"]
        for line in (unencodable_summary("dev", dev_loader.placeholders, len(data.dev)),
                     unfit and f"{len(unfit)} of {len(data.dev)} dev labels cannot fit their frames, "
                               f"e.g. {unfit[0]['id']}"):
            if line:
                write(f"[data] {line}: scored in WER against their text, no dev loss (see skipped.jsonl)")
        line = cut_dev_summary("dev", data.dev, data.feature_config)
        if line:
            write(f"[data] {line}")
    return _counts(skips, data, train_loader, dev_loader)


def _log_infeasible(skips: SkipLog, pending: list, data: RunData, counts: Callable[[], dict],
                    logger: TrainLogger) -> int:
    """Names the train utterances whose labels could not align with the model's frames in the `pending` steps
    (the CTC loss left those rows out); returns how many rows were left out."""
    audio = None
    n = 0
    for step, ids, flags in pending:
        rows = np.flatnonzero(np.asarray(jax.device_get(flags)) > 0)
        if not len(rows):
            continue
        n += len(rows)
        if audio is None:   # built only when a row was left out (a pass over the whole train split)
            audio = {u.id: u.audio_path for u in data.train}
        recs = [{"id": str(ids[r]), "audio": audio.get(str(ids[r]), ""), "cause": "infeasible",
                 "reason": "CTC: the label (tokens + repeats) is longer than the model's output frames; left out "
                           "of this step's loss"} for r in rows]
        if skips.add(step, "train", recs, "no_loss"):
            logger.log_data(step, counts())
    return n


def _log_failed(skips: SkipLog, step: int, split: str, ids, errors, data: RunData, counts: Callable[[], dict],
                logger: TrainLogger, max_bad_fraction: float) -> None:
    """Names the utterances of `split` whose file failed to load when read (the loader's `errors`; "" = loaded) in
    `skips` and metrics.jsonl; DataError past data.max_bad_fraction of the split."""
    audio = {u.id: u.audio_path for u in (data.train if split == "train" else data.dev)}
    recs = [{"id": str(i), "audio": audio.get(str(i), ""), "reason": str(e)} for i, e in zip(ids, errors) if e]
    if skips.add(step, split, recs, "skipped"):
        logger.log_data(step, counts())
        check_bad_fraction(split, [r for r in skips.records if r["split"] == split and r["action"] == "skipped"],
                           data.totals.get(split, len(audio)), max_bad_fraction)


def _check_resume_config(cfg: ml_collections.ConfigDict, workdir: str) -> None:
    """A run may only resume with the config it started with (num_steps, display options, the decode section,
    which training does not read, and the mesh, whose checkpoints restore onto any other, may change)."""
    path = os.path.join(workdir, "config.json")
    if not os.path.exists(path):
        return

    def flat(d, prefix=()):
        for k, v in d.items():
            if isinstance(v, dict):
                yield from flat(v, prefix + (k,))
            else:
                yield prefix + (k,), (list(v) if isinstance(v, tuple) else v)
    a, b = dict(flat(load_saved_config(path).to_dict())), dict(flat(cfg.to_dict()))
    diff = sorted(".".join(k) for k in set(a) | set(b)
                  if k not in _RESUMABLE_CHANGES and k[0] not in ("decode", "mesh") and a.get(k) != b.get(k))
    if diff:
        raise ConfigError(f"{workdir} holds a run with a different config ({', '.join(diff[:5])} differ); "
                          f"resume with the same config or use a new --workdir")


def init_source(cfg: ml_collections.ConfigDict, workdir: str, root: str) -> str | None:
    """The folder with the Hugging Face ``config.json`` (+ ``generation_config.json``) the model architecture
    comes from: a copy of train.init_from's in ``workdir/init_from/`` (made on the first call), so that a run
    folder stays loadable (decode.py) without the original directory. None without train.init_from."""
    if not cfg.train.init_from:
        return None
    local = os.path.join(workdir, "init_from")
    if os.path.isfile(os.path.join(local, "config.json")):
        return local
    src = resolve(cfg.train.init_from, root)
    if not os.path.isfile(os.path.join(src, "config.json")):
        raise ConfigError(f"config 'train.init_from': {src} has no config.json (not a Hugging Face model folder)")
    os.makedirs(local, exist_ok=True)
    for name in ("config.json", "generation_config.json"):
        if os.path.isfile(os.path.join(src, name)):
            shutil.copyfile(os.path.join(src, name), os.path.join(local, name))
    return local


def _commit(tree):
    """Places every array on its current sharding explicitly ("committed", as restored arrays are), so fresh and
    restored states lower to the same program."""
    return jax.tree.map(lambda x: jax.device_put(x, x.sharding), tree)


def _abstract_like(tree, shardings=None):
    """Restore targets with the live state's shardings (one device, or `shardings` of a mesh: a checkpoint saved
    under any mesh restores onto this one): a restored state then lowers to the same program as a fresh one (so
    the persistent compilation cache hits on resume)."""
    if shardings is None:
        device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
        return jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), x.dtype, sharding=device), tree)
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(np.shape(x), x.dtype, sharding=s), tree, shardings)


def _check_same_tree(params, abstract, src: str) -> None:
    """Pretrained params must have the model's structure and shapes (a clear error instead of a jit failure)."""
    a = {keystr(k): tuple(v.shape) for k, v in tree_flatten_with_path(params)[0]}
    b = {keystr(k): tuple(v.shape) for k, v in tree_flatten_with_path(abstract)[0]}
    if a != b:
        diff = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
        raise ValueError(f"train.init_from {src}: parameters do not fit the model ({diff[:3]}: "
                         f"{[a.get(k) for k in diff[:3]]} vs {[b.get(k) for k in diff[:3]]})")


# ------------------------------------------------------------------------------------------------------------
# evaluation

def eval_function(task: Task, mesh=None) -> Callable:
    """The jitted :func:`~jasr.steps.eval_step` of `task`: (state, batch) -> outputs; with a `mesh`, the outputs
    are replicated over it (every process of a multi-process run reads them; the batch is whole on each)."""
    return jax.jit(functools.partial(eval_step, task=task), **({"out_shardings": replicated(mesh)} if mesh else {}))


def decode_function(task: Task) -> Callable:
    """(state, batch) -> {"ids" [B, L], "lengths" [B]} for decoding whole files from their audio alone (labels are
    not passed on): the task's host-side long-form ``transcribe`` where it has one (batches from
    ``make_eval_loader(..., whole_files=True)``), else the jitted :func:`~jasr.steps.decode_step`."""
    if not task.transcribes_whole_files:
        step = jax.jit(functools.partial(decode_step, task=task))
        return lambda state, batch: step(state, {k: batch[k] for k in AUDIO_KEYS if k in batch})

    def transcribe(state: TrainState, batch: dict) -> dict:
        toks = task.transcribe(state.params, state.model_state, {k: batch[k] for k in AUDIO_KEYS if k in batch})
        ids = np.zeros((len(toks), max([len(t) for t in toks] + [1])), np.int32)
        for r, t in enumerate(toks):
            ids[r, :len(t)] = t
        return {"ids": ids, "lengths": np.array([len(t) for t in toks], np.int32)}
    return transcribe


def score_results(results: list[dict]) -> dict:
    """WER and CER ({"wer", "cer", "scored"}) over the results that have a reference; a result with an "error"
    (the file could not be read or decoded) counts with an empty hypothesis: all its words are deletions.
    {"scored": 0} when no result has a reference."""
    scored = [r for r in results if r["ref"]]
    if not scored:
        return {"scored": 0}
    refs, hyps = [r["ref"] for r in scored], [r.get("hyp", "") for r in scored]
    return {"wer": metrics_lib.wer(refs, hyps), "cer": metrics_lib.cer(refs, hyps), "scored": len(scored)}


def evaluate(state: TrainState, eval_fn: Callable, loader, tokenizer, texts: dict, *, max_batches: int = 0
             ) -> tuple[dict, list[dict]]:
    """Runs `eval_fn` over one pass of `loader`; returns ({loss, wer, cer, utterances, failed, scored},
    per-utterance results).

    `texts`: utterance id -> reference transcript ("" for files without one: no WER for those). `utterances` counts
    the utterances decoded (those with a reference are scored in WER/CER, placeholder labels included: they only
    have no loss); `failed` the files that could not be read: their result is ``{"id", "ref", "error"}`` and they
    count in WER/CER as all deletions (see :func:`score_results`); `scored` the results with a reference.
    `loss` is there when `eval_fn` scores the batches (not for a long-form ``decode_function``).
    """
    loss_sum = weight = 0.0
    results, failed = [], []
    has_loss = decodes = False
    for i, batch in enumerate(loader):
        if max_batches and i >= max_batches:
            break
        out = jax.device_get(eval_fn(state, device_inputs(batch)))
        if "loss_sum" in out:
            has_loss = True
            loss_sum += float(out["loss_sum"])
            weight += float(out["weight"])
        errors = batch.get("errors")
        for r, uid in enumerate(str(x) for x in batch["ids"]):
            if uid and errors is not None and errors[r]:
                failed.append({"id": uid, "ref": texts.get(uid) or "", "error": str(errors[r])})
        if "ids" in out:
            decodes = True
            for r, uid in enumerate(str(x) for x in batch["ids"]):
                if not uid or (errors is not None and errors[r]):
                    continue
                hyp_ids = out["ids"][r, :int(out["lengths"][r])].tolist()
                results.append({"id": uid, "ref": texts.get(uid) or "",
                                "hyp": " ".join(tokenizer.decode(hyp_ids).split())})
    m = {"utterances": len(results), "failed": len(failed)}
    if has_loss:
        m["loss"] = loss_sum / max(weight, 1.0)
    if decodes:      # a model with a decoder: failed files count as all deletions
        m.update(score_results(results + failed))
    return m, results + failed


# ------------------------------------------------------------------------------------------------------------
# a trained run, for inference

@dataclasses.dataclass
class RunInfo:
    """A trained run loaded for inference (see load_run)."""
    config: Any
    tokenizer: Any
    task: Task
    state: TrainState
    step: int
    bucket_edges: list | None


def load_run(workdir: str, *, checkpoint: str = "best", root: str | None = None, use_ema: bool = True) -> RunInfo:
    """A trained run; `checkpoint`: "best" (by the dev metric; the latest if none has one), "latest" or a step.
    For a run with train.ema_decay > 0 the state carries the EMA params (`use_ema=False`: the raw params)."""
    workdir = os.path.abspath(workdir)
    cfg_path = os.path.join(workdir, "config.json")
    if not os.path.exists(cfg_path):
        raise FileNotFoundError(f"{workdir} is not a training run folder (no config.json)")
    cfg = load_saved_config(cfg_path)
    for k, v in base_config().mesh.items():     # decoding spreads batches over this machine's devices, whatever
        cfg.mesh[k] = v                         # mesh trained the run
    tok = load_tokenizer(os.path.join(workdir, "tokenizer.json"))
    fc = feature_config(cfg)
    hf_dir = os.path.join(workdir, "init_from")
    if not os.path.isfile(os.path.join(hf_dir, "config.json")):
        hf_dir = resolve(cfg.train.init_from, root or os.getcwd()) if cfg.train.init_from else None
    task = build_task(cfg, tok.vocab_size, fc, tokenizer=tok, hf_dir=hf_dir)
    ckpt = Checkpointer(os.path.join(workdir, "checkpoints"), keep_last=cfg.train.keep_last,
                        keep_best=cfg.train.keep_best, async_save=False, best_metric=task.best_metric)
    if checkpoint not in ("best", "latest"):
        try:
            step = int(checkpoint)
        except ValueError:
            raise ValueError(f"checkpoint must be 'best', 'latest' or a step number, got {checkpoint!r}") from None
    if not ckpt.all_steps():
        raise FileNotFoundError(f"no checkpoint in {workdir}/checkpoints")
    tx, _ = make_optimizer_from_config(cfg.optim, cfg.train.num_steps, task.frozen)
    raw = raw_audio_batches(cfg)
    shape = (1, family(cfg.model.name).init_length(raw), 8)
    target = jax.eval_shape(lambda: create_train_state(jax.random.PRNGKey(0), task, tx, dummy_batch(shape, fc, raw)))
    target = checkpoint_tree(target, cfg.train.ema_decay)
    for note in ckpt.repaired:
        print(f"[load_run] {note}", file=sys.stderr, flush=True)
    try:
        if checkpoint in ("best", "latest"):   # the best (or latest) that reads back whole; a step is that step
            step, saved, _, skipped = ckpt.restore_intact(_abstract_like(target), prefer=checkpoint)
            for s, why in skipped:
                print(f"[load_run] checkpoint step {s} of {workdir} does not read back whole ({why}); skipped it",
                      file=sys.stderr, flush=True)
        else:
            saved, _ = ckpt.restore(step, _abstract_like(target))
    finally:
        ckpt.close()
    state, ema = split_checkpoint_tree(saved, cfg.train.ema_decay)
    if ema is not None and use_ema:
        state = state.replace(params=ema)
    edges = None
    if os.path.exists(os.path.join(workdir, "buckets.json")):
        with open(os.path.join(workdir, "buckets.json")) as f:
            edges = json.load(f)["bucket_boundaries"]
    return RunInfo(cfg, tok, task, state, step, edges)


def evaluate_utterances(run: RunInfo, utts: list[Utterance], *, bad: list[dict] = ()) -> tuple[dict, list[dict]]:
    """Transcripts of `utts` with a loaded run, in batches of the run's training shapes (whole files: long-form
    for a family that transcribes them, see :func:`decode_function`); WER/CER against the utterances that have a
    transcript (see :func:`evaluate`). Hypothesis lengths do not depend on the transcripts. Each file's header is
    checked first (jasr.manifests.check_utterances): a file that fails that check or fails to decode, and each
    record of `bad` (``{"id", "reason"}``, e.g. from read_manifest's `bad`), gets a result ``{"id", "ref",
    "error"}``, counts in `failed` and, with a reference, in WER/CER as all deletions; the others are decoded and
    scored. Every utterance of `utts` and `bad` has one result."""
    texts = reference_texts(utts)
    ok, unreadable = check_utterances(utts)
    failed = [{"id": r["id"], "ref": texts.get(r["id"]) or "", "error": r["reason"]} for r in [*bad, *unreadable]]
    m, results = {"utterances": 0, "failed": 0}, []
    if ok:
        loader = make_eval_loader(run.config, ok, run.tokenizer, edges=run.bucket_edges, task=run.task,
                                  whole_files=run.task.transcribes_whole_files)
        failed += [{"id": r["id"], "ref": texts.get(r["id"]) or "", "error": r["reason"]} for r in loader.skipped]
        m, results = evaluate(run.state, decode_function(run.task), loader, run.tokenizer, texts)
    m["failed"] += len(failed)
    m = {k: v for k, v in m.items() if k not in ("wer", "cer", "scored")}
    m.update(score_results(results + failed))
    return m, results + failed
