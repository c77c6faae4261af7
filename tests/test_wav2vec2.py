"""Wav2Vec2 (models.wav2vec2*, jasr's Flax port) against transformers' PyTorch classes on tiny random configs:
forward on padded batches (both variants), CTC loss and its gradient, pretraining loss (eval and, with shared Gumbel
noise, train mode, incl. gradients), SpecAugment application; properties of the JAX mask/negative samplers;
checkpoint import/export (strict keys, old weight-norm names, pytorch_model.bin, transformers loading the export,
orbax); scan/remat/bf16 options."""
import json
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from safetensors.numpy import load_file
from transformers import Wav2Vec2Config as HFConfig
from transformers import Wav2Vec2ForCTC as HFForCTC
from transformers import Wav2Vec2ForPreTraining as HFForPreTraining
from transformers.models.wav2vec2 import modeling_wav2vec2 as hf_mod

import models.wav2vec2_pretrain as w2v_pt
from jasr.losses import wav2vec2_ctc_loss
from models.hf_io import CheckpointKeyError
from models.wav2vec2 import (Wav2Vec2Config, Wav2Vec2ForCTC, Wav2Vec2Model, compute_mask_indices,
                             feat_extract_output_lengths)
from models.wav2vec2_hf import (from_pretrained, load_native, params_from_hf_state_dict, params_to_hf_state_dict,
                                save_native, save_pretrained)
from models.wav2vec2_pretrain import pretraining_loss, sample_negative_indices

LENGTHS = [1600, 1234, 777]  # samples; -> 79, 61, 37 frames with the tiny conv stack below
NUM_SAMPLES = 1600
TINY = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
            conv_dim=(16, 24, 16), conv_stride=(5, 2, 2), conv_kernel=(10, 3, 3), num_conv_pos_embeddings=8,
            num_conv_pos_embedding_groups=4, vocab_size=12, codevector_dim=16, proj_codevector_dim=12,
            num_codevectors_per_group=5, num_codevector_groups=2, num_negatives=4, hidden_dropout=0.0,
            activation_dropout=0.0, attention_dropout=0.0, feat_proj_dropout=0.0, final_dropout=0.0,
            layerdrop=0.0, mask_time_prob=0.3, mask_time_length=3)


def _hf_config(**kw):
    return HFConfig(**{**TINY, **kw})


def _batch(lengths=LENGTHS, n=NUM_SAMPLES, seed=0):
    rng = np.random.default_rng(seed)
    am = np.arange(n)[None, :] < np.asarray(lengths)[:, None]
    x = (rng.standard_normal((len(lengths), n)) * am).astype(np.float32)  # feature extractors pad with zeros
    return x, am.astype(np.int64), (1.0 - am).astype(np.float32)         # audio, HF attention_mask, jasr paddings


def _save(model, tmp_path_factory, name, **kw):
    d = str(tmp_path_factory.mktemp(name))
    model.save_pretrained(d, **kw)
    return d


@pytest.fixture(scope="module", params=[("group", False), ("layer", True)], ids=["group-postLN", "layer-preLN"])
def ctc(request, tmp_path_factory):
    norm, stable = request.param
    torch.manual_seed(1)
    hf = HFForCTC(_hf_config(feat_extract_norm=norm, do_stable_layer_norm=stable, conv_bias=stable)).eval()
    d = _save(hf, tmp_path_factory, f"ctc-{norm}")
    model, params, cfg = from_pretrained(d)
    return hf, d, model, params, cfg


@pytest.fixture(scope="module")
def pretrain(tmp_path_factory):
    torch.manual_seed(2)
    hf = HFForPreTraining(_hf_config(feat_extract_norm="layer", do_stable_layer_norm=True)).eval()
    d = _save(hf, tmp_path_factory, "pretrain")
    model, params, cfg = from_pretrained(d)
    return hf, d, model, params, cfg


# ---------------------------------------------------------------------------------------------------------------
# forward, CTC
# ---------------------------------------------------------------------------------------------------------------

