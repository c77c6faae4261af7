"""Whisper in jasr against transformers' PyTorch Whisper and openai-whisper, on tiny random models (no downloads).

The random weights are re-drawn with unit-scale statistics (transformers initialises with std 0.02, which makes
all logits nearly equal and greedy decoding a coin toss between float rounding errors).
"""
import copy
import dataclasses
import functools
import json
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from models.hf_io import CheckpointKeyError, load_state_dict, save_checkpoint  # noqa: E402
from models.whisper import WhisperConfig, WhisperModel, init_cache, init_params  # noqa: E402
from models.whisper_generate import (GenerationSettings, detect_language, encode, generate,  # noqa: E402
                                     merge_overlapping, split_segments, strip, transcribe_batched,
                                     transcribe_sequential)
from models.whisper_hf import (from_pretrained, hf_to_params, load_native, params_to_hf,  # noqa: E402
                               save_native, save_pretrained, stack_layers)

# token layout of the tiny vocabulary (mirrors the real one: text, eos, sot, languages, tasks, specials, timestamps)
V = 128
EOS, SOT, EN, DE, TRANSLATE, TRANSCRIBE, PREV, NOSPEECH, NOTS = 100, 101, 102, 103, 104, 105, 106, 107, 108
TB = NOTS + 1                                       # 19 timestamp tokens: <|0.00|> .. <|0.36|>
D_MODEL, N_MELS, SRC, TGT = 32, 8, 16, 64
FRAMES = 2 * SRC


@functools.partial(jax.jit, static_argnums=0)
def _logits(model, params, feats, ids, mask=None):
    return model.apply({"params": params}, feats, ids, mask)


@functools.partial(jax.jit, static_argnums=0)
def _decode(model, params, ids, enc, cache=None, index=None):
    return model.apply({"params": params}, ids, enc, None, cache, index, method="decode")


def _hf_config(**kw):
    base = dict(vocab_size=V, num_mel_bins=N_MELS, d_model=D_MODEL, encoder_layers=2, encoder_attention_heads=4,
                encoder_ffn_dim=64, decoder_layers=2, decoder_attention_heads=4, decoder_ffn_dim=64,
                max_source_positions=SRC, max_target_positions=TGT, pad_token_id=EOS, bos_token_id=EOS,
                eos_token_id=EOS, decoder_start_token_id=SOT, suppress_tokens=None, begin_suppress_tokens=None)
    base.update(kw)
    return transformers.WhisperConfig(**base)


def _randomize(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "embed_positions" in name and "encoder" in name:
                continue                                        # sinusoids, as in real checkpoints
            if name.endswith("embed_tokens.weight"):
                p.copy_(torch.randn(p.shape, generator=g))
            elif "decoder.embed_positions" in name:         # as strong as the tokens: varied, non-looping output
                p.copy_(2.0 * torch.randn(p.shape, generator=g))
            elif p.ndim >= 2:
                fan_in = int(np.prod(p.shape[1:]))
                p.copy_(torch.randn(p.shape, generator=g) / np.sqrt(fan_in))
            elif "layer_norm" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.1 * torch.randn(p.shape, generator=g))


GEN = dict(decoder_start_token_id=SOT, eos_token_id=EOS, pad_token_id=EOS, bos_token_id=EOS,
           suppress_tokens=[3, 7, PREV], begin_suppress_tokens=[5, EOS], no_timestamps_token_id=NOTS,
           max_initial_timestamp_index=4, lang_to_id={"<|en|>": EN, "<|de|>": DE},
           task_to_id={"translate": TRANSLATE, "transcribe": TRANSCRIBE}, is_multilingual=True, max_length=TGT)


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    torch.manual_seed(0)
    model = transformers.WhisperForConditionalGeneration(_hf_config()).eval()
    _randomize(model, 0)
    d = str(tmp_path_factory.mktemp("whisper_tiny"))
    model.save_pretrained(d)
    with open(os.path.join(d, "generation_config.json"), "w") as f:
        json.dump(GEN, f)
    return d


@pytest.fixture(scope="module")
def hf_model(hf_dir):
    return transformers.WhisperForConditionalGeneration.from_pretrained(hf_dir).eval()


