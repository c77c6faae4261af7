"""The training loop (``train``) and loading a trained run for inference (``load_run``, ``evaluate_utterances``).

The loop does I/O only: it reads the config, data and tokenizer (:mod:`jasr.run_data`), asks the model family
(:mod:`jasr.tasks`) for the task, creates or restores the :class:`~jasr.steps.TrainState`, runs the jitted
:func:`~jasr.steps.train_step`, logs, evaluates dev WER and checkpoints. A run killed at any moment resumes at
the same step, optimiser state, PRNG key and data position (the data iterator's state is checkpointed with the
train state), and logs the same losses as a run that was never interrupted.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import os
import shutil
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from jax.tree_util import keystr, tree_flatten_with_path

from jasr import metrics as metrics_lib
from jasr.checkpoint import Checkpointer
from jasr.config import ConfigError, load_saved_config, save_config, validate_config
from jasr.data import Utterance
from jasr.logs import TrainLogger
from jasr.optim import make_optimizer_from_config
from jasr.run_data import (device_inputs, dummy_batch, feature_config, make_eval_loader, make_train_loader,
                           prepare_data, raw_audio_batches, reference_texts, resolve)
from jasr.steps import TrainState, create_train_state, eval_step, step_key, train_step
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
    save_config(cfg, os.path.join(workdir, "config.json"))

    data = prepare_data(cfg, workdir, root)
    hf_dir = init_source(cfg, workdir, root)
    task = build_task(cfg, data.tokenizer.vocab_size, data.feature_config, tokenizer=data.tokenizer, hf_dir=hf_dir)
    train_loader = make_train_loader(cfg, data)
    tx, schedule = make_optimizer_from_config(cfg.optim, t.num_steps, frozen=task.frozen)
    init_batch = dummy_batch(train_loader.bucket_shapes[0], data.feature_config, raw_audio_batches(cfg))
    init_fn = jax.jit(functools.partial(create_train_state, task=task, tx=tx))
    init_key = jax.random.PRNGKey(cfg.seed)
    abstract = jax.eval_shape(init_fn, init_key, batch=init_batch)
    n_params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(abstract.params))
    print(f"[train] model {cfg.model.name}: {n_params / 1e6:.2f}M parameters; vocab {data.tokenizer.vocab_size}; "
          f"{len(data.train)} train / {len(data.dev)} dev utterances; batch shapes {train_loader.bucket_shapes}",
          flush=True)
    edges = [float(b.max_duration) for b in train_loader.buckets]
    with open(os.path.join(workdir, "buckets.json"), "w") as f:
        json.dump({"bucket_boundaries": edges, "bucket_shapes": train_loader.bucket_shapes}, f)

    # -- initialise, or restore the latest checkpoint ---------------------------------------------------------
    it = iter(train_loader)
    ckpt = Checkpointer(ckpt_dir, keep_last=t.keep_last, keep_best=t.keep_best, async_save=t.async_checkpoint,
                        best_metric=task.best_metric)
    start = 0
    if ckpt.latest_step() is not None:
        state, extra = ckpt.restore(None, _abstract_like(abstract))
        it.set_state(extra["data_state"])
        start = int(state.step)
        print(f"[train] resumed from {ckpt_dir} at step {start}", flush=True)
    elif t.init_from:
        src = resolve(t.init_from, root)
        params = task.load_pretrained(src, jax.random.fold_in(init_key, 1))
        _check_same_tree(params, abstract.params, src)
        state = _commit(init_fn(init_key, batch=init_batch, params=params))
        print(f"[train] initialised from {src}", flush=True)
    else:
        state = _commit(init_fn(init_key, batch=init_batch))
    if start >= t.num_steps:
        print(f"[train] already at step {start} >= train.num_steps={t.num_steps}; nothing to do", flush=True)
        ckpt.close()
        return {"step": start}

    # -- steps, logs, dev evaluation, checkpoints ---------------------------------------------------------------
    train_fn = jax.jit(functools.partial(train_step, task=task, tx=tx))
    eval_fn = eval_function(task)
    dev_loader = make_eval_loader(cfg, data.dev, data.tokenizer, edges=edges) if data.dev else None
    dev_texts = reference_texts(data.dev)
    logger = TrainLogger(workdir, t.num_steps, start, progress=t.progress, tensorboard=t.tensorboard)
    acc, n_acc = None, 0
    step = start
    final = {}
    t0 = time.time()
    try:
        while step < t.num_steps:
            batch = next(it)
            inputs = device_inputs(batch)
            state, m = train_fn(state, inputs, step_key(state))
            step += 1
            acc = m if acc is None else jax.tree.map(jnp.add, acc, m)
            n_acc += 1
            logger.count(float(inputs["row_weights"].sum()), float(np.sum(batch["durations"])))
            if step % t.log_every == 0 or step == t.num_steps:
                host = jax.device_get(acc)
                rec = {"loss": float(host["loss"]) / n_acc, "grad_norm": float(host["grad_norm"]) / n_acc,
                       "skipped": float(host["skipped"]), "skipped_total": int(state.skipped),
                       "lr": float(schedule(step // cfg.optim.grad_accum)),
                       "param_norm": float(host["param_norm"]) / n_acc}
                rec.update({k: float(host[k]) / n_acc for k in task.logged_aux if k in host})
                final.update(logger.log_train(step, rec))
                acc, n_acc = None, 0
            dev_metrics = None
            if dev_loader is not None and (step % t.eval_every == 0 or step == t.num_steps):
                dev_metrics, _ = evaluate(state, eval_fn, dev_loader, data.tokenizer, dev_texts,
                                          max_batches=t.max_eval_batches)
                logger.log_eval(step, "dev", dev_metrics)
                final.update({f"dev_{k}": v for k, v in dev_metrics.items()})
            stop_now = bool(t.stop_after) and step - start >= t.stop_after and step % t.log_every == 0
            if step % t.checkpoint_every == 0 or step == t.num_steps or stop_now:
                key = task.best_metric[len("dev_"):]
                ckpt_metrics = ({task.best_metric: float(dev_metrics[key])} if dev_metrics and key in dev_metrics
                                else None)
                ckpt.save(step, state, extra={"data_state": it.get_state(), "step": step}, metrics=ckpt_metrics)
            logger.advance(step)
            if stop_now:
                logger.write(f"[train] stopping after {step - start} steps (train.stop_after)")
                break
    finally:
        ckpt.close()
        logger.close()
    final.update({"step": step, "wall_s": time.time() - t0, "skipped_total": int(state.skipped)})
    return final


def _check_resume_config(cfg: ml_collections.ConfigDict, workdir: str) -> None:
    """A run may only resume with the config it started with (num_steps and display options may change)."""
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
    diff = sorted(".".join(k) for k in set(a) | set(b) if k not in _RESUMABLE_CHANGES and a.get(k) != b.get(k))
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


def _abstract_like(tree):
    """Restore targets with the live state's shardings: a restored state then lowers to the same program as a
    fresh one (so the persistent compilation cache hits on resume)."""
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), x.dtype, sharding=device), tree)


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

def eval_function(task: Task) -> Callable:
    """The jitted :func:`~jasr.steps.eval_step` of `task`: (state, batch) -> outputs."""
    return jax.jit(functools.partial(eval_step, task=task))


def evaluate(state: TrainState, eval_fn: Callable, loader, tokenizer, texts: dict, *, max_batches: int = 0
             ) -> tuple[dict, list[dict]]:
    """Runs `eval_fn` over one pass of `loader`; returns ({loss, wer, cer, utterances}, per-utterance results).

    `texts`: utterance id -> reference transcript ("" for files without one: no WER for those).
    """
    loss_sum = weight = 0.0
    results = []
    for i, batch in enumerate(loader):
        if max_batches and i >= max_batches:
            break
        out = jax.device_get(eval_fn(state, device_inputs(batch)))
        loss_sum += float(out["loss_sum"])
        weight += float(out["weight"])
        if "ids" in out:
            for r, uid in enumerate(str(x) for x in batch["ids"]):
                if not uid:
                    continue
                hyp_ids = out["ids"][r, :int(out["lengths"][r])].tolist()
                results.append({"id": uid, "ref": texts.get(uid) or "",
                                "hyp": " ".join(tokenizer.decode(hyp_ids).split())})
    m = {"loss": loss_sum / max(weight, 1.0), "utterances": len(results)}
    scored = [r for r in results if r["ref"]]
    if scored:
        refs, hyps = [r["ref"] for r in scored], [r["hyp"] for r in scored]
        m["wer"] = metrics_lib.wer(refs, hyps)
        m["cer"] = metrics_lib.cer(refs, hyps)
    return m, results


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


def load_run(workdir: str, *, checkpoint: str = "best", root: str | None = None) -> RunInfo:
    """A trained run; `checkpoint`: "best" (by the dev metric; the latest if none has one), "latest" or a step."""
    workdir = os.path.abspath(workdir)
    cfg_path = os.path.join(workdir, "config.json")
    if not os.path.exists(cfg_path):
        raise FileNotFoundError(f"{workdir} is not a training run folder (no config.json)")
    cfg = load_saved_config(cfg_path)
    tok = load_tokenizer(os.path.join(workdir, "tokenizer.json"))
    fc = feature_config(cfg)
    hf_dir = os.path.join(workdir, "init_from")
    if not os.path.isfile(os.path.join(hf_dir, "config.json")):
        hf_dir = resolve(cfg.train.init_from, root or os.getcwd()) if cfg.train.init_from else None
    task = build_task(cfg, tok.vocab_size, fc, tokenizer=tok, hf_dir=hf_dir)
    ckpt = Checkpointer(os.path.join(workdir, "checkpoints"), keep_last=cfg.train.keep_last,
                        keep_best=cfg.train.keep_best, async_save=False, best_metric=task.best_metric)
    if checkpoint == "best":
        step = ckpt.best_step() or ckpt.latest_step()
    elif checkpoint == "latest":
        step = ckpt.latest_step()
    else:
        step = int(checkpoint)
    if step is None:
        raise FileNotFoundError(f"no checkpoint in {workdir}/checkpoints")
    tx, _ = make_optimizer_from_config(cfg.optim, cfg.train.num_steps, task.frozen)
    raw = raw_audio_batches(cfg)
    shape = (1, family(cfg.model.name).init_length(raw), 8)
    target = jax.eval_shape(lambda: create_train_state(jax.random.PRNGKey(0), task, tx, dummy_batch(shape, fc, raw)))
    state, _ = ckpt.restore(step, _abstract_like(target))
    ckpt.close()
    edges = None
    if os.path.exists(os.path.join(workdir, "buckets.json")):
        with open(os.path.join(workdir, "buckets.json")) as f:
            edges = json.load(f)["bucket_boundaries"]
    return RunInfo(cfg, tok, task, state, step, edges)


def evaluate_utterances(run: RunInfo, utts: list[Utterance]) -> tuple[dict, list[dict]]:
    """Greedy transcripts of `utts` with a loaded run, in batches of the run's training shapes; WER/CER against
    the utterances that have a transcript (see :func:`evaluate`)."""
    loader = make_eval_loader(run.config, utts, run.tokenizer, edges=run.bucket_edges)
    return evaluate(run.state, eval_function(run.task), loader, run.tokenizer, reference_texts(utts))