def test_ctc_forward_matches_transformers(ctc):
    hf, _, model, params, cfg = ctc
    assert type(model) is Wav2Vec2ForCTC
    x, am, pads = _batch()
    with torch.no_grad():
        ref_base = hf.wav2vec2(torch.tensor(x), attention_mask=torch.tensor(am))
        ref_logits = hf(torch.tensor(x), attention_mask=torch.tensor(am)).logits.numpy()
        n_frames = ref_logits.shape[1]
        ref_mask = hf._get_feature_vector_attention_mask(n_frames, torch.tensor(am)).numpy()
    out = jax.jit(model.apply)({"params": params}, x, pads)
    np.testing.assert_array_equal(np.asarray(out.paddings), 1.0 - ref_mask)
    assert feat_extract_output_lengths(cfg, np.array(LENGTHS)).tolist() == ref_mask.sum(-1).tolist()
    np.testing.assert_allclose(out.logits, ref_logits, atol=1e-4, rtol=0)
    np.testing.assert_allclose(out.last_hidden_state, ref_base.last_hidden_state.numpy(), atol=1e-4, rtol=0)
    enc = Wav2Vec2Model(cfg).apply({"params": params["wav2vec2"]}, x, pads)
    ref_feats = ref_base.extract_features.numpy()
    np.testing.assert_allclose(enc.extract_features, ref_feats, atol=1e-4, rtol=0)


def test_ctc_forward_without_paddings(ctc):
    hf, _, model, params, _ = ctc
    x, _, _ = _batch(lengths=[NUM_SAMPLES, NUM_SAMPLES])
    with torch.no_grad():
        ref = hf(torch.tensor(x)).logits.numpy()
    out = model.apply({"params": params}, x)
    np.testing.assert_allclose(out.logits, ref, atol=1e-4, rtol=0)
    assert not np.asarray(out.paddings).any()


@pytest.mark.parametrize("reduction", ["sum", "mean"])
@pytest.mark.parametrize("zero_infinity", [False, True])
def test_ctc_loss_and_grad_match_transformers(ctc, reduction, zero_infinity):
    hf, _, model, params, cfg = ctc
    x, am, pads = _batch()
    rng = np.random.default_rng(3)
    labels = rng.integers(1, cfg.vocab_size, size=(3, 45))
    labels[0, 20:] = -100            # 20 labels, 79 frames
    labels[1, 7:] = -100             # 7 labels with a repeat, 61 frames
    labels[1, 3] = labels[1, 2]
    labels[1, 5] = 0                 # blank ids in labels are dropped, as transformers does
    if not zero_infinity:
        labels[2, 10:] = -100        # 10 labels, 37 frames
    # else row 2 keeps 45 labels for 37 frames: an impossible alignment, inf -> 0 with zero_infinity
    hf.config.ctc_loss_reduction, hf.config.ctc_zero_infinity = reduction, zero_infinity
    logits_t = torch.tensor(np.asarray(model.apply({"params": params}, x, pads).logits), requires_grad=True)
    lengths_t = hf._get_feat_extract_output_lengths(torch.tensor(am).sum(-1))
    ref = hf.loss_function(logits=logits_t, labels=torch.tensor(labels), logit_lengths=lengths_t,
                           blank_token_id=hf.config.pad_token_id, reduction=reduction, zero_infinity=zero_infinity)
    ref.backward()
    with torch.no_grad():  # the whole model path gives the same loss
        full = hf(torch.tensor(x), attention_mask=torch.tensor(am), labels=torch.tensor(labels)).loss
    np.testing.assert_allclose(full.item(), ref.item(), rtol=1e-4)

    out = model.apply({"params": params}, x, pads)
    pads_f = out.paddings
    ours_full = wav2vec2_ctc_loss(out.logits, out.paddings, labels, blank_id=cfg.pad_token_id or 0,
                                  reduction=reduction, zero_infinity=zero_infinity)
    np.testing.assert_allclose(float(ours_full), full.item(), rtol=1e-4)
    loss_fn = lambda lg: wav2vec2_ctc_loss(lg, pads_f, jnp.asarray(labels), blank_id=0, reduction=reduction,
                                           zero_infinity=zero_infinity)
    val, grad = jax.value_and_grad(loss_fn)(jnp.asarray(logits_t.detach().numpy()))
    assert np.isfinite(ref.item())
    np.testing.assert_allclose(float(val), ref.item(), rtol=1e-4)
    np.testing.assert_allclose(np.asarray(grad), logits_t.grad.numpy(), atol=1e-4, rtol=0)
    if zero_infinity:
        assert float(wav2vec2_ctc_loss(jnp.asarray(logits_t.detach().numpy()), pads_f, jnp.asarray(labels),
                                       reduction="none", zero_infinity=True)[2]) == 0.0
        assert np.all(np.asarray(grad)[2] == 0.0)