@pytest.fixture(scope="module")
def jx(hf_dir):
    model, params = from_pretrained(hf_dir)
    return model, params, GenerationSettings.from_pretrained(hf_dir)


def _hf_gen_config(**overrides):
    d = dict(GEN)
    d.update(overrides)
    return transformers.GenerationConfig(**d)


@pytest.fixture(scope="module")
def feats():
    return np.random.default_rng(1).standard_normal((3, N_MELS, FRAMES)).astype(np.float32)


# ---------------------------------------------------------------------------------------------------- forward

def test_encoder_and_logits_match_transformers(hf_model, jx, feats):
    model, params, _ = jx
    rng = np.random.default_rng(2)
    ids = rng.integers(0, EOS, (3, 9))
    mask = np.ones((3, 9), np.int64)
    mask[1, 6:] = 0
    mask[2, 3:] = 0
    with torch.no_grad():
        enc_t = hf_model.model.encoder(torch.tensor(feats)).last_hidden_state.numpy()
        out_t = hf_model(input_features=torch.tensor(feats), decoder_input_ids=torch.tensor(ids),
                         decoder_attention_mask=torch.tensor(mask)).logits.numpy()
    enc = np.asarray(encode(model, params, jnp.asarray(feats)))
    logits = np.asarray(_logits(model, params, jnp.asarray(feats), jnp.asarray(ids), jnp.asarray(mask)))
    np.testing.assert_allclose(enc, enc_t, atol=1e-4, rtol=0)
    valid = mask.astype(bool)
    np.testing.assert_allclose(logits[valid], out_t[valid], atol=1e-4, rtol=0)
    assert np.abs(out_t).max() > 1.0                      # the comparison is not between near-zero numbers


def test_cached_steps_equal_teacher_forcing(jx, feats):
    model, params, _ = jx
    ids = jnp.asarray(np.random.default_rng(3).integers(0, EOS, (3, 7)))
    enc = encode(model, params, jnp.asarray(feats))
    full, _ = _decode(model, params, ids, enc)
    cache = init_cache(model.config, 3, 12)
    first, cache = _decode(model, params, ids[:, :4], enc, cache, 0)
    steps = [first]
    for t in range(4, 7):
        lg, cache = _decode(model, params, ids[:, t:t + 1], None, cache, t)
        steps.append(lg)
    np.testing.assert_allclose(np.concatenate(steps, 1), full, atol=1e-5, rtol=0)


def test_scan_and_remat_give_same_numbers_and_grads(jx, feats):
    model, params, _ = jx
    ids = jnp.asarray(np.random.default_rng(4).integers(0, EOS, (3, 6)))

    def loss_fn(m):
        def f(p):
            lg = m.apply({"params": p}, jnp.asarray(feats), ids)
            return jnp.mean(jax.nn.log_softmax(lg)[..., 0]), lg
        return f

    (l0, lg0), g0 = jax.jit(jax.value_and_grad(loss_fn(model), has_aux=True))(params)
    stacked = jax.tree_util.tree_map(jnp.asarray, stack_layers(params))
    # forward for each option alone; gradients for both together (remat changes only the backward pass)
    for scan, remat in ((False, True), (True, False)):
        lg1 = _logits(WhisperModel(model.config, scan_layers=scan, remat=remat), stacked if scan else params,
                      jnp.asarray(feats), ids)
        np.testing.assert_allclose(lg1, lg0, atol=1e-5, rtol=0)
    m = WhisperModel(model.config, scan_layers=True, remat=True)
    (l1, lg1), g1 = jax.jit(jax.value_and_grad(loss_fn(m), has_aux=True))(stacked)
    np.testing.assert_allclose(lg1, lg0, atol=1e-5, rtol=0)
    ref = stack_layers(jax.tree_util.tree_map(np.asarray, g0))
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-4), ref, g1)
    # cached decoding through the scanned stack
    settings = jx[2]
    a = generate(model, params, feats, settings, max_new_tokens=8, language="en")
    b = generate(WhisperModel(model.config, scan_layers=True), stacked, feats, settings, max_new_tokens=8,
                 language="en")
    np.testing.assert_array_equal(a["sequences"], b["sequences"])


