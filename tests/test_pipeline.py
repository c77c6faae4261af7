"""Pipeline parallelism over the layer stacks (models.layer_stack) and remat policies: for every family, one loss and
gradient under pp=2 x dp=4 and dp=2 x tp=2 x pp=2 on 8 host CPU devices equal the single-device unpipelined model's
(relative 1e-5, float32), with a remat policy on one of the two meshes; bad pipeline configs are named errors.

The 8 devices exist only in a fresh interpreter started with ``XLA_FLAGS=--xla_force_host_platform_device_count=8``,
so the sharded checks run in one subprocess (as in test_sharding.py)."""
import os
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jasr.config import ConfigError, apply_override, load_config_file, validate_config
from models.layer_stack import StackOptions, checkpoint_policy, pipeline_layers
from host_devices import assert_printed_ok, run_with_host_devices

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_pipeline_schedule_equals_a_plain_loop_of_layers():
    """pipeline_layers against a hand-written loop over layers, rows cut into microbatches (with padding rows when
    the batch does not divide), per-row inputs following their rows."""
    rng = np.random.default_rng(0)
    w = jnp.asarray(rng.normal(size=(6, 5, 5)) / 3, jnp.float32)         # 6 layers of [5, 5]
    x = jnp.asarray(rng.normal(size=(7, 5)), jnp.float32)
    scale = jnp.asarray(rng.uniform(0.5, 1.5, size=(7,)), jnp.float32)    # a per-row input

    def layer(p, h, rows, key):
        return jnp.tanh(h @ p) * rows[0][:, None]

    def loop(w, x):
        for i in range(6):
            x = layer(w[i], x, (scale,), None)
        return x

    ref = loop(w, x)
    for stages, mb in ((2, 2), (3, 4), (6, 1)):
        got = pipeline_layers(layer, w, x, (scale,), stages=stages, microbatches=mb)
        np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-6, err_msg=str((stages, mb)))
    g_ref = jax.grad(lambda w: jnp.sum(loop(w, x) ** 2))(w)
    g = jax.grad(lambda w: jnp.sum(pipeline_layers(layer, w, x, (scale,), stages=3, microbatches=2) ** 2))(w)
    np.testing.assert_allclose(g, g_ref, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="6 layers do not split over 4 stages"):
        pipeline_layers(layer, w, x, (scale,), stages=4, microbatches=2)


def test_stack_options_and_policies():
    assert checkpoint_policy("full") is None and checkpoint_policy("dots_saveable") is not None
    assert StackOptions(stages=2).num_microbatches == 2 and StackOptions(stages=2, microbatches=6).num_microbatches == 6
    assert StackOptions().policy(True) == "full" and StackOptions(remat_policy="dots_saveable").policy(False) \
        == "dots_saveable"
    with pytest.raises(ValueError, match="remat_policy must be one of"):
        StackOptions(remat_policy="some")
    with pytest.raises(ValueError, match="needs scan_layers=True"):
        StackOptions(stages=2).check(4, False)
    with pytest.raises(ValueError, match="3 layers do not split evenly over 2"):
        StackOptions(stages=2).check(3, True)


def put(cfg, key, value):
    """apply_override, or for a key inside model.encoder / model.decoder (dicts of fields) the value itself."""
    parts = key.split(".")
    if len(parts) == 2:
        return apply_override(cfg, key, str(value))
    section = cfg[parts[0]][parts[1]]
    with section.unlocked(), section.ignore_type():
        section[parts[2]] = value


def _cfg(name, **kw):
    cfg = load_config_file(os.path.join(ROOT, "configs", f"{name}.py"))
    for k, v in kw.items():
        put(cfg, k, v)
    return cfg