def test_ctc_loss_infeasible_is_inf(ctc):
    _, _, model, params, _ = ctc
    x, _, pads = _batch()
    out = model.apply({"params": params}, x, pads)
    labels = np.full((3, 50), -100)
    labels[:, :40] = 1 + (np.arange(40) % 5)  # 40 labels: > 37 frames of row 2
    per = wav2vec2_ctc_loss(out.logits, out.paddings, labels, reduction="none")
    assert np.isfinite(np.asarray(per[:2])).all() and np.isinf(float(per[2]))
    logits_t = torch.tensor(np.asarray(out.logits))
    lengths = torch.tensor((1 - np.asarray(out.paddings)).sum(-1).astype(np.int64))
    from transformers.loss.loss_ctc import ForCTCLoss
    ref = ForCTCLoss(logits_t, torch.tensor(labels), lengths, 0, reduction="none").numpy()
    np.testing.assert_allclose(np.asarray(per[:2]), ref[:2], rtol=1e-4)
    assert np.isinf(ref[2])


# ---------------------------------------------------------------------------------------------------------------
# pretraining
# ---------------------------------------------------------------------------------------------------------------

def _hf_masks(hf, seed=0):
    np.random.seed(seed)
    n_frames = int(hf._get_feat_extract_output_lengths(NUM_SAMPLES))
    fl = hf._get_feat_extract_output_lengths(torch.tensor(LENGTHS)).numpy()
    valid = np.arange(n_frames)[None, :] < fl[:, None]
    mask = hf_mod._compute_mask_indices((3, n_frames), 0.3, 3, attention_mask=torch.tensor(valid), min_masks=2)
    neg = hf_mod._sample_negative_indices((3, n_frames), hf.config.num_negatives, mask)
    return mask, neg


def test_pretraining_eval_matches_transformers(pretrain):
    hf, _, model, params, cfg = pretrain
    x, am, pads = _batch()
    mask, neg = _hf_masks(hf)
    with torch.no_grad():
        ref = hf(torch.tensor(x), attention_mask=torch.tensor(am), mask_time_indices=torch.tensor(mask),
                 sampled_negative_indices=torch.tensor(neg).long())
    out = model.apply({"params": params}, x, pads, mask_time_indices=mask)
    loss = pretraining_loss(cfg, out, mask, neg)
    np.testing.assert_allclose(out.projected_states, ref.projected_states.numpy(), atol=1e-4, rtol=0)
    np.testing.assert_allclose(out.projected_quantized_states, ref.projected_quantized_states.numpy(),
                               atol=1e-4, rtol=0)
    np.testing.assert_allclose(float(out.codevector_perplexity), ref.codevector_perplexity.item(), rtol=1e-5)
    np.testing.assert_allclose(float(loss.contrastive_loss), ref.contrastive_loss.item(), rtol=1e-4)
    np.testing.assert_allclose(float(loss.diversity_loss), ref.diversity_loss.item(), rtol=1e-4)
    np.testing.assert_allclose(float(loss.loss), ref.loss.item(), rtol=1e-4)


