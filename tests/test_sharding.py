"""jasr.sharding: mesh sizes from a run's mesh section, and one Conformer-CTC training step sharded over 8 host CPU
devices (data, fsdp, tensor) giving the single-device loss and gradients.

The 8 devices exist only in a fresh interpreter started with
``XLA_FLAGS=--xla_force_host_platform_device_count=8`` (the flag must be set before JAX starts), so the sharded
checks run in one subprocess; the rest of the suite keeps one device.
"""
import os
import re
import textwrap

import jax
import pytest
from jax.sharding import PartitionSpec

from jasr.config import apply_override, load_config_file
from jasr.run_data import dummy_batch, feature_config, raw_audio_batches
from jasr.sharding import logical_specs, mesh_shape
from jasr.tasks import build_task
from host_devices import assert_printed_ok, run_with_host_devices

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_mesh_shape_takes_the_rest_and_names_bad_sizes():
    assert mesh_shape({"data": -1}, 8) == {"pipeline": 1, "data": 8, "fsdp": 1, "tensor": 1}
    assert mesh_shape({"data": -1, "tensor": 2, "pipeline": 2}, 8) == {"pipeline": 2, "data": 2, "fsdp": 1,
                                                                       "tensor": 2}
    assert mesh_shape({"fsdp": 4, "data": 2}, 8)["fsdp"] == 4
    with pytest.raises(ValueError, match="only one axis may be -1"):
        mesh_shape({"data": -1, "fsdp": -1}, 8)
    assert mesh_shape({"data": 4}, 8)["data"] == 4           # the first 4 devices
    with pytest.raises(ValueError, match="multiply to 16, but there are only 8 devices"):
        mesh_shape({"data": 4, "tensor": 4}, 8)
    with pytest.raises(ValueError, match="do not divide"):
        mesh_shape({"tensor": 3, "data": -1}, 8)
    with pytest.raises(ValueError, match="unknown axis"):
        mesh_shape({"model": 2}, 8)
    with pytest.raises(ValueError, match="mesh.data=0"):
        mesh_shape({"data": 0}, 8)


CHECKS = textwrap.dedent('''
    import functools
    import jax, jax.numpy as jnp, numpy as np
    import flax.linen as nn
    from jasr.config import apply_override, load_config_file
    from jasr.features import FeatureConfig
    from jasr.optim import make_optimizer_from_config
    from jasr.sharding import (DEFAULT_RULES, batch_sharding, check_batch_divisible, logical_specs, make_mesh,
                               state_shardings)
    from jasr.steps import create_train_state
    from jasr.tasks import build_task
    assert len(jax.devices()) == 8

    cfg = load_config_file("configs/fsdd.py")
    for k, v in {"model.d_model": "32", "model.num_layers": "2", "model.num_heads": "4",
                 "model.subsampling_channels": "8", "model.dropout_rate": "0.0", "model.ff_dropout_rate": "0.0",
                 "data.spec_augment": "False"}.items():
        apply_override(cfg, k, v)
    task = build_task(cfg, 17, FeatureConfig(kind="fbank", sample_rate=8000, num_mel_bins=40))
    tx, _ = make_optimizer_from_config(cfg.optim, 100)
    rng = np.random.default_rng(0)
    B, T, N = 8, 64, 6
    batch = {"features": rng.normal(size=(B, T, 40)).astype(np.float32),
             "feature_paddings": np.zeros((B, T), np.float32),
             "labels": rng.integers(1, 17, size=(B, N)).astype(np.int32),
             "label_paddings": np.zeros((B, N), np.float32), "row_weights": np.ones((B,), np.float32)}
    batch["feature_paddings"][3, 41:] = 1.0
    batch["label_paddings"][5, 4:] = 1.0
    init = functools.partial(create_train_state, task=task, tx=tx)
    state = jax.jit(init)(jax.random.PRNGKey(0), batch=batch)
    abstract = jax.eval_shape(init, jax.random.PRNGKey(0), batch=batch)
    specs = logical_specs(abstract.params)

    def loss_and_grads(params, batch):
        f = lambda p: task.loss(p, state.model_state, batch, None, False)[0]
        return jax.value_and_grad(f)(params)

    ref_loss, ref_grads = jax.jit(loss_and_grads)(state.params, batch)
    ref_leaves = jax.tree.leaves(ref_grads)
    for sizes in ({"data": -1}, {"fsdp": -1}, {"data": 2, "fsdp": 2, "tensor": 2}):
        mesh = make_mesh(sizes)
        check_batch_divisible(B, mesh)
        ssh = state_shardings(abstract, specs, mesh, DEFAULT_RULES)
        bsh = jax.tree.map(lambda x: batch_sharding(mesh, np.ndim(x)), batch)
        with jax.set_mesh(mesh), nn.logical_axis_rules(list(DEFAULT_RULES)):
            params = jax.device_put(state.params, ssh.params)
            fn = jax.jit(loss_and_grads, in_shardings=(ssh.params, bsh), out_shardings=(None, ssh.params))
            loss, grads = fn(params, jax.device_put(batch, bsh))
        assert abs(float(loss) - float(ref_loss)) <= 1e-5 * abs(float(ref_loss)), (sizes, loss, ref_loss)
        top = max(float(jnp.max(jnp.abs(r))) for r in ref_leaves)
        for g, r in zip(jax.tree.leaves(grads), ref_leaves):
            # relative 1e-5 per leaf, floored at a tenth of the largest gradient: a leaf whose gradient is zero but
            # for rounding (the key projection's bias, which the softmax ignores) is only float32 noise
            scale = max(float(jnp.max(jnp.abs(r))), 0.1 * top)
            assert float(jnp.max(jnp.abs(g - r))) <= 1e-5 * scale, (sizes, g.shape)
        leaves = jax.tree.leaves(grads)
        sharded = [x for x in leaves if x.addressable_shards[0].data.size < x.size]
        if sizes != {"data": -1}:       # data parallelism replicates the parameters; fsdp and tensor shard them
            assert sharded, sizes
        if mesh.shape["tensor"] == 2:  # a vocabulary of 17 does not split over tensor = 2: kept whole, not an error
            shapes = [np.shape(x) for x in jax.tree.leaves(abstract.params)]
            vocab = [s.spec for s, shape in zip(jax.tree.leaves(ssh.params), shapes) if shape == (17,)]
            assert vocab and all(all(a is None for a in spec) for spec in vocab), vocab
    try:
        check_batch_divisible(6, make_mesh({"data": -1}))
        raise AssertionError("6 rows over 8 devices must fail")
    except ValueError as e:
        assert "multiple of 8" in str(e)
    print("OK")
''')