@pytest.mark.parametrize("name,overrides,match", [
    ("demo", {"mesh.pipeline": 2}, r"pipelining needs scanned layers \(set 'model.scan_layers'=True"),
    ("demo", {"mesh.pipeline": 2, "model.scan_layers": True, "model.num_layers": 3},
     r"'model.num_layers'=3: the layers do not split evenly over mesh.pipeline=2"),
    ("demo", {"mesh.pipeline": 2, "model.scan_layers": True, "model.conv_norm": "batch"},
     r"'model.conv_norm'='batch': a pipelined stack cannot carry batch-norm statistics"),
    ("demo", {"mesh.microbatches": 4}, r"'mesh.microbatches'=4 needs mesh.pipeline > 1"),
    ("demo", {"model.remat_policy": "most"}, r"'model.remat_policy' must be one of"),
    ("conformer_aed", {"mesh.pipeline": 2, "model.encoder.scan_layers": True, "model.decoder.scan_layers": True,
                       "model.decoder.num_layers": 3}, r"'model.decoder.num_layers'=3: the layers do not split"),
    ("conformer_aed", {"mesh.pipeline": 2, "model.encoder.scan_layers": True},
     r"set 'model.decoder.scan_layers'=True"),
    ("wav2vec2_pretrain", {"mesh.pipeline": 4, "model.scan_layers": True, "model.num_hidden_layers": 6},
     r"'model.num_hidden_layers'=6: the layers do not split evenly over mesh.pipeline=4"),
])
def test_bad_pipeline_configs_are_named(name, overrides, match):
    cfg = _cfg(name, **overrides)
    with pytest.raises(ConfigError, match=match):
        validate_config(cfg, check_paths=False)


def test_lstm_decoder_cannot_pipeline_and_good_configs_validate():
    cfg = _cfg("conformer_aed", **{"mesh.pipeline": 2, "model.encoder.scan_layers": True})
    cfg.model.decoder = {"type": "lstm", "num_layers": 2}
    with pytest.raises(ConfigError, match=r"'model.decoder.type'='lstm': the LSTM decoder cannot pipeline"):
        validate_config(cfg, check_paths=False)
    validate_config(_cfg("demo", **{"mesh.pipeline": 2, "mesh.microbatches": 4, "model.scan_layers": True,
                                    "model.remat_policy": "dots_saveable"}), check_paths=False)


