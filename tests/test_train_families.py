"""train.py's model families beyond the Conformer: Wav2Vec2 CTC fine-tuning from a Hugging Face directory, Whisper
fine-tuning from a Hugging Face directory, Wav2Vec2 pretraining from a config preset. Each trains a tiny random
model for a few steps through jasr.training.train on real speech (shared/data), with dev evaluation, checkpoints,
resume, and checks that init_from really loaded the transformers weights (same outputs as the torch model; frozen
tensors still equal the checkpoint's after training)."""
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from jasr.config import ConfigError, apply_override, load_config_file, validate_config
from jasr.logs import read_jsonl
from jasr.tasks.wav2vec2 import normalize_audio
from jasr.training import load_run, train

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "..", "shared", "data")
UTTS = [("ljspeech_sample", "LJ001-0002"), ("ljspeech_sample", "LJ001-0008")]   # 1.9 s and 1.8 s

# 4 conv layers with the real 320x downsampling (50 frames/s): a few hundred frames per utterance
W2V_TINY = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48,
                conv_dim=(16, 16, 16, 16), conv_stride=(5, 4, 4, 4), conv_kernel=(10, 4, 4, 4),
                num_conv_pos_embeddings=8, num_conv_pos_embedding_groups=4, codevector_dim=16,
                proj_codevector_dim=12, num_codevectors_per_group=5, num_codevector_groups=2, num_negatives=4,
                hidden_dropout=0.0, activation_dropout=0.0, attention_dropout=0.0, feat_proj_dropout=0.0,
                final_dropout=0.0, layerdrop=0.0, mask_time_prob=0.05, mask_time_length=2)


def _tiny_w2v_fields(**kw):
    """The tiny architecture as jasr config model fields (for a run without init_from)."""
    return {**W2V_TINY, **kw}


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    d = tmp_path_factory.mktemp("manifest")
    lines = []
    for folder, uid in UTTS:
        with open(os.path.join(DATA, folder, "manifest.jsonl")) as f:
            rec = next(json.loads(l) for l in f if json.loads(l)["id"] == uid)
        lines.append({"id": uid, "audio": os.path.abspath(os.path.join(DATA, folder, rec["audio"])),
                      "text": rec["text"], "duration": rec["duration"], "sample_rate": rec["sample_rate"]})
    path = str(d / "train.jsonl")
    with open(path, "w") as f:
        f.write("".join(json.dumps(l) + "\n" for l in lines))
    return path


def _cfg(name, manifest, **overrides):
    cfg = load_config_file(os.path.join(ROOT, "configs", f"{name}.py"))
    base = {"data.train_manifest": manifest, "data.dev_manifest": manifest, "data.bucket_boundaries": "(2.0,)",
            "data.max_frames": "420", "train.num_steps": "6", "train.log_every": "1", "train.eval_every": "3",
            "train.checkpoint_every": "3", "train.max_eval_batches": "1", "train.progress": "False",
            "train.tensorboard": "False", "train.async_checkpoint": "False", "optim.warmup_steps": "0",
            "optim.schedule": "constant"}
    for k, v in {**base, **overrides}.items():
        apply_override(cfg, k, str(v))
    return cfg


def _train_with_resume(cfg, workdir):
    """Stops after 3 steps (checkpointed), resumes to the end; returns (train records, eval records)."""
    apply_override(cfg, "train.stop_after", "3")
    first = train(cfg, workdir, root=ROOT)
    assert first["step"] == 3
    apply_override(cfg, "train.stop_after", "0")
    final = train(cfg, workdir, root=ROOT)
    assert final["step"] == 6
    recs = read_jsonl(os.path.join(workdir, "metrics.jsonl"))
    tr = [r for r in recs if r["kind"] == "train"]
    ev = [r for r in recs if r["kind"] == "eval/dev"]
    assert [r["step"] for r in tr] == [1, 2, 3, 4, 5, 6]          # resumed at 3, no step twice
    assert [r["step"] for r in ev] == [3, 6]
    assert all(np.isfinite(r["loss"]) for r in tr) and sum(r["skipped"] for r in tr) == 0
    assert sorted(int(n) for n in os.listdir(os.path.join(workdir, "checkpoints")) if n.isdigit())[-1] == 6
    return tr, ev, final


def _np(t):
    return t.detach().numpy()


# ------------------------------------------------------------------------------------------------------------
# Wav2Vec2 CTC from a transformers directory

@pytest.fixture(scope="module")
def w2v_hf_dir(tmp_path_factory):
    torch.manual_seed(0)
    hf = transformers.Wav2Vec2ForPreTraining(transformers.Wav2Vec2Config(**W2V_TINY)).eval()
    d = str(tmp_path_factory.mktemp("w2v_hf"))
    hf.save_pretrained(d)
    return d, hf