def test_pretraining_train_mode_gumbel_and_grads_match_transformers(pretrain, monkeypatch):
    """Train mode with the same Gumbel noise on both sides: loss (soft perplexity) and parameter gradients."""
    hf, _, model, params, cfg = pretrain
    x, am, pads = _batch()
    mask, neg = _hf_masks(hf, seed=1)
    g, v = cfg.num_codevector_groups, cfg.num_codevectors_per_group
    n_frames = mask.shape[1]
    noise = np.random.default_rng(5).gumbel(size=(3, n_frames, g, v)).astype(np.float32)

    def torch_gumbel_softmax(logits, tau=1.0, hard=False, eps=1e-10, dim=-1):  # torch's formula, fixed noise
        y_soft = ((logits + torch.tensor(noise.reshape(logits.shape))) / tau).softmax(dim)
        index = y_soft.max(dim, keepdim=True)[1]
        y_hard = torch.zeros_like(logits).scatter_(dim, index, 1.0)
        return y_hard - y_soft.detach() + y_soft if hard else y_soft

    monkeypatch.setattr(torch.nn.functional, "gumbel_softmax", torch_gumbel_softmax)
    monkeypatch.setattr(w2v_pt, "_gumbel_noise", lambda key, shape: jnp.asarray(noise).reshape(shape))
    hf.train()
    try:
        hf.zero_grad()
        ref = hf(torch.tensor(x), attention_mask=torch.tensor(am), mask_time_indices=torch.tensor(mask),
                 sampled_negative_indices=torch.tensor(neg).long())
        ref.loss.backward()
    finally:
        hf.eval()

    def loss_fn(p):
        out = model.apply({"params": p}, x, pads, mask_time_indices=mask, deterministic=False,
                          rngs={"gumbel": jax.random.PRNGKey(0), "dropout": jax.random.PRNGKey(1)})
        return pretraining_loss(cfg, out, mask, neg).loss, out

    (val, out), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
    np.testing.assert_allclose(float(out.codevector_perplexity), ref.codevector_perplexity.item(), rtol=1e-5)
    np.testing.assert_allclose(float(val), ref.loss.item(), rtol=1e-4)
    ref_grads = {k: p.grad.numpy() for k, p in hf.named_parameters() if p.grad is not None}
    ours = params_to_hf_state_dict(grads, cfg)  # same layout transform as the weights
    for name in ("quantizer.codevectors", "quantizer.weight_proj.weight", "project_q.weight", "project_hid.weight",
                 "wav2vec2.masked_spec_embed", "wav2vec2.encoder.layers.0.attention.q_proj.weight",
                 "wav2vec2.feature_extractor.conv_layers.0.conv.weight",
                 "wav2vec2.encoder.pos_conv_embed.conv.parametrizations.weight.original1"):
        scale = np.abs(ref_grads[name]).max()
        np.testing.assert_allclose(ours[name], ref_grads[name], atol=1e-4 * max(scale, 1.0), rtol=0,
                                   err_msg=name)


def test_spec_augment_application_matches_transformers(monkeypatch, tmp_path):
    """Time (masked_spec_embed) and feature (zero) masking as Wav2Vec2Model applies them in training."""
    torch.manual_seed(3)
    hf = HFForCTC(_hf_config(mask_feature_prob=0.2, mask_feature_length=4, feat_extract_norm="layer",
                             do_stable_layer_norm=True))
    hf.save_pretrained(str(tmp_path))
    model, params, cfg = from_pretrained(str(tmp_path))
    x, am, pads = _batch()
    n_frames = 79
    tmask = np.zeros((3, n_frames), bool)
    tmask[0, 5:8] = tmask[1, 40:43] = tmask[2, 0:3] = True
    fmask = np.zeros((3, cfg.hidden_size), bool)
    fmask[0, 3:7] = fmask[2, 20:24] = True
    calls = iter([tmask, fmask])
    monkeypatch.setattr(hf_mod, "_compute_mask_indices", lambda *a, **k: next(calls))
    hf.train()  # all dropouts and layerdrop are 0 in TINY
    with torch.no_grad():
        ref = hf(torch.tensor(x), attention_mask=torch.tensor(am)).logits.numpy()
    out = model.apply({"params": params}, x, pads, mask_time_indices=tmask, mask_feature_indices=fmask)
    np.testing.assert_allclose(out.logits, ref, atol=1e-4, rtol=0)
    plain = model.apply({"params": params}, x, pads)
    assert np.abs(np.asarray(plain.logits) - ref).max() > 1e-2  # the masks do change the result
    # random masks in train mode come from the 'mask' rng: reproducible, key-dependent
    run = lambda k: np.asarray(model.apply({"params": params}, x, pads, deterministic=False,
                                           rngs={"mask": jax.random.PRNGKey(k),
                                                 "dropout": jax.random.PRNGKey(0)}).logits)
    a, b, c = run(0), run(0), run(1)
    np.testing.assert_array_equal(a, b)
    assert np.abs(a - c).max() > 1e-3 and np.abs(a - np.asarray(plain.logits)).max() > 1e-3


