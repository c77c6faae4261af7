"""jasr.averaging against hand computations, and a training run with train.ema_decay: every checkpoint's EMA
follows the EMA recursion from the previous checkpoint's EMA and this step's params, also across a resume (the
EMA is part of what is saved), and load_run serves the EMA params (or the raw ones with use_ema=False)."""
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jasr.averaging import average_params, ema_decay_at, ema_update
from jasr.checkpoint import Checkpointer
from jasr.config import apply_override, load_config_file
from jasr.training import checkpoint_tree, load_run, train

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FSDD = os.path.join(ROOT, "..", "shared", "data", "fsdd")


def test_ema_update_and_decay_by_hand():
    ema = {"w": jnp.array([1.0, 2.0]), "b": jnp.array(3.0, jnp.bfloat16), "n": jnp.array(5, jnp.int32)}
    new = {"w": jnp.array([3.0, -2.0]), "b": jnp.array(1.0, jnp.bfloat16), "n": jnp.array(7, jnp.int32)}
    out = ema_update(ema, new, 0.75)
    np.testing.assert_allclose(out["w"], [0.75 * 1 + 0.25 * 3, 0.75 * 2 - 0.25 * 2])
    assert out["b"].dtype == jnp.bfloat16 and float(out["b"]) == 2.5 and int(out["n"]) == 7
    # warm-up: min(decay, (1 + s) / (10 + s))
    np.testing.assert_allclose([float(ema_decay_at(s, 0.99)) for s in (1, 10, 100, 1000)],
                               [2 / 11, 11 / 20, 101 / 110, 0.99], rtol=1e-6)
    # three steps by hand: e1 = 0.5 p0 + 0.5 p1 ...
    e, ps, d = jnp.zeros(()), [2.0, 4.0, 8.0], 0.5
    for p in ps:
        e = ema_update(e, jnp.asarray(p), d)
    assert float(e) == ((0 * 0.5 + 2 * 0.5) * 0.5 + 4 * 0.5) * 0.5 + 8 * 0.5
    jitted = jax.jit(lambda e, p, s: ema_update(e, p, ema_decay_at(s, 0.9)))(ema, new, 3)
    np.testing.assert_allclose(jitted["w"], 4 / 13 * np.array([1.0, 2.0]) + 9 / 13 * np.array([3.0, -2.0]),
                               rtol=1e-6)
    with pytest.raises(ValueError, match="decay"):
        ema_update(ema, new, 1.0)
    with pytest.raises(ValueError, match="structure"):
        ema_update(ema, {"w": new["w"]}, 0.5)
    with pytest.raises(ValueError, match="shapes"):
        ema_update({"w": jnp.zeros(2)}, {"w": jnp.zeros(3)}, 0.5)


def test_average_params_by_hand():
    trees = [{"a": jnp.array([1.0, 4.0]), "k": jnp.array(1)}, {"a": jnp.array([3.0, 0.0]), "k": jnp.array(2)},
             {"a": jnp.array([2.0, 2.0]), "k": jnp.array(3)}]
    out = average_params(trees)
    np.testing.assert_allclose(out["a"], [2.0, 2.0])
    assert int(out["k"]) == 3
    with pytest.raises(ValueError, match="at least one"):
        average_params([])
    with pytest.raises(ValueError, match="structure"):
        average_params([trees[0], {"a": trees[1]["a"]}])


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    with open(os.path.join(FSDD, "manifest.jsonl")) as f:
        recs = [json.loads(line) for line in f][:600:150]          # 4 short digits
    path = str(tmp_path_factory.mktemp("ema") / "train.jsonl")
    with open(path, "w") as f:
        for r in recs:
            f.write(json.dumps({**r, "audio": os.path.abspath(os.path.join(FSDD, r["audio"]))}) + "\n")
    return path


def test_training_keeps_and_resumes_the_ema(manifest, tmp_path):
    cfg = load_config_file(os.path.join(ROOT, "configs", "fsdd.py"))
    overrides = {"data.train_manifest": manifest, "data.dev_manifest": manifest, "data.speakers_dev": "()",
                 "data.num_buckets": "1", "data.max_frames": "400", "model.d_model": "16", "model.num_layers": "1",
                 "model.num_heads": "2", "model.subsampling_channels": "4", "model.conv_kernel": "3",
                 "train.num_steps": "6", "train.log_every": "1", "train.eval_every": "3", "train.checkpoint_every": "1",
                 "train.keep_last": "10", "train.max_eval_batches": "1", "train.progress": "False",
                 "train.tensorboard": "False", "train.async_checkpoint": "False", "train.ema_decay": "0.5",
                 "optim.warmup_steps": "0", "optim.schedule": "constant", "optim.lr": "0.01"}
    for k, v in overrides.items():
        apply_override(cfg, k, v)
    workdir = str(tmp_path / "run")
    apply_override(cfg, "train.stop_after", "3")
    assert train(cfg, workdir, root=ROOT)["step"] == 3
    apply_override(cfg, "train.stop_after", "0")
    assert train(cfg, workdir, root=ROOT)["step"] == 6

    target = checkpoint_tree(load_run(workdir, checkpoint="latest", root=ROOT).state, 0.5)
    ckpt = Checkpointer(os.path.join(workdir, "checkpoints"), keep_last=10, keep_best=0, async_save=False)
    try:
        saved = {s: ckpt.restore(s, target)[0] for s in range(1, 7)}
    finally:
        ckpt.close()
    for s in range(2, 7):      # ema_s = d_s ema_{s-1} + (1 - d_s) params_s, d_s = min(0.5, (1 + s) / (10 + s))
        d = min(0.5, (1 + s) / (10 + s))
        want = jax.tree.map(lambda e, p: d * np.asarray(e) + (1 - d) * np.asarray(p), saved[s - 1]["ema"],
                            saved[s]["state"].params)
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), saved[s]["ema"], want)
    raw, ema = saved[6]["state"].params, saved[6]["ema"]
    assert not all(np.allclose(a, b) for a, b in zip(jax.tree.leaves(raw), jax.tree.leaves(ema)))

    for use_ema, want in ((True, ema), (False, raw)):
        run = load_run(workdir, checkpoint="latest", root=ROOT, use_ema=use_ema)
        assert run.step == 6
        jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), run.state.params,
                     want)