CHECKS = textwrap.dedent('''
    import jax, jax.numpy as jnp, numpy as np
    import flax.linen as nn
    from jasr.config import load_config_file
    from jasr.run_data import feature_config
    from tests.test_pipeline import put
    from jasr.sharding import DEFAULT_RULES, batch_sharding, logical_specs, make_mesh, state_shardings
    from jasr.tasks import build_task
    from models.layer_stack import StackOptions
    from models.whisper import WhisperConfig, WhisperModel
    assert len(jax.devices()) == 8
    rng = np.random.default_rng(0)
    B = 8
    MESHES = ({"pipeline": 2, "data": 4}, {"data": 2, "tensor": 2, "pipeline": 2})

    def config(name, overrides, mesh):
        cfg = load_config_file(f"configs/{name}.py")
        for k, v in {**overrides, **{f"mesh.{a}": n for a, n in mesh.items()}}.items():
            put(cfg, k, v)
        return cfg

    def compare(what, ref, got):
        (ref_loss, ref_grads), (loss, grads) = ref, got
        assert abs(float(loss) - float(ref_loss)) <= 1e-5 * abs(float(ref_loss)), (what, loss, ref_loss)
        ref_leaves, leaves = jax.tree.leaves(ref_grads), jax.tree.leaves(grads)
        assert len(ref_leaves) == len(leaves) > 5, what
        top = max(float(jnp.max(jnp.abs(r))) for r in ref_leaves)
        for g, r in zip(leaves, ref_leaves):
            # relative 1e-5 per leaf, floored at a tenth of the largest gradient (as test_sharding.py)
            scale = max(float(jnp.max(jnp.abs(r))), 0.1 * top)
            assert float(jnp.max(jnp.abs(g - r))) <= 1e-5 * scale, (what, g.shape)

    def sharded_loss_and_grads(loss_fn, boxed_params, params, batch, mesh_sizes):
        mesh = make_mesh(mesh_sizes)
        specs = logical_specs(boxed_params)
        psh = state_shardings(params, specs, mesh, DEFAULT_RULES)
        bsh = jax.tree.map(lambda x: batch_sharding(mesh, np.ndim(x)), batch)
        with jax.set_mesh(mesh), nn.logical_axis_rules(list(DEFAULT_RULES)):
            fn = jax.jit(jax.value_and_grad(loss_fn), in_shardings=(psh, bsh), out_shardings=(None, psh))
            out = fn(jax.device_put(params, psh), jax.device_put(batch, bsh))
        stacked = [s for s, x in zip(jax.tree.leaves(psh), jax.tree.leaves(params))
                   if len(s.spec) and s.spec[0] == "pipeline"]
        assert stacked, mesh_sizes          # the stacked layer parameters lie on the pipeline axis
        return out

    def check_task(name, overrides, vocab, batch, policies):
        ref_task = build_task(config(name, overrides, {"data": 1}), vocab, feature_config(config(name, overrides, {})))
        variables = jax.jit(ref_task.init)(jax.random.PRNGKey(0), batch)
        params = variables.pop("params")
        params = nn.unbox(params)
        def loss_of(task):
            def f(p, b):
                total, (weight, _, _) = task.loss(p, variables, b, None, False)
                return total / weight
            return f
        ref = jax.jit(jax.value_and_grad(loss_of(ref_task)))(params, batch)
        boxed = jax.eval_shape(ref_task.init_boxed, jax.random.PRNGKey(0), batch)["params"]   # same tree pipelined
        for mesh, policy in zip(MESHES, policies):
            cfg = config(name, {**overrides, "model.remat_policy": policy}, mesh)
            task = build_task(cfg, vocab, feature_config(cfg))
            assert task.model.stack.stages == 2, task.model.stack
            compare((name, mesh, policy), ref, sharded_loss_and_grads(loss_of(task), boxed, params, batch, mesh))
        print(name, "ok", flush=True)

    def fbank_batch(F, T=48, N=5, vocab=12):
        b = {"features": rng.normal(size=(B, T, F)).astype(np.float32),
             "feature_paddings": np.zeros((B, T), np.float32),
             "labels": rng.integers(1, vocab, size=(B, N)).astype(np.int32),
             "label_paddings": np.zeros((B, N), np.float32), "row_weights": np.ones((B,), np.float32)}
        b["feature_paddings"][3, 30:] = 1.0
        b["label_paddings"][5, 3:] = 1.0
        return b

    def audio_batch(S=1600, N=4, vocab=12):
        b = {"audio": rng.normal(size=(B, S)).astype(np.float32), "audio_paddings": np.zeros((B, S), np.float32),
             "labels": rng.integers(1, vocab, size=(B, N)).astype(np.int32),
             "label_paddings": np.zeros((B, N), np.float32), "row_weights": np.ones((B,), np.float32)}
        b["audio_paddings"][2, 1200:] = 1.0
        return b

    conf = {"model.d_model": 16, "model.num_layers": 2, "model.num_heads": 2, "model.ff_mult": 2,
            "model.conv_kernel": 5, "model.subsampling_channels": 4, "model.dropout_rate": 0.0,
            "model.ff_dropout_rate": 0.0, "model.attention_dropout_rate": 0.0, "model.scan_layers": True,
            "data.spec_augment": False}
    nmel = load_config_file("configs/fsdd.py").data.num_mel_bins
    check_task("fsdd", conf, 12, fbank_batch(nmel), ("none", "dots_saveable"))

    enc = {"d_model": 16, "num_layers": 2, "num_heads": 2, "ff_mult": 2, "conv_kernel": 5, "subsampling_channels": 4,
           "dropout_rate": 0.0, "ff_dropout_rate": 0.0, "attention_dropout_rate": 0.0, "scan_layers": True}
    dec = {"num_layers": 2, "num_heads": 2, "ff_dim": 32, "dropout_rate": 0.0, "scan_layers": True}
    aed = {**{f"model.encoder.{k}": v for k, v in enc.items()}, **{f"model.decoder.{k}": v for k, v in dec.items()},
           "data.spec_augment": False, "loss.label_smoothing": 0.0, "mesh.microbatches": 3}   # 8 rows -> 3 x 4
    nmel = load_config_file("configs/conformer_aed.py").data.num_mel_bins
    check_task("conformer_aed", aed, 12, fbank_batch(nmel), ("none", "full"))

    w2v = dict(hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=24, conv_dim=(8, 8),
               conv_stride=(5, 4), conv_kernel=(10, 4), num_conv_pos_embeddings=8, num_conv_pos_embedding_groups=2,
               hidden_dropout=0.0, activation_dropout=0.0, attention_dropout=0.0, feat_proj_dropout=0.0,
               final_dropout=0.0, layerdrop=0.0, scan_layers=True, do_stable_layer_norm=True,
               feat_extract_norm="layer")
    check_task("wav2vec2_ctc", {f"model.{k}": v for k, v in w2v.items()}, 12, audio_batch(),
               ("everything_saveable", "none"))
    pre = dict(w2v, codevector_dim=8, proj_codevector_dim=8, num_codevectors_per_group=5, num_codevector_groups=2,
               num_negatives=4, mask_time_prob=0.3, mask_time_length=2, mask_time_min_masks=1, layerdrop=0.0,
               do_stable_layer_norm=False, feat_extract_norm="group")
    check_task("wav2vec2_pretrain", {f"model.{k}": v for k, v in pre.items()}, 12, audio_batch(),
               ("none", "dots_with_no_batch_dims_saveable"))

    # Whisper: the model itself (its task needs a Whisper tokenizer), teacher-forced cross-entropy
    wc = WhisperConfig(vocab_size=40, num_mel_bins=8, d_model=16, encoder_layers=2, encoder_attention_heads=2,
                       encoder_ffn_dim=24, decoder_layers=2, decoder_attention_heads=2, decoder_ffn_dim=24,
                       max_source_positions=8, max_target_positions=12, pad_token_id=0, bos_token_id=1,
                       eos_token_id=2, decoder_start_token_id=1)
    feats = rng.normal(size=(B, 8, 16)).astype(np.float32)
    ids = rng.integers(0, 40, size=(B, 7)).astype(np.int32)
    wbatch = {"feats": feats, "ids": ids}
    base = WhisperModel(wc, scan_layers=True)
    boxed = base.init(jax.random.PRNGKey(0), feats, ids)["params"]
    params = nn.unbox(boxed)
    def whisper_loss(model):
        def f(p, b):
            logits = model.apply({"params": p}, b["feats"], b["ids"][:, :-1])
            logp = jax.nn.log_softmax(logits, axis=-1)
            return -jnp.mean(jnp.take_along_axis(logp, b["ids"][:, 1:, None], axis=-1))
        return f
    ref = jax.jit(jax.value_and_grad(whisper_loss(base)))(params, wbatch)
    for mesh, policy in zip(MESHES, ("full", "none")):
        model = WhisperModel(wc, scan_layers=True, stack=StackOptions(policy, 2, 0))
        compare(("whisper", mesh), ref, sharded_loss_and_grads(whisper_loss(model), boxed, params, wbatch, mesh))
    print("whisper ok")
    print("OK")
''')


def test_pipelined_families_equal_the_unpipelined_model():
    # 20 programs to compile: XLA's cheapest CPU code generation (the numbers are the same up to rounding)
    assert_printed_ok(run_with_host_devices(
        CHECKS, xla_flags="--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"))
