"""Whisper long-form (models.whisper_longform.transcribe_longform) on a tiny random model: the decisions against
openai-whisper's rules computed here independently (zlib compression ratio of the tokens / text, no-speech
probability from a teacher-forced forward pass), and the whole transcription against transformers' long-form
``generate`` (greedy, previous-text conditioning, no-speech skipping) token for token."""
import dataclasses
import json
import os
import zlib

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from jasr.tasks.base import SearchOptions  # noqa: E402
from jasr.tasks.whisper import WhisperTask  # noqa: E402
from models.whisper_generate import (GenerationSettings, LongFormOptions, generate, strip,  # noqa: E402
                                     transcribe_longform)
from models.whisper_decode import beam_nbest_from_encoder, build_prompts, decode_options, encode  # noqa: E402
from models.whisper_hf import from_pretrained  # noqa: E402

V = 128
EOS, SOT, EN, DE, TRANSLATE, TRANSCRIBE, PREV, NOSPEECH, NOTS = 100, 101, 102, 103, 104, 105, 106, 107, 108
TB = NOTS + 1
N_MELS, SRC, TGT = 8, 16, 64
GEN = dict(decoder_start_token_id=SOT, eos_token_id=EOS, pad_token_id=EOS, bos_token_id=EOS,
           suppress_tokens=[3, 7, NOSPEECH, PREV], begin_suppress_tokens=[5, EOS], no_timestamps_token_id=NOTS,
           max_initial_timestamp_index=4, lang_to_id={"<|en|>": EN, "<|de|>": DE}, prev_sot_token_id=PREV,
           task_to_id={"translate": TRANSLATE, "transcribe": TRANSCRIBE}, is_multilingual=True, max_length=TGT)
TS_SCALE, NS_SCALE = 3.0, 6.0     # timestamps likelier (seeking happens); a no-speech probability that varies


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    cfg = transformers.WhisperConfig(
        vocab_size=V, num_mel_bins=N_MELS, d_model=32, encoder_layers=2, encoder_attention_heads=4,
        encoder_ffn_dim=64, decoder_layers=2, decoder_attention_heads=4, decoder_ffn_dim=64,
        max_source_positions=SRC, max_target_positions=TGT, pad_token_id=EOS, bos_token_id=EOS, eos_token_id=EOS,
        decoder_start_token_id=SOT, suppress_tokens=None, begin_suppress_tokens=None)
    torch.manual_seed(0)
    hf = transformers.WhisperForConditionalGeneration(cfg).eval()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():                 # unit-scale weights (transformers' std 0.02 gives near-equal logits)
        for name, p in hf.named_parameters():
            if "embed_positions" in name and "encoder" in name:
                continue
            if name.endswith("embed_tokens.weight"):
                p.copy_(torch.randn(p.shape, generator=g))
            elif "decoder.embed_positions" in name:
                p.copy_(2.0 * torch.randn(p.shape, generator=g))
            elif p.ndim >= 2:
                p.copy_(torch.randn(p.shape, generator=g) / np.sqrt(int(np.prod(p.shape[1:]))))
            elif "layer_norm" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
        emb = hf.model.decoder.embed_tokens.weight
        emb[TB:] *= TS_SCALE
        emb[NOSPEECH] *= NS_SCALE
    d = str(tmp_path_factory.mktemp("whisper_longform"))
    hf.save_pretrained(d)
    with open(os.path.join(d, "generation_config.json"), "w") as f:
        json.dump(GEN, f)
    model, params = from_pretrained(d)
    return hf, model, params, GenerationSettings.from_pretrained(d)


def _feats(n=2, frames=120, seed=10):
    return np.random.default_rng(seed).standard_normal((n, N_MELS, frames)).astype(np.float32)


def _no_speech_by_hand(model, params, window, prompt):
    """softmax of the teacher-forced logits at <|startoftranscript|>, written without models.whisper_decode."""
    logits = model.apply({"params": params}, jnp.asarray(window)[None], jnp.asarray([prompt], jnp.int32))
    return float(jax.nn.softmax(logits[0, prompt.index(SOT)].astype(jnp.float32))[NOSPEECH])


