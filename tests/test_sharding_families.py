"""Every model family's loss and gradients under data (dp=8), fully sharded data (fsdp=8) and tensor x data
(tp=2 x dp=4) parallelism over 8 host CPU devices equal the single-device ones (relative 1e-5, float32): tiny
Conformer-CTC, Conformer-AED (joint CTC/attention), Wav2Vec2 CTC, Wav2Vec2 pretraining and Whisper (random weights,
the real multilingual tokenizer's vocabulary), each with its family's logical-axis rules.

The 8 devices exist only in a fresh interpreter (``XLA_FLAGS=--xla_force_host_platform_device_count=8`` before JAX
starts), so one subprocess runs every case (one program per family and mesh) and prints a JSON line per case; the
parametrized tests below read them. Pipeline meshes are tested in tests/test_pipeline.py.
"""
import json
import textwrap

import pytest
from host_devices import run_with_host_devices

FAMILIES = ("conformer_ctc", "conformer_aed", "wav2vec2_ctc", "wav2vec2_pretrain", "whisper")
MESHES = {"dp8": {"data": 8}, "fsdp8": {"fsdp": 8}, "tp2_dp4": {"tensor": 2, "data": 4}}

CHECKS = textwrap.dedent('''
    import json, sys, time
    import flax.linen as nn
    import jax, numpy as np
    from jasr.config import apply_override, load_config_file
    from jasr.run_data import dummy_batch, feature_config, raw_audio_batches
    from jasr.sharding import DEFAULT_RULES, batch_sharding, logical_specs, make_mesh, mesh_context, state_shardings
    from jasr.tasks import build_task
    from jasr.tokenizers import load_tokenizer
    assert len(jax.devices()) == 8
    MESHES = json.loads(sys.argv[1])
    B = 8
    W2V = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=48, conv_dim=(16, 16),
               conv_stride=(5, 4), conv_kernel=(10, 4), num_conv_pos_embeddings=8, num_conv_pos_embedding_groups=4,
               codevector_dim=16, proj_codevector_dim=12, num_codevectors_per_group=5, num_codevector_groups=2,
               num_negatives=4, mask_time_prob=0.4, mask_time_length=2, hidden_dropout=0.0, activation_dropout=0.0,
               attention_dropout=0.0, feat_proj_dropout=0.0, final_dropout=0.0, layerdrop=0.0)
    # family -> (config file, model fields, other overrides, vocabulary (None: the tokenizer's), (T or samples, N))
    CASES = {
        "conformer_ctc": ("fsdd", dict(d_model=32, num_layers=1, num_heads=4, subsampling_channels=8, dropout_rate=0.0,
                                       ff_dropout_rate=0.0), {"data.device_features": "False"}, 17, (64, 6)),
        "conformer_aed": ("conformer_aed", dict(encoder=dict(d_model=32, num_layers=1, num_heads=4, ff_mult=2,
                                                             conv_kernel=7, subsampling=4, subsampling_channels=8,
                                                             dropout_rate=0.0, attention_dropout_rate=0.0,
                                                             ff_dropout_rate=0.0),
                                                decoder=dict(type="transformer", num_layers=1, num_heads=4, ff_dim=64,
                                                             dropout_rate=0.0)),
                          {"data.device_features": "False"}, 17, (64, 6)),
        "wav2vec2_ctc": ("wav2vec2_ctc", W2V, {}, 17, (1600, 6)),   # 80 frames
        "wav2vec2_pretrain": ("wav2vec2_pretrain", W2V, {}, 2, (1600, 1)),
        "whisper": ("whisper_finetune", dict(d_model=32, encoder_layers=1, encoder_attention_heads=4,
                                             encoder_ffn_dim=64, decoder_layers=1, decoder_attention_heads=4,
                                             decoder_ffn_dim=64, max_source_positions=16, max_target_positions=32),
                    {"data.tokenizer": "whisper:multilingual"}, None, (32, 6)),
    }

    def setup(name):
        cfg_name, fields, over, vocab, (t, n) = CASES[name]
        cfg = load_config_file(f"configs/{cfg_name}.py")
        with cfg.model.unlocked():
            for k, v in fields.items():
                cfg.model[k] = v
        for k, v in {"data.spec_augment": "False", **over}.items():
            apply_override(cfg, k, v)
        tok = load_tokenizer(cfg.data.tokenizer) if vocab is None else None
        vocab = tok.vocab_size if tok is not None else vocab
        fc = feature_config(cfg)
        task = build_task(cfg, vocab, fc, tokenizer=tok)
        rng = np.random.default_rng(0)
        batch = dummy_batch((B, t, n), fc, raw_audio_batches(cfg))
        x = "audio" if "audio" in batch else "features"
        batch[x] = rng.normal(size=batch[x].shape).astype(np.float32)
        batch[x[:-1] + "_paddings" if x == "features" else "audio_paddings"][3, 3 * t // 4:] = 1.0   # a shorter row
        batch["labels"] = rng.integers(1, vocab, size=(B, n)).astype(np.int32)
        batch["label_paddings"][5, n - 2:] = 1.0                                          # and a shorter label
        if name == "wav2vec2_pretrain":
            batch["labels"][:] = 1
        return task, batch

    for name in json.loads(sys.argv[2]):
        t0 = time.time()
        task, batch = setup(name)
        key = jax.random.PRNGKey(0)
        # random values of the initialiser's shapes, drawn on the host (no init program to compile): the check
        # compares two programs on the same parameters, whatever their distribution
        boxed = jax.eval_shape(task.init_boxed, key, batch)
        specs = logical_specs(boxed["params"])
        rng = np.random.default_rng(1)
        variables = jax.tree.map(lambda x: (0.2 * rng.standard_normal(x.shape)).astype(x.dtype), nn.unbox(boxed))
        params = variables.pop("params")
        rules = getattr(task, "logical_axis_rules", DEFAULT_RULES)

        def loss_and_grads(params, batch):
            return jax.value_and_grad(lambda p: task.loss(p, variables, batch, None, False)[0])(params)

        ref_loss, ref_grads = jax.device_get(jax.jit(loss_and_grads)(params, batch))
        ref_leaves = jax.tree.leaves(ref_grads)
        top = max(float(np.max(np.abs(r))) for r in ref_leaves)
        for mesh_name, sizes in MESHES.items():
            rec = {"family": name, "mesh": mesh_name}
            try:
                mesh = make_mesh(sizes)
                psh = state_shardings(params, specs, mesh, rules)
                bsh = jax.tree.map(lambda x: batch_sharding(mesh, np.ndim(x)), batch)
                with mesh_context(mesh, rules):
                    fn = jax.jit(loss_and_grads, in_shardings=(psh, bsh), out_shardings=(None, psh))
                    loss, grads = fn(jax.device_put(params, psh), jax.device_put(batch, bsh))
                rec["sharded_leaves"] = sum(x.addressable_shards[0].data.size < x.size for x in jax.tree.leaves(grads))
                loss, grads = jax.device_get((loss, grads))
                rec["loss_rel"] = abs(float(loss) - float(ref_loss)) / abs(float(ref_loss))
                # per leaf: max |difference| relative to the leaf's largest gradient, floored at a tenth of the
                # largest gradient of all (a leaf whose gradient is zero but for rounding is float32 noise)
                worst = (0.0, "")
                for (path, g), r in zip(jax.tree_util.tree_flatten_with_path(grads)[0], ref_leaves):
                    err = float(np.max(np.abs(g - r))) / max(float(np.max(np.abs(r))), 0.1 * top)
                    worst = max(worst, (err, jax.tree_util.keystr(path)))
                rec["grad_rel"], rec["worst_leaf"] = worst
            except Exception as e:     # reported per case; the other cases still run
                rec["error"] = f"{type(e).__name__}: {str(e)[:800]}"
            print(json.dumps(rec), flush=True)
        print(json.dumps({"family": name, "seconds": round(time.time() - t0, 1),
                          "loss": float(ref_loss)}), flush=True)
''')


@pytest.fixture(scope="module")
def results():
    r = run_with_host_devices(CHECKS, json.dumps(MESHES), json.dumps(FAMILIES))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-6000:]
    recs = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    return {(x["family"], x["mesh"]): x for x in recs if "mesh" in x}, {x["family"]: x for x in recs if "mesh" not in x}


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("mesh", MESHES)
def test_sharded_loss_and_gradients_equal_single_device(results, family, mesh):
    cases, totals = results
    rec = cases[(family, mesh)]
    assert "error" not in rec, rec["error"]
    assert rec["loss_rel"] <= 1e-5, rec
    assert rec["grad_rel"] <= 1e-5, rec
    if mesh != "dp8":     # fsdp and tensor parallelism shard parameters (data parallelism replicates them)
        assert rec["sharded_leaves"] > 0, rec
