"""Honest decoding (issue 23): a hypothesis' length comes from the audio and the model, never from the reference;
a file decodes to the same text with or without a transcript; a file that cannot be read counts in WER as all
deletions; Whisper decodes whole files (long-form), with max_new_tokens at the model's limit by default.

Tiny random models (a Conformer AED and a Whisper built from the repo's configs) whose output layer is biased,
decoded through jasr.training.evaluate_utterances (what decode.py runs) and the jitted eval step (dev WER)."""
import dataclasses
import functools
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import soundfile as sf

from jasr import metrics
from jasr.audio import load_audio
from jasr.config import apply_override, load_config_file, validate_config
from jasr.manifests import read_manifest
from jasr.optim import make_optimizer_from_config
from jasr.run_data import (NO_TRANSCRIPT, cut_dev_summary, dummy_batch, feature_config, label_fn, make_eval_loader,
                           with_placeholder_transcripts)
from jasr.steps import create_train_state, eval_step
from jasr.tasks import build_task
from jasr.tokenizers import CharTokenizer, load_tokenizer
from jasr.training import RunInfo, evaluate_utterances, score_results
from models.whisper_generate import generate

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LJ = os.path.join(ROOT, "..", "shared", "data", "ljspeech_sample")
IDS = ("LJ001-0002", "LJ001-0008")        # 1.9 s and 1.8 s


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Manifests (with and without transcripts) of two short LJ files, a 38.6 s file and a truncated WAV."""
    d = tmp_path_factory.mktemp("honest")
    recs = {json.loads(line)["id"]: json.loads(line) for line in open(os.path.join(LJ, "manifest.jsonl"))}
    short = [{"id": i, "audio": os.path.abspath(os.path.join(LJ, recs[i]["audio"])), "text": recs[i]["text"],
              "duration": recs[i]["duration"]} for i in IDS]
    long_audio = np.tile(load_audio(os.path.join(LJ, recs["LJ001-0001"]["audio"]), 16000), 4)
    sf.write(str(d / "long.wav"), long_audio, 16000)
    sf.write(str(d / "broken.wav"), long_audio[:16000], 16000)
    with open(d / "broken.wav", "r+b") as f:           # the header promises 1 s, the file holds half of it
        f.truncate(44 + 16000)
    out = {}
    for name, rows in (("short", short),
                       ("long", [{"id": "long", "audio": str(d / "long.wav"), "text": "A LONG FILE",
                                  "duration": len(long_audio) / 16000}]),
                       ("broken", short[:1] + [{"id": "broken", "audio": str(d / "broken.wav"),
                                                "text": "FOUR WORDS NEVER DECODED", "duration": 1.0}])):
        for text in (True, False):
            path = d / f"{name}_{'text' if text else 'audio'}.jsonl"
            with open(path, "w") as f:
                f.write("".join(json.dumps({**r, "text": r["text"] if text else ""}) + "\n" for r in rows))
            out[name, text] = with_placeholder_transcripts(read_manifest(str(path), allow_empty_text=True))
    return out


def _run(cfg, tok, edges, bias_fn):
    """A RunInfo of a randomly initialised model whose params `bias_fn` edits (no training, no workdir)."""
    validate_config(cfg, check_paths=False)
    fc = feature_config(cfg)
    task = build_task(cfg, tok.vocab_size, fc, tokenizer=tok)
    tx, _ = make_optimizer_from_config(cfg.optim, cfg.train.num_steps, task.frozen)
    shape = (1, type(task).init_length(False), 8)
    state = jax.jit(functools.partial(create_train_state, task=task, tx=tx))(
        jax.random.PRNGKey(0), batch=dummy_batch(shape, fc, False))
    return RunInfo(cfg, tok, task, state.replace(params=bias_fn(state.params)), 0, edges)


# ------------------------------------------------------------------------------------------------------------
# Conformer AED (greedy attention decoding)

def _aed_cfg():
    cfg = load_config_file(os.path.join(ROOT, "configs", "conformer_aed.py"))
    for k, v in {"data.demo": "False", "data.device_features": "False", "data.spec_augment": "False",
                 "data.max_frames": "800", "loss.type": "attention", "train.num_steps": "1",
                 "data.train_manifest": "train.jsonl"}.items():
        apply_override(cfg, k, v)
    cfg.model.encoder = dict(d_model=32, num_layers=1, num_heads=2, ff_mult=2, conv_kernel=7, subsampling=4,
                             subsampling_channels=8)
    cfg.model.decoder = dict(type="transformer", num_layers=1, num_heads=2, ff_dim=64)
    return cfg


def _edit(box, fn):
    """fn applied to a parameter, boxed (nn.LogicallyPartitioned) or not."""
    return box.replace_boxed(fn(box.value)) if hasattr(box, "replace_boxed") else fn(box)


def _aed_bias(token):
    """Output bias: +30 on `token` (the decoder emits only it), or -1e4 on eos when `token` is None."""
    def edit(params):
        params = jax.tree.map(lambda x: x, params)
        out = params["decoder"]["output"]
        out["bias"] = _edit(out["bias"], lambda b: b.at[-1].set(-1e4) if token is None else b.at[token].add(30.0))
        return params
    return edit


@pytest.fixture(scope="module")
def char_tok(files):
    return CharTokenizer.from_texts(u.text for u in files["short", True])


def test_aed_transcript_free_file_decodes_to_the_same_text(files, char_tok):
    run = _run(_aed_cfg(), char_tok, [2.0], _aed_bias(None))      # random tokens, never eos
    with_text = {r["id"]: r["hyp"] for r in evaluate_utterances(run, files["short", True])[1]}
    without = {r["id"]: r["hyp"] for r in evaluate_utterances(run, files["short", False])[1]}
    assert with_text == without
    assert all(len(h) > 9 for h in without.values()), without      # not the 9 tokens a placeholder label allowed


def test_aed_hypothesis_runs_to_the_encoder_frames_not_the_reference(files, char_tok):
    a = char_tok.encode("A")[0]
    run = _run(_aed_cfg(), char_tok, [2.0], _aed_bias(a))
    utts = files["short", True]
    loader = make_eval_loader(run.config, utts, char_tok, edges=[2.0], task=run.task)
    (_, frames, label_bucket), = loader.bucket_shapes
    limit = run.task.max_tokens(frames)
    assert limit == run.task.encoder_config().output_length(frames) > label_bucket + 8
    m, results = evaluate_utterances(run, utts)
    assert [r["hyp"] for r in results] == ["A" * limit] * 2
    # config train.max_decode_tokens caps it (a setting, not the reference)
    apply_override(run.config, "train.max_decode_tokens", "5")
    capped = dataclasses.replace(run, task=build_task(run.config, char_tok.vocab_size, feature_config(run.config),
                                                      tokenizer=char_tok))
    assert [r["hyp"] for r in evaluate_utterances(capped, utts)[1]] == ["AAAAA"] * 2


def test_an_unreadable_file_counts_as_all_deletions(files, char_tok):
    run = _run(_aed_cfg(), char_tok, [2.0], _aed_bias(None))
    m, results = evaluate_utterances(run, files["broken", False])
    assert [r["id"] for r in results] == ["LJ001-0002", "broken"]         # every input has a result line
    assert "error" in results[1] and "hyp" not in results[1] and m["failed"] == 1 and m["utterances"] == 1
    assert "wer" not in m and m["scored"] == 0
    # the readable file's reference is its own hypothesis (0 errors); the unreadable one's 4 words are deletions
    hyp = results[0]["hyp"]
    good, broken = files["broken", True]
    m, results = evaluate_utterances(run, [dataclasses.replace(good, text=hyp), broken])
    assert results[0]["hyp"] == hyp and results[1]["ref"] == "FOUR WORDS NEVER DECODED" and "error" in results[1]
    assert m["scored"] == 2 and m["failed"] == 1
    assert m["wer"] == pytest.approx(4 / (len(hyp.split()) + 4))
    assert m["cer"] == pytest.approx(metrics.cer([hyp, broken.text], [hyp, ""])) and m["cer"] > 0
    assert score_results([{"id": "x", "ref": "A B", "error": "unreadable"}]) == {"wer": 1.0, "cer": 1.0, "scored": 1}


# ------------------------------------------------------------------------------------------------------------
# Whisper (dev greedy decoding in 30 s windows; decode.py long-form)

WHISPER_TINY = dict(vocab_size=51865, num_mel_bins=80, d_model=32, encoder_layers=1, encoder_attention_heads=4,
                    encoder_ffn_dim=64, decoder_layers=1, decoder_attention_heads=4, decoder_ffn_dim=64,
                    max_source_positions=1500, max_target_positions=64)


def _whisper_cfg():
    cfg = load_config_file(os.path.join(ROOT, "configs", "whisper_finetune.py"))
    for k, v in {"train.init_from": "", "data.max_frames": "6400", "train.num_steps": "1"}.items():
        apply_override(cfg, k, v)
    with cfg.model.unlocked():
        for k, v in WHISPER_TINY.items():
            cfg.model[k] = v
    return cfg


def _whisper_bias(token):
    """The decoder's final layer norm outputs one constant vector v and `token`'s embedding is 50 v: every step's
    argmax is `token` wherever the logits processors allow it."""
    def edit(params):
        params = jax.tree.map(lambda x: x, params)
        dec = params["decoder"]
        v = jax.random.normal(jax.random.PRNGKey(1), (WHISPER_TINY["d_model"],))
        v = v / jnp.linalg.norm(v)
        ln = dec["layer_norm"]
        ln["scale"], ln["bias"] = _edit(ln["scale"], jnp.zeros_like), _edit(ln["bias"], lambda b: v)
        dec["embed_tokens"] = _edit(dec["embed_tokens"], lambda e: e.at[token].set(50.0 * v))
        return params
    return edit


@pytest.fixture(scope="module")
def whisper_tok():
    return load_tokenizer("whisper:multilingual")


@pytest.fixture(scope="module")
def whisper_run(whisper_tok):
    text_token = whisper_tok.encode(" a")[0]
    return _run(_whisper_cfg(), whisper_tok, [30.0], _whisper_bias(text_token)), text_token


def test_whisper_dev_decoding_runs_to_the_model_limit_whatever_the_labels(whisper_run, whisper_tok):
    run, text_token = whisper_run
    task = run.task
    fn = jax.jit(functools.partial(eval_step, task=task))
    feats = np.random.default_rng(0).standard_normal((1, 3000, 80)).astype(np.float32) * 0.3
    outs = []
    for n in (8, 32):        # a short and a long label bucket (a transcript-free file has the short one)
        labels = np.zeros((1, n), np.int32)
        labels[0, :3] = label_fn(run.config, whisper_tok)(NO_TRANSCRIPT if n == 8 else "a b")[:3]
        batch = {"features": feats, "feature_paddings": np.zeros((1, 3000), np.float32), "labels": labels,
                 "label_paddings": (np.arange(n) >= 3).astype(np.float32)[None], "row_weights": np.ones(1, np.float32)}
        out = jax.device_get(fn(run.state, batch))
        outs.append(out["ids"][0, :int(out["lengths"][0])].tolist())
    limit = WHISPER_TINY["max_target_positions"] - len(task.prompt)
    assert outs[0] == outs[1] == [text_token] * limit


def test_whisper_generate_defaults_to_the_model_limit(whisper_run):
    run, text_token = whisper_run
    settings = run.task.generation_settings()
    feats = np.zeros((1, 80, 3000), np.float32)
    out = generate(run.task.model, run.state.params, feats, settings)
    assert out["sequences"].shape == (1, WHISPER_TINY["max_target_positions"])
    assert np.asarray(out["sequences"])[0, out["prompt_length"]:].tolist() == (
        [text_token] * (WHISPER_TINY["max_target_positions"] - out["prompt_length"]))


def test_whisper_decodes_the_whole_file_the_same_with_or_without_a_transcript(whisper_run, whisper_tok, files):
    run, text_token = whisper_run
    per_window = WHISPER_TINY["max_target_positions"] - 3 - 1    # prompt without <|notimestamps|>, 1 timestamp
    text = " ".join(whisper_tok.decode([text_token] * per_window).split())
    for name, windows in (("short", 1), ("long", 2)):          # 1.9 s / 1.8 s; 38.6 s: seeks past 30 s
        with_text = evaluate_utterances(run, files[name, True])[1]
        without = evaluate_utterances(run, files[name, False])[1]
        assert [r["hyp"] for r in with_text] == [r["hyp"] for r in without]
        assert all(r["hyp"] == " ".join([text] * windows) for r in without), (name, without[0]["hyp"][:80])


def test_dev_evaluation_names_whisper_utterances_longer_than_its_window(files):
    utts = files["long", True] + files["short", True]
    line = cut_dev_summary("dev", utts, feature_config(_whisper_cfg()))
    assert line.startswith("1 of 3 dev utterances are longer than the model's 30 s window, e.g. long (38.6 s)")
    assert cut_dev_summary("dev", files["short", True], feature_config(_whisper_cfg())) is None
    assert cut_dev_summary("dev", utts, feature_config(_aed_cfg())) is None      # no fixed window
