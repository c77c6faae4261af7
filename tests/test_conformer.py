"""Conformer encoder / ConformerCTC against independent references (transformers' ParakeetEncoder, a torch
ESPnet-style Conv2dSubsampling) and properties (padding invariance, scan == plain stack, remat, bf16)."""
import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch

from models.conformer import (Conv2dSubsampling, ConformerConfig, ConformerCTC, ConformerEncoder,
                              conformer_variables_from_parakeet, rel_shift, stack_layers)

torch.manual_seed(0)
LENGTHS = [41, 34, 27]  # odd and even lengths exercise the length formulas


def random_variables(init, *args, seed=0):
    """Random variables shaped like ``init(key, *args)`` without compiling ``init`` (the tests check numbers that do
    not depend on the initialisers; this keeps the suite fast)."""
    shapes = nn.unbox(jax.eval_shape(init, jax.random.PRNGKey(0), *args))
    rng = np.random.default_rng(seed)

    def fill(path, s):
        name = jax.tree_util.keystr(path)
        if name.endswith("['scale']") or name.endswith("['var']"):
            return jnp.asarray(1.0 + 0.1 * np.abs(rng.standard_normal(s.shape)), s.dtype)
        fan_in = int(np.prod(s.shape[:-1])) if len(s.shape) > 1 else 16
        return jnp.asarray(rng.standard_normal(s.shape) / np.sqrt(fan_in), s.dtype)

    return jax.tree_util.tree_map_with_path(fill, shapes)


def _batch(cfg, lengths=LENGTHS, seed=0):
    rng = np.random.default_rng(seed)
    t = max(lengths)
    x = rng.standard_normal((len(lengths), t, cfg.input_dim)).astype(np.float32)
    pad = (np.arange(t)[None, :] >= np.asarray(lengths)[:, None]).astype(np.float32)
    x = x * (1.0 - pad[..., None])  # zero padded frames (the references do not mask their input)
    return x, pad


# ---------------------------------------------------------------------------------------------------------------
# Reference 1: transformers ParakeetForCTC (FastConformer: dw_striding front end, rel-pos MHSA, batch-norm conv)
# ---------------------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def parakeet():
    from transformers import ParakeetCTCConfig, ParakeetEncoderConfig, ParakeetForCTC

    enc = ParakeetEncoderConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                                conv_kernel_size=7, subsampling_factor=4, subsampling_conv_channels=8, num_mel_bins=20,
                                dropout=0.0, dropout_positions=0.0, layerdrop=0.0, activation_dropout=0.0,
                                attention_dropout=0.0, scale_input=True)
    model = ParakeetForCTC(ParakeetCTCConfig(vocab_size=11, encoder_config=enc.to_dict(), pad_token_id=0)).eval()
    with torch.no_grad():  # non-trivial batch-norm statistics and position biases
        for name, buf in model.named_buffers():
            if "running_mean" in name:
                buf.copy_(torch.randn_like(buf) * 0.3)
            elif "running_var" in name:
                buf.copy_(torch.rand_like(buf) + 0.5)
        for name, p in model.named_parameters():
            if "bias_u" in name or "bias_v" in name or name.endswith("norm.weight") or name.endswith("norm.bias"):
                p.copy_(torch.randn_like(p) * 0.3 + (1.0 if name.endswith("weight") else 0.0))
    cfg = ConformerConfig.tiny(11, d_model=32, num_layers=2, num_heads=4, ff_mult=4, conv_kernel=7,
                               subsampling=4, subsampling_type="dw_striding", subsampling_channels=8,
                               input_dim=20, conv_norm="batch", dropout_rate=0.0, attention_dropout_rate=0.0,
                               ff_dropout_rate=0.0)
    sd = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    return model, cfg, sd


def test_matches_parakeet_ctc(parakeet):
    model, cfg, sd = parakeet
    x, pad = _batch(cfg)
    with torch.no_grad():
        ref = model(torch.from_numpy(x), attention_mask=torch.from_numpy(1 - pad).long()).logits.numpy()
    variables = conformer_variables_from_parakeet(sd, cfg, prefix="encoder.")
    logits, out_pad = jax.jit(lambda v, a, b: ConformerCTC(cfg).apply(v, a, b, False))(variables, x, pad)
    assert logits.dtype == jnp.float32 and logits.shape == ref.shape == (3, cfg.output_length(41), 11)
    out_len = [cfg.output_length(n) for n in LENGTHS]
    np.testing.assert_array_equal(np.asarray(out_pad).sum(1), logits.shape[1] - np.asarray(out_len))
    for b, n in enumerate(out_len):
        np.testing.assert_allclose(np.asarray(logits)[b, :n], ref[b, :n], rtol=2e-4, atol=2e-4)
    # same numbers with the scanned layout
    scfg = cfg.replace(scan_layers=True)
    svars = conformer_variables_from_parakeet(sd, scfg, prefix="encoder.")
    slogits, _ = jax.jit(lambda v: ConformerCTC(scfg).apply(v, x, pad, False))(svars)
    for b, n in enumerate(out_len):
        np.testing.assert_allclose(np.asarray(slogits)[b, :n], ref[b, :n], rtol=2e-4, atol=2e-4)