def test_matches_transformers_with_conditioning_and_no_speech_skips(models):
    hf, model, params, settings = models
    feats, lengths = _feats(), [120, 75]
    feats[1, :, 75:] = 0.0
    opts = LongFormOptions(temperatures=(0.0,), logprob_threshold=0.0, no_speech_threshold=0.0)
    first = transcribe_longform(model, params, feats, settings, num_frames=lengths, max_new_tokens=16,
                                language="en", options=opts)
    probs = sorted(w["attempts"][0]["no_speech_prob"] for r in first for w in r["windows"])
    # a threshold well between two observed values (float rounding cannot flip a decision), some on either side
    k = max(range(1, len(probs) - 2), key=lambda j: probs[j + 1] / probs[j])
    thr = float(np.sqrt(probs[k] * probs[k + 1]))
    assert probs[k + 1] > 1.5 * probs[k]
    opts = LongFormOptions(temperatures=(0.0,), logprob_threshold=0.0, no_speech_threshold=thr)
    mine = transcribe_longform(model, params, feats, settings, num_frames=lengths, max_new_tokens=16,
                               language="en", options=opts)
    wins = [w for r in mine for w in r["windows"]]
    assert any(w["skipped"] for w in wins) and not all(w["skipped"] for w in wins)
    assert any(w["prompt_length"] > 3 for w in wins)          # conditioned on previous text
    # the first window's no-speech probability, by hand
    w0 = np.zeros((N_MELS, 2 * SRC), np.float32)
    w0[:, :] = feats[0, :, :2 * SRC]
    np.testing.assert_allclose(mine[0]["windows"][0]["attempts"][0]["no_speech_prob"],
                               _no_speech_by_hand(model, params, w0, [SOT, EN, TRANSCRIBE]), rtol=1e-4)
    for i, n in enumerate(lengths):
        attn = torch.ones((1, n), dtype=torch.long)
        with torch.no_grad():
            out = hf.generate(torch.tensor(feats[i:i + 1, :, :n]), attention_mask=attn,
                              generation_config=transformers.GenerationConfig(**GEN), max_new_tokens=16,
                              language="en", return_timestamps=True, return_segments=True, temperature=(0.0,),
                              logprob_threshold=0.0, no_speech_threshold=thr, condition_on_prev_tokens=True,
                              compression_ratio_threshold=2.4)
        hf_segs = out["segments"][0]
        assert [s["tokens"] for s in mine[i]["segments"]] == [s["tokens"].tolist() for s in hf_segs]
        for a, b in zip(mine[i]["segments"], hf_segs):
            assert a["start"] == pytest.approx(float(b["start"]), abs=1e-6)
            assert a["end"] == pytest.approx(float(b["end"]), abs=1e-6)


def test_fallback_on_repetition_follows_openai_rules(models):
    """A decoder forced to repeat one token: every temperature is tried (compression ratio > 2.4 each time, by zlib
    here), the last result is kept, and its temperature (> 0.5) resets the previous-text prompt."""
    _, model, params, settings = models
    emb = params["decoder"]["embed_tokens"]
    loud = {**params, "decoder": {**params["decoder"], "embed_tokens": emb.at[10].multiply(8.0)}}
    feats = _feats(1, 70, seed=3)
    key = jax.random.PRNGKey(0)
    res = transcribe_longform(model, loud, feats, settings, key=key, max_new_tokens=60, language="en")[0]
    w = res["windows"][0]
    temps = [a["temperature"] for a in w["attempts"]]
    assert temps == [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]
    # the greedy attempt's compression ratio, independently: zlib over the token bytes (+ eos when emitted)
    o = generate(model, loud, feats[:, :, :2 * SRC], settings, max_new_tokens=60, language="en",
                 return_timestamps=True)
    toks = strip(o["sequences"], o["prompt_length"], settings)[0]
    ended = EOS in np.asarray(o["sequences"])[0, o["prompt_length"]:].tolist()
    raw = bytes(toks + ([EOS] if ended else []))
    assert toks.count(10) > len(toks) // 2
    np.testing.assert_allclose(w["attempts"][0]["compression_ratio"], len(raw) / len(zlib.compress(raw)))
    assert all(a["needs_fallback"] == (a["compression_ratio"] > 2.4 or a["avg_logprob"] < -1.0)
               for a in w["attempts"])
    if not w["skipped"]:
        assert res["segments"][0]["temperature"] == 1.0
    if len(res["windows"]) > 1:                   # the prompt was reset after a window at temperature 1.0
        assert res["windows"][1]["prompt_length"] == 3
    # openai's text rule through text_fn
    text_fn = lambda t: "".join(chr(97 + x % 26) for x in t if x < TB)  # noqa: E731
    r2 = transcribe_longform(model, loud, feats, settings, key=key, max_new_tokens=60, language="en",
                             text_fn=text_fn, options=LongFormOptions(temperatures=(0.0,)))[0]
    text = text_fn(toks).encode()
    np.testing.assert_allclose(r2["windows"][0]["attempts"][0]["compression_ratio"],
                               len(text) / len(zlib.compress(text)))