def test_blocked_attention_equals_plain():
    from models.whisper import _attend
    rng = np.random.default_rng(12)
    q, k, v = (jnp.asarray(rng.standard_normal((2, 1200, 3, 8)).astype(np.float32)) for _ in range(3))
    hm = lambda a: jnp.swapaxes(a, 1, 2)
    fast = jax.jit(lambda q, k, v: _attend(q, hm(k), hm(v), None, jnp.float32))(q, k, v)   # 3 blocks of 400
    w = jnp.einsum("bqhd,bkhd->bhqk", q, k)
    ref = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(w, axis=-1), v)
    np.testing.assert_allclose(fast, ref, atol=1e-5, rtol=0)


def test_bfloat16_close_to_float32(jx, feats):
    model, params, _ = jx
    ids = np.random.default_rng(5).integers(0, EOS, (3, 5))
    ref = np.asarray(_logits(model, params, jnp.asarray(feats), jnp.asarray(ids)))
    m16 = WhisperModel(model.config, dtype=jnp.bfloat16, param_dtype=jnp.bfloat16)
    p16 = jax.tree_util.tree_map(lambda a: a.astype(jnp.bfloat16), params)
    out = _logits(m16, p16, jnp.asarray(feats), jnp.asarray(ids))
    assert out.dtype == jnp.float32                      # logits in float32
    err = np.abs(np.asarray(out) - ref).max() / np.abs(ref).max()
    assert err < 0.1, err


def test_boxed_params_carry_logical_axes():
    cfg = WhisperConfig.from_hf_dict(_hf_config().to_dict())
    boxed = init_params(WhisperModel(cfg, scan_layers=True), jax.random.key(0), decoder_length=2)
    specs = nn.get_partition_spec(boxed)
    assert tuple(specs["decoder"]["embed_tokens"]) == ("vocab", "embed")
    assert tuple(specs["encoder"]["layers"]["self_attn"]["q_proj"]["kernel"]) == ("layers", "embed", "heads", "kv")
    assert tuple(specs["decoder"]["layers"]["fc1"]["kernel"]) == ("layers", "embed", "mlp")


def test_bad_inputs_raise_clear_errors(jx, feats):
    model, params, _ = jx
    with pytest.raises(ValueError, match="transpose"):
        model.apply({"params": params}, jnp.swapaxes(feats, 1, 2), method="encode")
    with pytest.raises(ValueError, match="exactly 32 mel frames"):
        model.apply({"params": params}, feats[:, :, :20], method="encode")
    with pytest.raises(ValueError, match="max_target_positions"):
        init_cache(model.config, 1, TGT + 1)
    with pytest.raises(ValueError, match="divisible"):
        WhisperConfig(d_model=30, encoder_attention_heads=4)


def test_presets_match_released_architectures():
    v3 = WhisperConfig.preset("large-v3")
    assert (v3.num_mel_bins, v3.vocab_size, v3.d_model, v3.encoder_layers, v3.decoder_attention_heads) == \
        (128, 51866, 1280, 32, 20)
    assert WhisperConfig.preset("large-v3-turbo").decoder_layers == 4
    base = WhisperConfig.preset("base.en")
    assert (base.d_model, base.encoder_layers, base.vocab_size, base.decoder_start_token_id) == (512, 6, 51864, 50257)
    with pytest.raises(ValueError, match="unknown Whisper preset"):
        WhisperConfig.preset("huge")


# ---------------------------------------------------------------------------------------------------- checkpoints