def test_wav2vec2_ctc_finetune_from_hf(manifest, w2v_hf_dir, tmp_path):
    hf_dir, hf = w2v_hf_dir
    cfg = _cfg("wav2vec2_ctc", manifest, **{"train.init_from": hf_dir, "optim.lr": "3e-3"})
    validate_config(cfg, repo_root=ROOT)
    workdir = str(tmp_path / "run")
    tr, ev, final = _train_with_resume(cfg, workdir)
    assert tr[-1]["loss"] < tr[0]["loss"]                          # CTC learns the repeated batch
    assert all(0.0 <= r["wer"] for r in ev) and all(r["utterances"] == 2 for r in ev)
    assert "dev_wer" in final

    run = load_run(workdir, checkpoint="latest", root=ROOT)
    task, p = run.task, run.state.params
    params0 = task.load_pretrained(hf_dir, jax.random.PRNGKey(0))
    # the frozen feature encoder is still exactly the checkpoint's; the transformer layers were trained
    flat0 = {jax.tree_util.keystr(k): np.asarray(v) for k, v in jax.tree_util.tree_flatten_with_path(params0)[0]}
    flat = {jax.tree_util.keystr(k): np.asarray(v) for k, v in jax.tree_util.tree_flatten_with_path(p)[0]}
    assert flat.keys() == flat0.keys()
    fe = [k for k in flat if "feature_extractor" in k]
    enc = [k for k in flat if "'encoder'" in k]
    assert fe and all(np.array_equal(flat[k], flat0[k]) for k in fe)
    assert enc and not all(np.allclose(flat[k], flat0[k]) for k in enc)
    assert p["lm_head"]["kernel"].shape[-1] == run.tokenizer.vocab_size

    # init_from at step 0: the encoder's output equals transformers' on real audio (the head is new)
    from jasr.audio import load_audio
    audio = load_audio(json.loads(open(manifest).readline())["audio"], 16000)[None].astype(np.float32)
    x = normalize_audio(jnp.asarray(audio), jnp.zeros_like(jnp.asarray(audio)))
    ours = task.model.apply({"params": params0}, x, deterministic=True).last_hidden_state
    with torch.no_grad():
        ref = hf.wav2vec2(torch.from_numpy(np.array(x))).last_hidden_state
    np.testing.assert_allclose(np.asarray(ours), _np(ref), atol=2e-4, rtol=1e-3)


# ------------------------------------------------------------------------------------------------------------
# Whisper from a transformers directory (the real multilingual tokenizer, a tiny random network)

@pytest.fixture(scope="module")
def whisper_hf_dir(tmp_path_factory):
    torch.manual_seed(0)
    c = transformers.WhisperConfig(vocab_size=51865, num_mel_bins=80, d_model=32, encoder_layers=1,
                                   encoder_attention_heads=4, encoder_ffn_dim=64, decoder_layers=2,
                                   decoder_attention_heads=4, decoder_ffn_dim=64, max_source_positions=1500,
                                   max_target_positions=64, pad_token_id=50257, bos_token_id=50257,
                                   eos_token_id=50257, decoder_start_token_id=50258, suppress_tokens=None,
                                   begin_suppress_tokens=None)
    hf = transformers.WhisperForConditionalGeneration(c).eval()
    with torch.no_grad():   # non-sinusoid positions: the frozen tensor must come from the checkpoint
        hf.model.encoder.embed_positions.weight.copy_(0.1 * torch.randn(1500, 32))
    d = str(tmp_path_factory.mktemp("whisper_hf"))
    hf.save_pretrained(d)
    with open(os.path.join(d, "generation_config.json"), "w") as f:
        json.dump({"decoder_start_token_id": 50258, "eos_token_id": 50257, "pad_token_id": 50257,
                   "suppress_tokens": [1, 2], "begin_suppress_tokens": [220, 50257]}, f)
    return d, hf