def test_sharded_step_equals_single_device():
    assert_printed_ok(run_with_host_devices(CHECKS))


TRAIN_CHECKS = textwrap.dedent('''
    import json, os, sys, tempfile
    import numpy as np
    from jasr.config import apply_override, load_config_file
    from jasr.logs import read_jsonl
    from jasr.training import train

    fsdd = os.path.join("..", "shared", "data", "fsdd")
    with open(os.path.join(fsdd, "manifest.jsonl")) as f:
        recs = [json.loads(line) for line in f]
    rows = [{**r, "audio": os.path.abspath(os.path.join(fsdd, r["audio"]))} for r in recs
            if r["id"].endswith(("_george_0", "_george_1"))]                           # 20 utterances
    tmp = tempfile.mkdtemp()
    manifest = os.path.join(tmp, "train.jsonl")
    with open(manifest, "w") as f:
        f.write("".join(json.dumps(r) + chr(10) for r in rows))

    def config(mesh, stop_after=0):
        cfg = load_config_file("configs/fsdd.py")
        for k, v in {"data.train_manifest": manifest, "data.speakers_dev": "()", "data.speed_perturb": "()",
                     "data.gain_db": "()", "data.spec_augment": "False", "data.max_frames": "2400",
                     "data.num_buckets": "1", "data.max_batch_size": "8", "model.d_model": "32",
                     "model.num_layers": "2", "model.scan_layers": "True", "model.num_heads": "2",
                     "model.ff_mult": "2", "model.conv_kernel": "7",
                     "model.subsampling_channels": "8", "model.dropout_rate": "0.0", "model.ff_dropout_rate": "0.0",
                     "optim.warmup_steps": "0", "optim.schedule": "constant", "optim.lr": "1e-3",
                     "train.num_steps": "6", "train.log_every": "1", "train.checkpoint_every": "2",
                     "train.stop_after": str(stop_after), "train.progress": "False", "train.tensorboard": "False",
                     "train.async_checkpoint": "False", **{f"mesh.{a}": str(n) for a, n in mesh.items()}}.items():
            apply_override(cfg, k, v)
        return cfg

    def losses(workdir):
        return {r["step"]: r["loss"] for r in read_jsonl(os.path.join(workdir, "metrics.jsonl"))
                if r["kind"] == "train"}

    one = os.path.join(tmp, "one")
    train(config({"data": 1}), one, root=".")
    ref = losses(one)
    moved = os.path.join(tmp, "moved")
    train(config({"data": -1}, stop_after=2), moved, root=".")              # 8-way data parallel, 2 steps
    train(config({"data": 2, "fsdp": 2, "tensor": 2}, stop_after=2), moved, root=".")   # resumed on another mesh
    train(config({"pipeline": 2, "data": 4}), moved, root=".")              # and pipelined over 2 stages
    got = losses(moved)
    assert sorted(ref) == sorted(got) == [1, 2, 3, 4, 5, 6], (ref, got)
    # batch rows: multiples of data x fsdp, times the microbatches when pipelined (no row padded inside the step)
    from jasr.run_data import batch_row_multiple
    assert [batch_row_multiple(config(m)) for m in ({"data": -1}, {"pipeline": 2, "data": 4},
            {"pipeline": 2, "data": 4, "microbatches": 4}, {"data": 2, "fsdp": 2, "tensor": 2})] == [8, 8, 16, 4]
    for s in ref:
        assert abs(got[s] - ref[s]) <= 1e-4 * abs(ref[s]), (s, got[s], ref[s])

    # decode.py's pipeline: batches split over the 8 devices give the one-device transcripts and scores
    from jasr import transcribe as tr
    from jasr.training import load_run
    run = load_run(one, root=".")
    name, utts, bad = tr.collect_utterances(run.config, ".", manifest=manifest)
    for method in ("greedy", "lexicon"):
        settings = tr.settings_from_config(run.config, {"method": method}, root=".")
        run.config.mesh.data = -1
        _, spread = tr.transcribe(run, utts, settings, bad=bad, progress=False)
        run.config.mesh.data = 1
        _, single = tr.transcribe(run, utts, settings, bad=bad, progress=False)
        assert [r["hyp"] for r in spread] == [r["hyp"] for r in single] and len(single) == len(rows), method
        sa, sb = (np.array([r.get("score", 0.0) for r in res]) for res in (spread, single))
        np.testing.assert_allclose(sa, sb, rtol=1e-5, atol=1e-4, err_msg=method)    # -inf (no lexicon path) too
    print("OK")
''')