def test_missing_and_unexpected_tensors_are_named(hf_dir, tmp_path):
    cfg = WhisperConfig.from_hf_dict(json.load(open(os.path.join(hf_dir, "config.json"))))
    sd = load_state_dict(hf_dir)
    missing = dict(sd)
    del missing["model.decoder.layers.1.fc2.bias"]
    with pytest.raises(CheckpointKeyError, match=r"model\.decoder\.layers\.1\.fc2\.bias"):
        hf_to_params(missing, cfg)
    extra = dict(sd, **{"model.encoder.layers.9.fc1.weight": np.zeros((2, 2), np.float32)})
    with pytest.raises(CheckpointKeyError, match=r"model\.encoder\.layers\.9\.fc1\.weight"):
        hf_to_params(extra, cfg)
    untied = dict(sd, **{"proj_out.weight": sd["model.decoder.embed_tokens.weight"] + 1})
    with pytest.raises(CheckpointKeyError, match="untied"):
        hf_to_params(untied, cfg)
    bad = dict(sd, **{"model.encoder.conv1.weight": np.zeros((D_MODEL, N_MELS + 1, 3), np.float32)})
    with pytest.raises(ValueError, match="conv1"):
        hf_to_params(bad, cfg)


def test_pytorch_bin_checkpoint(hf_dir, hf_model, tmp_path, jx):
    d = str(tmp_path / "bin")
    os.makedirs(d)
    torch.save(hf_model.state_dict(), os.path.join(d, "pytorch_model.bin"))
    with open(os.path.join(hf_dir, "config.json")) as f, open(os.path.join(d, "config.json"), "w") as g:
        g.write(f.read())
    _, params = from_pretrained(d)           # includes proj_out.weight, tied
    jax.tree_util.tree_map(np.testing.assert_array_equal, params, jx[1])


def test_export_loads_in_transformers_and_round_trips(jx, hf_model, feats, tmp_path):
    model, params, settings = jx
    d = str(tmp_path / "export")
    save_pretrained(d, model.config, params, generation_config=GEN)
    back = transformers.WhisperForConditionalGeneration.from_pretrained(d).eval()
    ids = torch.tensor(np.random.default_rng(6).integers(0, EOS, (3, 5)))
    with torch.no_grad():
        a = back(input_features=torch.tensor(feats), decoder_input_ids=ids).logits.numpy()
        b = hf_model(input_features=torch.tensor(feats), decoder_input_ids=ids).logits.numpy()
    np.testing.assert_array_equal(a, b)
    _, params2 = from_pretrained(d)
    jax.tree_util.tree_map(np.testing.assert_array_equal, params2, params)
    assert GenerationSettings.from_pretrained(d) == settings
    # scanned params export to the same tensors
    scanned = params_to_hf(stack_layers(params))
    ref = params_to_hf(params)
    assert scanned.keys() == ref.keys()
    for k in ref:
        np.testing.assert_array_equal(scanned[k], ref[k])


def test_native_orbax_checkpoint(jx, tmp_path):
    model, params, _ = jx
    save_native(str(tmp_path / "native"), model.config, params)
    m2, p2 = load_native(str(tmp_path / "native"))
    assert m2.config == model.config and not m2.scan_layers
    jax.tree_util.tree_map(np.testing.assert_array_equal, p2, params)
    m3, p3 = load_native(str(tmp_path / "native"), scan_layers=True)
    assert m3.scan_layers
    jax.tree_util.tree_map(np.testing.assert_array_equal, p3, stack_layers(params))