def test_sampling_needs_a_key_and_is_reproducible_and_beam(models):
    _, model, params, settings = models
    feats = _feats(2, 60, seed=5)
    opts = LongFormOptions(temperatures=(0.6,), best_of=3, compression_ratio_threshold=None,
                           logprob_threshold=None, no_speech_threshold=None)
    with pytest.raises(ValueError, match="PRNG key"):
        transcribe_longform(model, params, feats, settings, options=opts, language="en")
    a = transcribe_longform(model, params, feats, settings, options=opts, key=jax.random.PRNGKey(1),
                            max_new_tokens=12, language="en")
    b = transcribe_longform(model, params, feats, settings, options=opts, key=jax.random.PRNGKey(1),
                            max_new_tokens=12, language="en")
    assert [r["tokens"] for r in a] == [r["tokens"] for r in b]
    assert all(np.isnan(w["attempts"][0]["no_speech_prob"]) for r in a for w in r["windows"])  # not computed
    # beam search at temperature 0: the first window equals generate's beam search (length penalty 1)
    beam = transcribe_longform(model, params, feats, settings, max_new_tokens=12, language="en",
                               options=LongFormOptions(temperatures=(0.0,), num_beams=2, no_speech_threshold=None,
                                                       condition_on_previous_text=False))
    enc_in = feats[:, :, :2 * SRC]
    o = generate(model, params, enc_in, settings, max_new_tokens=12, language="en", return_timestamps=True,
                 num_beams=2, length_penalty=1.0)
    ref = strip(o["sequences"], o["prompt_length"], settings)
    for i in range(2):
        n = sum(len(s["tokens"]) for s in beam[i]["segments"] if s["start"] < 2 * SRC * 0.01)
        assert beam[i]["tokens"][:n] == ref[i][:n]
        assert beam[i]["windows"][0]["attempts"][0]["avg_logprob"] == pytest.approx(
            float(o["scores"][i]), rel=1e-4)


def test_whisper_task_hooks(models):
    """WhisperTask.beam_decode (beam 1 = greedy_decode; beam 2 = generate's beam search) and transcribe_segments
    (= transcribe_longform with the task's settings)."""
    _, model, params, _ = models
    task = WhisperTask(model=model, prompt=(SOT, EN, TRANSCRIBE, NOTS), eos_id=EOS, no_timestamps_id=NOTS,
                       suppress_tokens=(3, 7, NOSPEECH, PREV), begin_suppress_tokens=(5, EOS), prev_sot_id=PREV,
                       max_initial_timestamp_index=4, max_decode_tokens=12)
    feats = _feats(2, 2 * SRC, seed=7)
    batch = {"features": jnp.swapaxes(jnp.asarray(feats), 1, 2), "feature_paddings": jnp.zeros((2, 2 * SRC))}
    greedy_ids, greedy_len = task.greedy_decode(params, {}, batch)
    one = task.beam_decode(params, {}, batch, SearchOptions(beam_size=1))
    for i in range(2):
        n = int(greedy_len[i])
        assert np.asarray(one["ids"][i, 0, :n]).tolist() == np.asarray(greedy_ids[i, :n]).tolist()
        assert int(one["lengths"][i, 0]) == n
    two = jax.jit(task.beam_decode, static_argnums=3)(params, {}, batch, SearchOptions(beam_size=2,
                                                                                       length_penalty=1.0))
    settings = task.generation_settings()
    o = generate(model, params, feats, settings, max_new_tokens=12, num_beams=2)
    ref = strip(o["sequences"], o["prompt_length"], settings)
    for i in range(2):
        assert np.asarray(two["ids"][i, 0, :int(two["lengths"][i, 0])]).tolist() == ref[i]
    segs = task.transcribe_segments(params, {}, batch, LongFormOptions(temperatures=(0.0,)))
    direct = transcribe_longform(model, params, feats, settings, max_new_tokens=12,
                                 options=LongFormOptions(temperatures=(0.0,)))
    assert [r["tokens"] for r in segs] == [r["tokens"] for r in direct] == task.transcribe(
        params, {}, batch, LongFormOptions(temperatures=(0.0,)))
    assert all("start" in s and "end" in s for r in segs for s in r["segments"])