# ---------------------------------------------------------------------------------------------------------------
# samplers (distributional properties)
# ---------------------------------------------------------------------------------------------------------------

def test_mask_indices_properties():
    t, m = 60, 4
    lengths = np.array([60, 45, 13, 7])
    pads = (np.arange(t)[None, :] >= lengths[:, None]).astype(np.float32)
    keys = jax.random.split(jax.random.PRNGKey(0), 400)
    draw = jax.jit(jax.vmap(lambda k: compute_mask_indices(k, (4, t), 0.25, m, jnp.asarray(pads), min_masks=1)))
    masks = np.asarray(draw(keys))                                             # [400, 4, 60]
    assert masks.dtype == bool
    assert not (masks & (pads[None] > 0)).any(), "spans must stay inside valid frames"
    assert (masks.sum(-1) >= m).all(), "min_masks=1: at least one span"
    # runs of masked frames are made of whole spans: every run is at least mask_length long
    d = np.diff(np.pad(masks.astype(np.int8), ((0, 0), (0, 0), (1, 1))), axis=-1)
    run_lengths = np.nonzero(d.reshape(-1, t + 1) == -1)[1] - np.nonzero(d.reshape(-1, t + 1) == 1)[1]
    assert run_lengths.min() >= m
    # masked fraction agrees with transformers' numpy sampler (same span-count rule, incl. probabilistic rounding)
    np.random.seed(0)
    ref = np.stack([hf_mod._compute_mask_indices((4, t), 0.25, m, attention_mask=torch.tensor(pads < 0.5),
                                                 min_masks=1) for _ in range(400)])
    np.testing.assert_allclose(masks.mean((0, 2)), ref.mean((0, 2)), atol=0.03)
    # with one span per row, the start is uniform over [0, L - m] (chi-square against uniform)
    one = jax.jit(jax.vmap(lambda k: compute_mask_indices(k, (1, 30), 0.0, 5, min_masks=1)))(
        jax.random.split(jax.random.PRNGKey(1), 2600))
    starts = np.argmax(np.asarray(one)[:, 0], axis=-1)
    counts = np.bincount(starts, minlength=26)
    assert counts.shape == (26,) and counts.sum() == 2600
    chi2 = ((counts - 100.0) ** 2 / 100.0).sum()
    assert chi2 < 52.6, chi2  # 25 dof, p = 0.001
    with pytest.raises(ValueError, match="mask_length"):
        compute_mask_indices(jax.random.PRNGKey(0), (2, 5), 0.5, 6)


def test_negative_indices_properties():
    b, t, k = 3, 40, 6
    rng = np.random.default_rng(0)
    mask = rng.random((b, t)) < 0.5
    mask[2] = False
    mask[2, 7] = True  # a single masked frame: nothing to sample from
    neg = np.asarray(jax.jit(sample_negative_indices, static_argnums=(1, 2))(jax.random.PRNGKey(0), (b, t), k,
                                                                             jnp.asarray(mask)))
    assert neg.shape == (b, t, k) and neg.dtype == np.int32
    hits = np.zeros((b, t, t), np.int64)
    for r in range(b):
        local = neg[r] - r * t
        assert ((local >= 0) & (local < t)).all()
        assert (local[~mask[r]] == 0).all()
        if mask[r].sum() > 1:
            assert mask[r][local[mask[r]]].all(), "negatives are masked frames of the same row"
            assert (local[mask[r]] != np.nonzero(mask[r])[0][:, None]).all(), "never the positive itself"
    assert (neg[2, 7] == 2 * t + 7).all()
    # uniform over the other masked frames: pool many draws for row 0
    keys = jax.random.split(jax.random.PRNGKey(1), 300)
    many = np.asarray(jax.vmap(lambda kk: sample_negative_indices(kk, (b, t), k, jnp.asarray(mask)))(keys))
    pos = np.nonzero(mask[0])[0]
    q = pos[0]
    counts = np.bincount(many[:, 0, q].reshape(-1), minlength=t)[pos]
    assert counts[0] == 0
    expected = 300 * k / (len(pos) - 1)
    chi2 = ((counts[1:] - expected) ** 2 / expected).sum()
    assert chi2 < 3 * len(pos) + 30, chi2