def test_training_under_meshes_and_resuming_on_another_mesh():
    """train() on one device, and on 8 (data parallel) stopped after 2 steps, resumed under dp2 x fsdp2 x tp2 for 2
    more and then pipelined (pp2 x dp4, the scanned layers as 2 stages) from the checkpoints the meshes before wrote:
    the same losses step by step; decoding spread over 8 devices gives the one-device transcripts."""
    r = run_with_host_devices(TRAIN_CHECKS, timeout=1200)
    assert_printed_ok(r)
    assert "[train] mesh {'pipeline': 1, 'data': 2, 'fsdp': 2, 'tensor': 2} over 8 of 8 devices" in r.stdout
    assert "[train] mesh {'pipeline': 1, 'data': 8, 'fsdp': 1, 'tensor': 1} over 8 of 8 devices" in r.stdout
    assert "[train] mesh {'pipeline': 2, 'data': 4, 'fsdp': 1, 'tensor': 1} over 8 of 8 devices" in r.stdout
    assert "resumed from" in r.stdout and "at step 2" in r.stdout and "at step 4" in r.stdout
    # per-device memory of the state: replicated under data parallelism, split under fsdp x tensor; the stacked
    # layers split over the pipeline stages
    mib = [float(m) for m in re.findall(r"per device: ([0-9.]+) MiB of parameters", r.stdout)]
    assert len(mib) == 4 and mib[0] == mib[1] > mib[2] > 0 and mib[0] > mib[3] > 0, mib   # 1, dp8, dp2xfsdp2xtp2, pp2


def test_families_that_unbox_their_params_still_name_them():
    """Wav2Vec2 (and Whisper) tasks return plain arrays from init; init_boxed keeps the logical names that the
    mesh shards by, over the same tree."""
    cfg = load_config_file(os.path.join(ROOT, "configs", "wav2vec2_ctc.py"))
    for k, v in dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48,
                     conv_dim=(16, 16), conv_stride=(5, 4), conv_kernel=(10, 4), num_conv_pos_embeddings=8,
                     num_conv_pos_embedding_groups=4).items():
        apply_override(cfg, f"model.{k}", str(v))
    task = build_task(cfg, 40, feature_config(cfg))
    batch = dummy_batch((2, 16000, 8), feature_config(cfg), raw_audio_batches(cfg))
    key = jax.random.PRNGKey(0)
    boxed = jax.eval_shape(task.init_boxed, key, batch)["params"]
    plain = jax.eval_shape(task.init, key, batch)["params"]
    specs = jax.tree.leaves(logical_specs(boxed), is_leaf=lambda x: isinstance(x, PartitionSpec))
    assert len(specs) == len(jax.tree.leaves(plain)) > 10
    assert all(any(specs_i) for specs_i in specs)                    # every parameter has logical names
    assert PartitionSpec("embed", "mlp") in specs                     # e.g. the feed-forward's first kernel