def test_openai_defaults_match_transformers_when_no_window_falls_back(models):
    """openai-whisper's defaults (temperatures 0.0 .. 1.0, thresholds 2.4 / -1.0 / 0.6, conditioning) against
    transformers with the same arguments, on audio where every window passes at temperature 0."""
    hf, model, params, settings = models
    feats, n = _feats(1, 110, seed=12), 110
    mine = transcribe_longform(model, params, feats, settings, key=jax.random.PRNGKey(0), max_new_tokens=16,
                               language="en")[0]
    assert all(len(w["attempts"]) == 1 and not w["skipped"] for w in mine["windows"]) and len(mine["windows"]) > 2
    with torch.no_grad():
        out = hf.generate(torch.tensor(feats), attention_mask=torch.ones((1, n), dtype=torch.long),
                          generation_config=transformers.GenerationConfig(**GEN), max_new_tokens=16, language="en",
                          return_timestamps=True, return_segments=True, temperature=(0.0, 0.2, 0.4, 0.6, 0.8, 1.0),
                          compression_ratio_threshold=2.4, logprob_threshold=-1.0, no_speech_threshold=0.6,
                          condition_on_prev_tokens=True)
    assert [s["tokens"] for s in mine["segments"]] == [s["tokens"].tolist() for s in out["segments"][0]]


def test_longform_beam_search_matches_transformers_and_nbest(models):
    """Beam search in every 30 s window (openai-whisper's beam_size, transformers' long-form num_beams) token for
    token against transformers; the n-best of a window against transformers' generic beam search with
    num_return_sequences (sequences and length-penalised scores); WhisperTask.beam_transcribe's n-best."""
    hf, model, params, settings = models
    feats, n = _feats(1, 70, seed=12), 70
    opts = LongFormOptions(temperatures=(0.0,), num_beams=3, compression_ratio_threshold=None,
                           logprob_threshold=None, no_speech_threshold=None)
    mine = transcribe_longform(model, params, feats, settings, max_new_tokens=16, language="en", options=opts)[0]
    assert len(mine["windows"]) >= 2
    with torch.no_grad():
        out = hf.generate(torch.tensor(feats), attention_mask=torch.ones((1, n), dtype=torch.long),
                          generation_config=transformers.GenerationConfig(**GEN), max_new_tokens=16, language="en",
                          return_timestamps=True, return_segments=True, temperature=(0.0,), num_beams=3,
                          condition_on_prev_tokens=True)
    assert [s["tokens"] for s in mine["segments"]] == [s["tokens"].tolist() for s in out["segments"][0]]
    # n-best of one window
    f2 = _feats(2, 2 * SRC, seed=7)
    enc = encode(model, params, jnp.asarray(f2))
    prompt = build_prompts(model, params, enc, settings, "en", None, False)
    seqs, scores = beam_nbest_from_encoder(model, params, enc, prompt,
                                           decode_options(settings, max_new_tokens=12, num_beams=3), 3)
    gc = transformers.GenerationConfig(num_beams=3, num_return_sequences=3, max_new_tokens=12, eos_token_id=EOS,
                                       pad_token_id=EOS, decoder_start_token_id=SOT, length_penalty=1.0,
                                       suppress_tokens=list(settings.suppress_tokens), do_sample=False,
                                       begin_suppress_tokens=list(settings.begin_suppress_tokens),
                                       output_scores=True, return_dict_in_generate=True)
    with torch.no_grad():       # the generic beam search (Whisper's generate returns one sequence per input)
        ref = transformers.GenerationMixin.generate(hf, input_features=torch.tensor(f2), generation_config=gc,
                                                    decoder_input_ids=torch.tensor(np.asarray(prompt)))
    w = ref.sequences.shape[1]
    assert np.asarray(seqs)[:, :, :w].reshape(6, w).tolist() == ref.sequences.tolist()
    np.testing.assert_allclose(np.asarray(scores).reshape(-1), ref.sequences_scores.numpy(), rtol=1e-4)
    # the task's long-form beam search of one-window files: the n-best of the window, the best the transcript
    task = WhisperTask(model=model, prompt=(SOT, EN, TRANSCRIBE, NOTS), eos_id=EOS, no_timestamps_id=NOTS,
                       suppress_tokens=(3, 7, NOSPEECH, PREV), begin_suppress_tokens=(5, EOS), prev_sot_id=PREV,
                       max_initial_timestamp_index=4, max_decode_tokens=12,
                       longform=LongFormOptions(temperatures=(0.0,), no_speech_threshold=None))    # no fallback
    batch = {"features": jnp.swapaxes(jnp.asarray(f2), 1, 2), "feature_paddings": jnp.zeros((2, 2 * SRC))}
    lists = task.beam_transcribe(params, {}, batch, SearchOptions(beam_size=3, nbest=3))
    one = task.transcribe(params, {}, batch, dataclasses.replace(task.longform, num_beams=3))
    for hyps, best in zip(lists, one):
        assert 1 < len(hyps) <= 3 and hyps[0][0] == best
        assert [s for _, s in hyps] == sorted([s for _, s in hyps], reverse=True)