def test_sampled_inputs_give_finite_loss(pretrain):
    _, _, model, params, cfg = pretrain
    x, _, pads = _batch()
    mask, neg = w2v_pt.sample_pretraining_inputs(jax.random.PRNGKey(0), cfg, 3, NUM_SAMPLES, jnp.asarray(pads))
    fp = model.apply({"params": params}, x, pads).paddings
    assert not (np.asarray(mask) & (np.asarray(fp) > 0)).any()
    out = model.apply({"params": params}, x, pads, mask_time_indices=mask, deterministic=False,
                      rngs={"gumbel": jax.random.PRNGKey(1), "dropout": jax.random.PRNGKey(2)})
    loss = pretraining_loss(cfg, out, mask, neg)
    assert np.isfinite(float(loss.loss)) and float(loss.num_masked) == float(np.asarray(mask).sum()) > 0


# ---------------------------------------------------------------------------------------------------------------
# checkpoints
# ---------------------------------------------------------------------------------------------------------------

def test_export_roundtrip_and_transformers_loads_it(ctc, tmp_path):
    hf, d, model, params, cfg = ctc
    save_pretrained(str(tmp_path), params, cfg, head="ctc")
    back, info = HFForCTC.from_pretrained(str(tmp_path), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    x, am, pads = _batch()
    with torch.no_grad():
        a = hf(torch.tensor(x), attention_mask=torch.tensor(am)).logits.numpy()
        b = back.eval()(torch.tensor(x), attention_mask=torch.tensor(am)).logits.numpy()
    np.testing.assert_array_equal(a, b)
    _, params2, cfg2 = from_pretrained(str(tmp_path))
    assert cfg2 == cfg
    jax.tree.map(np.testing.assert_array_equal, params, params2)
    assert set(load_file(os.path.join(str(tmp_path), "model.safetensors"))) == set(hf.state_dict())


def test_pretraining_export_loads_in_transformers(pretrain, tmp_path):
    hf, _, _, params, cfg = pretrain
    save_pretrained(str(tmp_path), params, cfg, head="pretraining")
    back, info = HFForPreTraining.from_pretrained(str(tmp_path), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    for k, v in hf.state_dict().items():
        np.testing.assert_array_equal(back.state_dict()[k].numpy(), v.numpy(), err_msg=k)


def test_old_weight_norm_names_and_pytorch_bin(ctc, tmp_path):
    hf, d, model, params, cfg = ctc
    sd = load_file(os.path.join(d, "model.safetensors"))
    old = {k.replace("parametrizations.weight.original0", "weight_g")
            .replace("parametrizations.weight.original1", "weight_v"): v for k, v in sd.items()}
    assert any(k.endswith("pos_conv_embed.conv.weight_g") for k in old)
    p_old = params_from_hf_state_dict(old, cfg, "ctc")
    jax.tree.map(np.testing.assert_array_equal, params, p_old)
    os.makedirs(tmp_path / "bin")
    with open(os.path.join(d, "config.json")) as f:
        (tmp_path / "bin" / "config.json").write_text(f.read())
    torch.save({k: torch.tensor(v) for k, v in old.items()}, str(tmp_path / "bin" / "pytorch_model.bin"))
    _, p_bin, _ = from_pretrained(str(tmp_path / "bin"))
    jax.tree.map(np.testing.assert_array_equal, params, p_bin)


def test_missing_and_unexpected_keys_are_errors(ctc):
    _, d, _, _, cfg = ctc
    sd = load_file(os.path.join(d, "model.safetensors"))
    name = "wav2vec2.encoder.layers.1.feed_forward.output_dense.weight"
    with pytest.raises(CheckpointKeyError, match=name.replace(".", r"\.")):
        params_from_hf_state_dict({k: v for k, v in sd.items() if k != name}, cfg, "ctc")
    with pytest.raises(CheckpointKeyError, match="pos_conv_embed.conv.parametrizations.weight.original0"):
        params_from_hf_state_dict({k: v for k, v in sd.items() if "original0" not in k}, cfg, "ctc")
    with pytest.raises(CheckpointKeyError, match="wav2vec2.encoder.layers.2.extra"):
        params_from_hf_state_dict({**sd, "wav2vec2.encoder.layers.2.extra": np.zeros(3, np.float32)}, cfg, "ctc")
    with pytest.raises(CheckpointKeyError, match="shape"):
        params_from_hf_state_dict(sd, cfg.replace(intermediate_size=40), "ctc")


def test_pretraining_checkpoint_into_ctc_for_fine_tuning(pretrain):
    _, d, _, params, _ = pretrain
    with pytest.raises(CheckpointKeyError, match="lm_head"):
        from_pretrained(d, head="ctc")
    model, p_ctc, cfg = from_pretrained(d, head="ctc", init_missing=jax.random.PRNGKey(0), vocab_size=7)
    assert p_ctc["lm_head"]["kernel"].shape == (cfg.hidden_size, 7)
    jax.tree.map(np.testing.assert_array_equal, p_ctc["wav2vec2"], params["wav2vec2"])
    x, _, pads = _batch()
    assert model.apply({"params": p_ctc}, x, pads).logits.shape == (3, 79, 7)


def test_native_orbax_roundtrip(ctc, tmp_path):
    _, _, model, params, cfg = ctc
    save_native(str(tmp_path / "ckpt"), params, cfg, head="ctc")
    model2, params2, cfg2 = load_native(str(tmp_path / "ckpt"))
    assert cfg2 == cfg and type(model2) is type(model)
    jax.tree.map(np.testing.assert_array_equal, params, params2)
    assert json.loads((tmp_path / "ckpt" / "jasr.json").read_text())["head"] == "ctc"


# ---------------------------------------------------------------------------------------------------------------
# options: scan / remat / bf16 / logical axes / errors
# ---------------------------------------------------------------------------------------------------------------

def test_scan_and_remat_give_same_numbers(ctc):
    _, d, model, params, cfg = ctc
    x, _, pads = _batch()
    labels = np.tile(np.arange(1, 9), (3, 1))

    def loss(m, p):
        out = m.apply({"params": p}, x, pads)
        return wav2vec2_ctc_loss(out.logits, out.paddings, labels, reduction="mean"), out.logits

    (l0, lg0), g0 = jax.value_and_grad(lambda p: loss(model, p), has_aux=True)(params)
    m1, p1, c1 = from_pretrained(d, scan_layers=True, remat=True, attention_chunk_size=16)  # 79 frames: 5 chunks
    assert p1["wav2vec2"]["encoder"]["layers"]["layer"]["attention"]["q_proj"]["kernel"].shape[0] == 2
    (l1, lg1), g1 = jax.value_and_grad(lambda p: loss(m1, p), has_aux=True)(p1)
    np.testing.assert_allclose(lg1, lg0, atol=1e-5, rtol=0)
    np.testing.assert_allclose(float(l1), float(l0), rtol=1e-5)
    ga, gb = params_to_hf_state_dict(g0, cfg), params_to_hf_state_dict(g1, c1)
    assert set(ga) == set(gb)
    for k in ga:
        np.testing.assert_allclose(gb[k], ga[k], atol=1e-5, rtol=1e-4, err_msg=k)


def test_bfloat16(ctc):
    _, d, model, params, cfg = ctc
    m16, p16, c16 = from_pretrained(d, dtype="bfloat16", param_dtype="bfloat16")
    assert all(a.dtype == jnp.bfloat16 for a in jax.tree.leaves(p16))
    x, _, pads = _batch()
    ref = model.apply({"params": params}, x, pads).logits
    out = m16.apply({"params": p16}, x, pads)
    assert out.logits.dtype == jnp.float32 and out.last_hidden_state.dtype == jnp.bfloat16
    err = np.abs(np.asarray(out.logits) - np.asarray(ref))
    assert np.isfinite(err).all() and err.max() < 0.1 * max(1.0, np.abs(np.asarray(ref)).max())


def test_init_logical_axes_and_train_mode_dropout():
    cfg = Wav2Vec2Config(**{**TINY, "hidden_dropout": 0.1, "layerdrop": 0.5, "scan_layers": True})
    model = Wav2Vec2ForCTC(cfg)
    x, _, pads = _batch()
    boxed = model.init(jax.random.PRNGKey(0), x[:, :800], pads[:, :800])["params"]
    names = nn.get_partition_spec(boxed)
    assert tuple(names["lm_head"]["kernel"]) == ("embed", "vocab")
    assert tuple(names["wav2vec2"]["encoder"]["layers"]["layer"]["attention"]["q_proj"]["kernel"]) == \
        ("layers", "embed", "heads", "kv")
    assert tuple(names["wav2vec2"]["encoder"]["layers"]["layer"]["feed_forward"]["intermediate_dense"]["kernel"]) == \
        ("layers", "embed", "mlp")
    params = nn.unbox(boxed)
    run = lambda k: np.asarray(model.apply({"params": params}, x, pads, deterministic=False,
                                           rngs={"dropout": jax.random.PRNGKey(k),
                                                 "mask": jax.random.PRNGKey(k)}).logits)
    np.testing.assert_array_equal(run(0), run(0))
    assert np.abs(run(0) - run(1)).max() > 1e-4
    ev = np.asarray(model.apply({"params": params}, x, pads).logits)
    np.testing.assert_array_equal(ev, np.asarray(model.apply({"params": params}, x, pads).logits))


def test_bad_input_errors(ctc):
    _, _, model, params, cfg = ctc
    assert cfg.receptive_field == 10 + 2 * 5 + 2 * 10
    with pytest.raises(ValueError, match="receptive field"):
        model.apply({"params": params}, np.zeros((2, cfg.receptive_field - 1), np.float32))
    x, _, pads = _batch(lengths=[1600, 20])
    with pytest.raises(ValueError, match=r"rows \[1\]"):
        model.apply({"params": params}, x, pads)
    x, _, pads = _batch(lengths=[1600, 0])  # an empty filler row is fine: all its frames are padding
    out = model.apply({"params": params}, x, pads)
    assert np.asarray(out.paddings)[1].all() and np.isfinite(np.asarray(out.logits)).all()
    with pytest.raises(ValueError, match=r"\[batch, samples\]"):
        model.apply({"params": params}, np.zeros((1600,), np.float32))
    with pytest.raises(NotImplementedError, match="adapter"):
        Wav2Vec2Config(add_adapter=True)
    with pytest.raises(ValueError, match="feat_extract_norm"):
        Wav2Vec2Config(feat_extract_norm="batch")


def test_chunked_attention_equals_unchunked():
    from models.wav2vec2 import dot_product_attention

    rng = np.random.default_rng(0)
    q, k, v = (jnp.asarray(rng.standard_normal((2, 37, 3, 4)).astype(np.float32)) for _ in range(3))
    key_mask = jnp.asarray(np.arange(37)[None, :] < np.array([[37], [20]]))
    f = lambda c: (lambda q, k, v: jnp.sum(jnp.sin(dot_product_attention(q, k, v, key_mask, chunk_size=c))))
    v0, g0 = jax.value_and_grad(f(0), argnums=(0, 1, 2))(q, k, v)
    v1, g1 = jax.value_and_grad(f(8), argnums=(0, 1, 2))(q, k, v)  # 37 = 4 chunks of 8 + a padded one
    np.testing.assert_allclose(float(v1), float(v0), rtol=1e-5)
    for a, b in zip(g0, g1):
        np.testing.assert_allclose(b, a, atol=1e-5, rtol=0)
    out = dot_product_attention(q, k, v, key_mask, chunk_size=8)
    np.testing.assert_allclose(out, dot_product_attention(q, k, v, key_mask), atol=1e-6, rtol=0)
    d = dot_product_attention(q, k, v, key_mask, chunk_size=8, dropout_rate=0.5, dropout_rng=jax.random.PRNGKey(0))
    assert d.shape == out.shape and np.isfinite(np.asarray(d)).all() and np.abs(np.asarray(d - out)).max() > 1e-3