def test_parakeet_import_is_strict(parakeet):
    _, cfg, sd = parakeet
    from models.hf_io import CheckpointKeyError
    bad = dict(sd)
    del bad["encoder.layers.1.self_attn.bias_u"]
    with pytest.raises(CheckpointKeyError, match="bias_u"):
        conformer_variables_from_parakeet(bad, cfg, prefix="encoder.")
    extra = dict(sd, **{"encoder.layers.2.norm_out.weight": np.zeros(32, np.float32)})
    with pytest.raises(CheckpointKeyError, match="layers.2"):
        conformer_variables_from_parakeet(extra, cfg, prefix="encoder.")


def test_rel_shift_against_gather():
    t = 5
    x = jnp.asarray(np.random.default_rng(0).standard_normal((2, 3, t, 2 * t - 1)), jnp.float32)
    # positions are T-1 .. -(T-1): index p <-> relative position T-1-p; out[i, j] wants relative position i - j
    idx = (t - 1) - (np.arange(t)[:, None] - np.arange(t)[None, :])
    np.testing.assert_array_equal(np.asarray(rel_shift(x)), np.take_along_axis(np.asarray(x), idx[None, None], -1))


# ---------------------------------------------------------------------------------------------------------------
# Reference 2: ESPnet / WeNet Conv2dSubsampling{4,6,8} written directly in torch
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("factor", [4, 6, 8])
def test_conv2d_subsampling_matches_torch(factor):
    cfg = ConformerConfig.tiny(0, input_dim=40, subsampling=factor)
    c, d = cfg.channels, cfg.d_model
    stages = {4: [(3, 2)] * 2, 6: [(3, 2), (5, 3)], 8: [(3, 2)] * 3}[factor]
    convs = [torch.nn.Conv2d(1 if i == 0 else c, c, k, s) for i, (k, s) in enumerate(stages)]
    f = cfg.input_dim
    for k, s in stages:
        f = (f - k) // s + 1
    linear = torch.nn.Linear(c * f, d)
    x, pad = _batch(cfg, [60, 45])
    with torch.no_grad():
        h = torch.from_numpy(x)[:, None]
        for conv in convs:
            h = torch.relu(conv(h))
        b, _, t, _ = h.shape
        ref = linear(h.transpose(1, 2).reshape(b, t, -1)).numpy()
    params = {f"conv_{i}": {"kernel": conv.weight.detach().numpy().transpose(2, 3, 1, 0),
                            "bias": conv.bias.detach().numpy()} for i, conv in enumerate(convs)}
    params["out"] = {"kernel": linear.weight.detach().numpy().T, "bias": linear.bias.detach().numpy()}
    out, out_pad = Conv2dSubsampling(cfg).apply({"params": params}, x, pad)
    assert out.shape == ref.shape and out.shape[1] == cfg.output_length(60)
    for i, n in enumerate([60, 45]):
        m = cfg.output_length(n)
        assert np.asarray(out_pad)[i].sum() == out.shape[1] - m
        np.testing.assert_allclose(np.asarray(out)[i, :m], ref[i, :m], rtol=1e-4, atol=1e-5)
    if factor == 4:  # documented formula
        assert all(cfg.output_length(n) == ((n - 1) // 2 - 1) // 2 for n in range(7, 200))


# ---------------------------------------------------------------------------------------------------------------
# Properties of the default model (conv2d front end, layer-norm conv module)
# ---------------------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny():
    cfg = ConformerConfig.tiny(7, dropout_rate=0.1, attention_dropout_rate=0.1)
    x, pad = _batch(cfg)
    variables = random_variables(ConformerCTC(cfg).init, x, pad, seed=1)
    return cfg, variables, x, pad


def test_padding_invariance(tiny):
    cfg, variables, x, pad = tiny
    fwd = jax.jit(lambda a, b: ConformerCTC(cfg).apply(variables, a, b, False))
    x = x.copy()
    x[pad > 0] = 1e3  # garbage in padded frames must not leak into valid ones
    logits, out_pad = fwd(x, pad)
    for b, n in list(enumerate(LENGTHS))[1:]:  # the padded rows
        alone, alone_pad = fwd(x[b:b + 1, :n], pad[b:b + 1, :n])
        m = cfg.output_length(n)
        assert alone.shape[1] == m and not np.asarray(alone_pad).any()
        np.testing.assert_allclose(np.asarray(logits)[b, :m], np.asarray(alone)[0], rtol=1e-4, atol=1e-4)
        assert np.asarray(out_pad)[b, m:].all() and not np.asarray(out_pad)[b, :m].any()


def test_scan_and_remat_match_plain_stack(tiny):
    cfg, variables, x, pad = tiny
    params = nn.unbox(variables)["params"]
    enc = dict(params["encoder"])
    stacked = {**{k: v for k, v in enc.items() if not k.startswith("layers_")},
               "layers": stack_layers([enc[f"layers_{i}"] for i in range(cfg.num_layers)])}
    sparams = {**params, "encoder": stacked}
    scfg = cfg.replace(scan_layers=True, remat=True)

    def loss(model, p):
        logits, _ = model.apply({"params": p}, x, pad, False)
        w = jnp.asarray(np.random.default_rng(3).standard_normal(logits.shape), jnp.float32)
        return jnp.sum(jax.nn.log_softmax(logits) * w)

    l0, g0 = jax.jit(jax.value_and_grad(lambda p: loss(ConformerCTC(cfg), p)))(params)
    l1, g1 = jax.jit(jax.value_and_grad(lambda p: loss(ConformerCTC(scfg), p)))(sparams)
    np.testing.assert_allclose(l0, l1, rtol=1e-5)
    g0s = stack_layers([g0["encoder"][f"layers_{i}"] for i in range(cfg.num_layers)])
    for a, b in zip(jax.tree_util.tree_leaves(g0s), jax.tree_util.tree_leaves(g1["encoder"]["layers"])):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-3, atol=2e-4)
    # remat alone (plain layout): same forward numbers
    l2 = jax.jit(lambda p: loss(ConformerCTC(cfg.replace(remat=True)), p))(params)
    np.testing.assert_allclose(l0, l2, rtol=1e-5)


def test_logical_axis_names(tiny):
    cfg, variables, x, pad = tiny
    specs = nn.get_partition_spec(jax.eval_shape(ConformerCTC(cfg).init, jax.random.PRNGKey(0), x, pad))["params"]
    leaves = jax.tree_util.tree_leaves(specs, is_leaf=lambda s: isinstance(s, jax.sharding.PartitionSpec))
    assert leaves and all(isinstance(s, jax.sharding.PartitionSpec) for s in leaves)
    assert specs["ctc_head"]["kernel"] == jax.sharding.PartitionSpec("embed", "vocab")
    assert specs["encoder"]["layers_0"]["self_attn"]["q_proj"]["kernel"] == \
        jax.sharding.PartitionSpec("embed", "heads", "kv")
    svars = jax.eval_shape(ConformerCTC(cfg.replace(scan_layers=True)).init, jax.random.PRNGKey(0), x, pad)
    sspec = nn.get_partition_spec(svars)["params"]["encoder"]["layers"]["ff1"]["linear1"]["kernel"]
    assert sspec == jax.sharding.PartitionSpec("layers", "embed", "mlp")


def test_train_mode_dropout_and_ctc_gradient(tiny):
    cfg, variables, x, pad = tiny
    model = ConformerCTC(cfg)
    labels = jnp.array([[1, 2, 3], [4, 5, 0], [6, 0, 0]])
    label_pad = (labels == 0).astype(jnp.float32)

    @jax.jit
    def loss_and_grad(p, key):
        def loss(q):
            logits, lp = model.apply({"params": q}, x, pad, True, rngs={"dropout": key})
            return optax.ctc_loss(logits, lp, labels, label_pad, blank_id=0).mean(), logits
        return jax.value_and_grad(loss, has_aux=True)(p)

    params = nn.unbox(variables)["params"]
    (l, a), g = loss_and_grad(params, jax.random.PRNGKey(0))
    (_, b), _ = loss_and_grad(params, jax.random.PRNGKey(1))
    assert not np.allclose(a, b)  # dropout is on in train mode, and keyed
    assert np.isfinite(l) and all(np.isfinite(np.asarray(v)).all() for v in jax.tree_util.tree_leaves(g))
    assert all(np.abs(np.asarray(v)).max() > 0 for v in jax.tree_util.tree_leaves(g))


def test_batch_norm_train_mode_ignores_padding(parakeet):
    """Masked batch statistics: garbage in padded frames changes neither the outputs on valid frames nor the
    updated running statistics."""
    _, cfg, sd = parakeet
    x, pad = _batch(cfg)
    model = ConformerCTC(cfg)
    variables = conformer_variables_from_parakeet(sd, cfg, prefix="encoder.")
    x2 = x.copy()
    x2[pad > 0] = 50.0
    fwd = jax.jit(lambda a: model.apply(variables, a, pad, True, mutable=["batch_stats"]))
    (l1, _), s1 = fwd(x)
    (l2, _), s2 = fwd(x2)
    for a, b in zip(jax.tree_util.tree_leaves(s1), jax.tree_util.tree_leaves(s2)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
    assert not np.allclose(np.asarray(jax.tree_util.tree_leaves(s1)[0]),
                           np.asarray(jax.tree_util.tree_leaves(variables["batch_stats"])[0]))
    for b, n in enumerate(LENGTHS):
        m = cfg.output_length(n)
        np.testing.assert_allclose(np.asarray(l1)[b, :m], np.asarray(l2)[b, :m], rtol=1e-4, atol=1e-4)


def test_bfloat16_close_to_float32(tiny):
    cfg, variables, x, pad = tiny
    ref, _ = jax.jit(lambda: ConformerCTC(cfg).apply(variables, x, pad, False))()
    bcfg = cfg.replace(dtype="bfloat16", param_dtype="bfloat16")
    bparams = jax.tree_util.tree_map(lambda a: a.astype(jnp.bfloat16), nn.unbox(variables))
    out, _ = jax.jit(lambda: ConformerCTC(bcfg).apply(bparams, x, pad, False))()
    assert out.dtype == jnp.float32
    for b, n in enumerate(LENGTHS):
        m = cfg.output_length(n)
        err = np.abs(np.asarray(out)[b, :m] - np.asarray(ref)[b, :m]).max()
        assert err < 0.1 * (np.abs(np.asarray(ref)[b, :m]).max() + 1), err


def test_bad_inputs_are_named(tiny):
    cfg, variables, x, pad = tiny
    model = ConformerCTC(cfg)
    with pytest.raises(ValueError, match="input_dim"):
        model.apply(variables, x[..., :-1], pad, False)
    with pytest.raises(ValueError, match="paddings"):
        model.apply(variables, x, pad[:, :-1], False)
    with pytest.raises(ValueError, match="frames"):
        model.apply(variables, x[:, :5], pad[:, :5], False)
    with pytest.raises(ValueError, match="conv_kernel"):
        ConformerConfig.tiny(5, conv_kernel=8)
    with pytest.raises(ValueError, match="d_model"):
        ConformerConfig.tiny(5, d_model=30, num_heads=4)
    with pytest.raises(ValueError, match="subsampling"):
        ConformerConfig.tiny(5, subsampling=5)
    with pytest.raises(ValueError, match="dtype"):
        ConformerConfig.tiny(5, dtype="int8")


def test_presets_and_encoder_shapes():
    demo = ConformerConfig.demo(12)
    assert (demo.d_model, demo.num_layers, demo.num_heads, demo.conv_kernel, demo.subsampling) == (144, 4, 4, 15, 4)
    assert dataclasses.is_dataclass(demo) and hash(demo) == hash(ConformerConfig.demo(12))
    small = ConformerConfig.small(100, input_dim=80)
    shapes = jax.eval_shape(lambda: ConformerCTC(small).init(jax.random.PRNGKey(0), jnp.zeros((1, 64, 80)),
                                                              jnp.zeros((1, 64))))
    n = sum(np.prod(s.shape) for s in jax.tree_util.tree_leaves(nn.unbox(shapes)))
    assert 8e6 < n < 13e6, n  # Conformer (S) is ~10M parameters
    x, pad = _batch(demo, [50, 20])
    out, out_pad = jax.eval_shape(lambda: ConformerEncoder(demo).init_with_output(
        jax.random.PRNGKey(0), x, pad)[0])
    assert out.shape == (2, demo.output_length(50), 144) and out_pad.shape == (2, demo.output_length(50))