def test_openai_whisper_reference(tmp_path):
    whisper = pytest.importorskip("whisper")
    from whisper.model import ModelDimensions, Whisper

    dims = ModelDimensions(n_mels=N_MELS, n_audio_ctx=SRC, n_audio_state=D_MODEL, n_audio_head=4, n_audio_layer=2,
                           n_vocab=V, n_text_ctx=TGT, n_text_state=D_MODEL, n_text_head=4, n_text_layer=2)
    torch.manual_seed(1)
    ow = Whisper(dims).eval()
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, p in ow.named_parameters():
            p.copy_(torch.randn(p.shape, generator=g) / (np.sqrt(p.shape[-1]) if p.ndim >= 2 else 10.0))
    sd = {}
    ren = [("encoder.blocks.", "model.encoder.layers."), ("decoder.blocks.", "model.decoder.layers."),
           (".attn.query.", ".self_attn.q_proj."), (".attn.key.", ".self_attn.k_proj."),
           (".attn.value.", ".self_attn.v_proj."), (".attn.out.", ".self_attn.out_proj."),
           (".cross_attn.query.", ".encoder_attn.q_proj."), (".cross_attn.key.", ".encoder_attn.k_proj."),
           (".cross_attn.value.", ".encoder_attn.v_proj."), (".cross_attn.out.", ".encoder_attn.out_proj."),
           (".attn_ln.", ".self_attn_layer_norm."), (".cross_attn_ln.", ".encoder_attn_layer_norm."),
           (".mlp.0.", ".fc1."), (".mlp.2.", ".fc2."), (".mlp_ln.", ".final_layer_norm.")]
    for k, v in ow.state_dict().items():
        if k == "alignment_heads":
            continue
        name = {"encoder.positional_embedding": "model.encoder.embed_positions.weight",
                "decoder.positional_embedding": "model.decoder.embed_positions.weight",
                "decoder.token_embedding.weight": "model.decoder.embed_tokens.weight",
                "encoder.ln_post.weight": "model.encoder.layer_norm.weight",
                "encoder.ln_post.bias": "model.encoder.layer_norm.bias",
                "decoder.ln.weight": "model.decoder.layer_norm.weight",
                "decoder.ln.bias": "model.decoder.layer_norm.bias"}.get(k)
        if name is None:
            name = k if k.startswith("encoder.conv") else k
            for a, b in ren:
                name = name.replace(a, b)
            if name.startswith("encoder.conv"):
                name = "model." + name
        sd[name] = v.float().numpy()
    cfg = WhisperConfig.from_hf_dict(_hf_config(encoder_ffn_dim=4 * D_MODEL, decoder_ffn_dim=4 * D_MODEL).to_dict())
    params = hf_to_params(sd, cfg)
    model = WhisperModel(cfg)
    mel = np.random.default_rng(8).standard_normal((2, N_MELS, FRAMES)).astype(np.float32)
    toks = np.random.default_rng(9).integers(0, EOS, (2, 6))
    with torch.no_grad():
        audio = ow.encoder(torch.tensor(mel))
        ref_logits = ow.decoder(torch.tensor(toks), audio).numpy()
    enc = np.asarray(encode(model, params, jnp.asarray(mel)))
    np.testing.assert_allclose(enc, audio.numpy(), atol=1e-4, rtol=0)
    np.testing.assert_allclose(np.asarray(_logits(model, params, jnp.asarray(mel), jnp.asarray(toks))), ref_logits, atol=1e-4, rtol=0)


# ---------------------------------------------------------------------------------------------------- generation

def _hf_generate(hf_model, feats, **kw):
    gc = _hf_gen_config(**kw.pop("gen", {}))
    with torch.no_grad():
        out = hf_model.generate(torch.tensor(feats), generation_config=gc, **kw)
    seq = out["sequences"] if isinstance(out, dict) else out
    return seq.numpy(), out


def _rows(hf_seq, settings):
    """transformers' padded output rows -> token lists (pad/eos tail removed)."""
    return strip(hf_seq, 0, settings)


NO_EOS = dict(suppress_tokens=GEN["suppress_tokens"] + [EOS])          # run all max_new_tokens steps


def _no_eos(settings):
    return dataclasses.replace(settings, suppress_tokens=tuple(NO_EOS["suppress_tokens"]))


def _varied_eos(rows):
    """A token whose first occurrence differs most between rows (so that rows end at different steps)."""
    best, best_n = None, -1
    for t in sorted(set(rows[-1][4:])):
        firsts = {r.index(t) if t in r else None for r in rows}
        if len(firsts) > best_n and t != 5:
            best, best_n = t, len(firsts)
    return best


@pytest.mark.parametrize("kw", [dict(language="de", task="transcribe"), dict(task="translate"),
                                dict(language="en", return_timestamps=True)],
                         ids=["de-transcribe", "detect-translate", "timestamps"])
def test_greedy_matches_transformers(hf_model, jx, feats, kw):
    model, params, settings = jx
    hf_seq, _ = _hf_generate(hf_model, feats, max_new_tokens=40, gen=NO_EOS, **kw)
    out = generate(model, params, feats, _no_eos(settings), max_new_tokens=40, **kw)
    mine = strip(out["sequences"], out["prompt_length"], settings)
    assert mine == _rows(hf_seq, settings)
    assert min(len(r) for r in mine) == 40 and len({t for r in mine for t in r}) >= 5
    if kw.get("return_timestamps"):
        assert any(t >= TB for r in mine for t in r)