def test_whisper_finetune_from_hf(manifest, whisper_hf_dir, tmp_path):
    hf_dir, hf = whisper_hf_dir
    cfg = _cfg("whisper_finetune", manifest, **{"train.init_from": hf_dir, "optim.lr": "3e-3",
                                                 "data.max_frames": "6000", "data.bucket_boundaries": "(30.0,)",
                                                 "data.label_pad_multiple": "8", "train.max_decode_tokens": "12"})
    validate_config(cfg, repo_root=ROOT)
    workdir = str(tmp_path / "run")
    tr, ev, final = _train_with_resume(cfg, workdir)
    assert tr[-1]["loss"] < tr[0]["loss"]
    assert all(r["utterances"] == 2 and r["wer"] >= 0.0 for r in ev) and "dev_wer" in final

    run = load_run(workdir, checkpoint="latest", root=ROOT)
    p = run.state.params
    np.testing.assert_array_equal(np.asarray(p["encoder"]["embed_positions"]),
                                  _np(hf.model.encoder.embed_positions.weight))     # loaded, then frozen
    assert not np.allclose(np.asarray(p["decoder"]["embed_positions"]), _np(hf.model.decoder.embed_positions.weight))
    task = run.task
    assert task.prompt == (50258, 50259, 50359, 50363) and task.eos_id == 50257

    # step-0 weights: the teacher-forced logits equal transformers' on the same log-mel and prompt
    params0 = task.load_pretrained(hf_dir, jax.random.PRNGKey(0))
    rng = np.random.default_rng(0)
    feats = rng.standard_normal((1, 80, 3000)).astype(np.float32) * 0.5
    ids = np.array([list(task.prompt) + [440, 2739]], np.int32)
    ours = task.model.apply({"params": params0}, feats, ids)
    with torch.no_grad():
        ref = hf(input_features=torch.from_numpy(feats), decoder_input_ids=torch.from_numpy(ids).long()).logits
    np.testing.assert_allclose(np.asarray(ours), _np(ref), atol=2e-4, rtol=1e-3)

    # decode.py works on the run (greedy attention decoding, WER)
    import decode
    assert decode.main(["--workdir", workdir, "--split", "dev", "--checkpoint", "latest", "--show", "1"]) == 0
    out = [json.loads(l) for l in open(os.path.join(workdir, "decode_dev.jsonl"))]
    assert len(out) == 2 and all("hyp" in r for r in out)
    # the same audio files without a transcript decode to the same text (the hypothesis never sees the reference)
    audio = [json.loads(l)["audio"] for l in open(manifest)]
    files_out = os.path.join(workdir, "files.jsonl")
    assert decode.main(["--workdir", workdir, "--checkpoint", "latest", "--output", files_out, *audio]) == 0
    assert {r["id"]: r["hyp"] for r in map(json.loads, open(files_out))} == {r["id"]: r["hyp"] for r in out}


# ------------------------------------------------------------------------------------------------------------
# Wav2Vec2 pretraining from a config preset

def test_wav2vec2_pretrain_from_preset(manifest, tmp_path):
    cfg = _cfg("wav2vec2_pretrain", manifest, **{"optim.lr": "2e-3", "loss.gumbel_temperature_decay": "0.5",
                                                  "loss.max_gumbel_temperature": "2.0",
                                                  "loss.min_gumbel_temperature": "0.4"})
    with cfg.model.unlocked():
        for k, v in _tiny_w2v_fields(mask_time_prob=0.4, mask_time_length=3).items():
            cfg.model[k] = v
    validate_config(cfg, repo_root=ROOT)
    workdir = str(tmp_path / "run")
    tr, ev, final = _train_with_resume(cfg, workdir)
    # Gumbel temperature of step s (0-based) = max(2 * 0.5**s, 0.4), also across the resume
    np.testing.assert_allclose([r["gumbel_temperature"] for r in tr], [2.0, 1.0, 0.5, 0.4, 0.4, 0.4], rtol=1e-6)
    assert all(np.isfinite(r["loss"]) and r["loss"] > 0 for r in ev)
    assert all("wer" not in r for r in ev) and "dev_wer" not in final and np.isfinite(final["dev_loss"])
    assert tr[-1]["loss"] < tr[0]["loss"]
    run = load_run(workdir, root=ROOT)          # best by dev loss
    assert run.step in (3, 6) and set(run.state.params) == {"wav2vec2", "project_hid", "quantizer", "project_q"}
    import decode
    assert decode.main(["--workdir", workdir, "--split", "dev"]) == 2          # no decoder: a clear refusal


# ------------------------------------------------------------------------------------------------------------
# config validation of the new families

@pytest.mark.parametrize("name,key,value,match", [
    ("wav2vec2_ctc", "data.feature", "fbank", "data.feature"),
    ("wav2vec2_ctc", "data.tokenizer", "whisper:multilingual", "data.tokenizer"),
    ("whisper_finetune", "data.tokenizer", "char", "data.tokenizer"),
    ("whisper_finetune", "data.normalize", "utterance", "data.normalize"),
    ("wav2vec2_pretrain", "loss.min_gumbel_temperature", "3.0", "loss.min_gumbel_temperature"),
    ("wav2vec2_pretrain", "loss.type", "ctc", "loss.type"),
    ("whisper_finetune", "train.freeze_feature_encoder", "True", "train.freeze_feature_encoder"),
])
def test_family_config_errors(name, key, value, match, manifest):
    cfg = _cfg(name, manifest)
    apply_override(cfg, key, value)
    with pytest.raises(ConfigError, match=match.replace(".", r"\.")):
        validate_config(cfg, check_paths=False)


def test_init_from_must_be_a_hf_folder(manifest, tmp_path):
    cfg = _cfg("wav2vec2_ctc", manifest, **{"train.init_from": str(tmp_path)})
    with pytest.raises(ConfigError, match="train.init_from"):
        validate_config(cfg, repo_root=ROOT)