def test_greedy_stops_at_eos_like_transformers(hf_model, jx, feats):
    model, params, settings = jx
    first = generate(model, params, feats, _no_eos(settings), max_new_tokens=40, language="en")
    eos = _varied_eos(strip(first["sequences"], first["prompt_length"], settings))
    s2 = dataclasses.replace(settings, eos_token_id=eos, pad_token_id=eos)
    out = generate(model, params, feats, s2, max_new_tokens=40, language="en")
    hf_seq, _ = _hf_generate(hf_model, feats, max_new_tokens=40, language="en",
                             gen=dict(eos_token_id=eos, pad_token_id=eos))
    mine = strip(out["sequences"], out["prompt_length"], s2)
    assert mine == _rows(hf_seq, s2)
    assert min(len(r) for r in mine) < 40


@pytest.mark.parametrize("beams,lp", [(3, 1.0), (2, 0.5)])
def test_beam_search_matches_transformers(hf_model, jx, feats, beams, lp):
    model, params, settings = jx
    out = generate(model, params, feats, settings, max_new_tokens=36, language="en", num_beams=beams,
                   length_penalty=lp)
    hf_seq, _ = _hf_generate(hf_model, feats, max_new_tokens=36, language="en", num_beams=beams,
                             length_penalty=lp)
    mine = strip(out["sequences"], out["prompt_length"], settings)
    assert mine == _rows(hf_seq, settings)
    greedy = generate(model, params, feats, settings, max_new_tokens=36, language="en")
    assert mine != strip(greedy["sequences"], greedy["prompt_length"], settings)      # beams did matter


def test_beam_search_with_eos_matches_transformers(hf_model, jx, feats):
    model, params, settings = jx
    first = generate(model, params, feats, _no_eos(settings), max_new_tokens=30, language="en", num_beams=3)
    eos = _varied_eos(strip(first["sequences"], first["prompt_length"], settings))
    s2 = dataclasses.replace(settings, eos_token_id=eos, pad_token_id=eos)
    out = generate(model, params, feats, s2, max_new_tokens=30, language="en", num_beams=3)
    hf_seq, _ = _hf_generate(hf_model, feats, max_new_tokens=30, language="en", num_beams=3,
                             gen=dict(eos_token_id=eos, pad_token_id=eos))
    mine = strip(out["sequences"], out["prompt_length"], s2)
    assert mine == _rows(hf_seq, s2)
    assert min(len(r) for r in mine) < 30                 # some hypotheses finished with eos


def test_language_detection_and_prompts(jx, hf_model, feats):
    model, params, settings = jx
    enc = encode(model, params, jnp.asarray(feats))
    langs = detect_language(model, params, enc, settings)
    with torch.no_grad():
        ref = hf_model.detect_language(torch.tensor(feats), generation_config=_hf_gen_config()).numpy()
    np.testing.assert_array_equal(langs, ref)
    assert settings.init_tokens(language="de", task="translate") == [SOT, DE, TRANSLATE, NOTS]
    assert settings.init_tokens(language="en", return_timestamps=True) == [SOT, EN, TRANSCRIBE]
    assert settings.init_tokens() == [SOT, None, NOTS]
    with pytest.raises(ValueError, match="unsupported language"):
        settings.init_tokens(language="xx")


# ---------------------------------------------------------------------------------------------------- long-form

@pytest.mark.parametrize("ts_scale,language", [(1.0, None), (3.0, "en")], ids=["detect", "seek-by-timestamps"])
def test_sequential_long_form_matches_transformers(hf_model, jx, ts_scale, language):
    model, params, settings = jx
    if ts_scale != 1.0:       # make timestamp tokens likelier (same change on both sides) to exercise seeking
        hf_model = copy.deepcopy(hf_model)
        with torch.no_grad():
            hf_model.model.decoder.embed_tokens.weight[TB:] *= ts_scale
        emb = params["decoder"]["embed_tokens"]
        params = {**params, "decoder": {**params["decoder"], "embed_tokens": emb.at[TB:].multiply(ts_scale)}}
    rng = np.random.default_rng(10)
    lengths = [90, 61]
    feats = rng.standard_normal((2, N_MELS, 90)).astype(np.float32)
    feats[1, :, 61:] = 0.0
    mine = transcribe_sequential(model, params, feats, settings, num_frames=lengths, max_new_tokens=20,
                                 language=language)
    attn = np.zeros((2, 90), np.int64)
    attn[0, :90] = 1
    attn[1, :61] = 1
    with torch.no_grad():
        out = hf_model.generate(torch.tensor(feats), attention_mask=torch.tensor(attn),
                                generation_config=_hf_gen_config(), max_new_tokens=20, language=language,
                                return_timestamps=True, return_segments=True)
    for i in range(2):
        hf_segs = out["segments"][i]
        assert len(mine[i]["segments"]) == len(hf_segs)
        for a, b in zip(mine[i]["segments"], hf_segs):
            assert a["tokens"] == b["tokens"].tolist()
            assert a["start"] == pytest.approx(float(b["start"]), abs=1e-6)
            assert a["end"] == pytest.approx(float(b["end"]), abs=1e-6)
        assert mine[i]["tokens"] == [t for s in hf_segs for t in s["tokens"].tolist()]
    if ts_scale != 1.0:                 # windows ended inside timestamp pairs: seeking by timestamps happened
        assert len(mine[0]["segments"]) > 3 and any(t >= TB for t in mine[1]["tokens"])


def test_batched_long_form_equals_windows_by_hand(jx):
    model, params, settings = jx
    feats = np.random.default_rng(11).standard_normal((2, N_MELS, 80)).astype(np.float32)
    res = transcribe_batched(model, params, feats, settings, num_frames=[80, 50], max_new_tokens=12,
                             language="en", batch_size=4)
    for i, n in enumerate([80, 50]):
        expect = []
        for s in range(0, n, FRAMES):
            w = np.zeros((1, N_MELS, FRAMES), np.float32)
            piece = feats[i, :, s:min(s + FRAMES, n)]
            w[0, :, :piece.shape[1]] = piece
            o = generate(model, params, w, settings, max_new_tokens=12, language="en")
            expect.append(strip(o["sequences"], o["prompt_length"], settings)[0])
        assert [t for _, t in res[i]["windows"]] == expect
        assert res[i]["tokens"] == [t for e in expect for t in e]
    # sequential without timestamps = consecutive fixed windows
    seq = transcribe_sequential(model, params, feats, settings, num_frames=[80, 50], max_new_tokens=12,
                                language="en", return_timestamps=False)
    assert [r["tokens"] for r in seq] == [r["tokens"] for r in res]
    # overlapping windows run and merge
    ov = transcribe_batched(model, params, feats, settings, overlap_frames=8, max_new_tokens=12, language="en",
                            batch_size=4)
    assert [s for s, _ in ov[0]["windows"]] == [0, 24, 48]


def test_merge_and_segment_rules():
    assert merge_overlapping([[1, 2, 3, 4, 5], [4, 5, 6, 7]]) == [1, 2, 3, 4, 5, 6, 7]
    assert merge_overlapping([[1, 2], [8, 9]]) == [1, 2, 8, 9]
    assert merge_overlapping([[1, 2, 3, 9, 5], [3, 4, 5, 6]]) == [1, 2, 3, 4, 5, 6]
    # two complete segments then an unfinished one: seek to the last timestamp of the pairs
    toks = [TB + 0, 10, 11, TB + 3, TB + 3, 12, TB + 7, TB + 7, 13]
    segs, adv = split_segments(toks, TB, 32, 1.0)
    assert [s["tokens"] for s in segs] == [[TB, 10, 11, TB + 3], [TB + 3, 12, TB + 7, TB + 7]]
    assert segs[0]["start"] == pytest.approx(1.0) and segs[1]["end"] == pytest.approx(1.14)
    assert adv == 14
    segs, adv = split_segments([TB, 10, TB + 2], TB, 32, 0.0)       # single timestamp ending: whole window
    assert adv == 32 and len(segs) == 1
