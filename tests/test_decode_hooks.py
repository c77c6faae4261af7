"""The CTC log-probs hook (Task.ctc_log_probs) of every family with a CTC head equals the log-softmax of its
logits; an AED run trained with the joint CTC loss exposes its CTC head (without the sos/eos id) and its attention
decoder (Task.sequence_log_probs = the incremental greedy search's own scores), so that decode.py's lexicon and
graph methods (one best, attention-decoder rescoring of the n-best) run on it, end to end on FSDD audio."""
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from decode_cli_runner import read_jsonl as _jsonl, run_decode as _decode
from jasr.config import apply_override, load_config_file
from jasr.tasks.conformer import ConformerAEDTask, ConformerCTCTask
from jasr.tasks.wav2vec2 import Wav2Vec2CTCTask
from jasr.training import load_run, train
from models.conformer import ConformerConfig, ConformerCTC
from models.wav2vec2 import Wav2Vec2Config, Wav2Vec2ForCTC

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FSDD = os.path.join(ROOT, "..", "shared", "data", "fsdd")
DIGITS = {"ZERO", "ONE", "TWO", "THREE", "FOUR", "FIVE", "SIX", "SEVEN", "EIGHT", "NINE"}



def _log_softmax(x):
    x = np.asarray(x, np.float64)
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def _feature_batch(b=2, t=64, f=8, seed=0):
    rng = np.random.default_rng(seed)
    pads = np.zeros((b, t), np.float32)
    pads[1, t // 2:] = 1.0
    return {"features": jnp.asarray(rng.standard_normal((b, t, f)), jnp.float32), "feature_paddings": jnp.asarray(pads)}


def test_conformer_ctc_hook_is_log_softmax_of_its_logits():
    cfg = ConformerConfig.tiny(7, num_layers=1, input_dim=8)
    task = ConformerCTCTask(model=ConformerCTC(cfg))
    batch = _feature_batch()
    variables = task.init(jax.random.PRNGKey(0), {**batch, "labels": jnp.zeros((2, 3), jnp.int32)})
    params, state = variables["params"], {k: v for k, v in variables.items() if k != "params"}
    lp, pads = jax.jit(task.ctc_log_probs)(params, state, batch)
    (logits, want_pads), _ = task.ctc_logits(params, state, batch)
    assert task.has_ctc_head and lp.dtype == jnp.float32 and lp.shape == logits.shape
    np.testing.assert_allclose(np.asarray(lp), _log_softmax(logits), atol=1e-5)
    np.testing.assert_array_equal(np.asarray(pads), np.asarray(want_pads))


def test_wav2vec2_ctc_hook_is_log_softmax_of_its_logits():
    cfg = Wav2Vec2Config(vocab_size=9, pad_token_id=0, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=24, conv_dim=(8, 8), conv_stride=(5, 4), conv_kernel=(10, 4),
                         num_conv_pos_embeddings=4, num_conv_pos_embedding_groups=2, mask_time_prob=0.0)
    task = Wav2Vec2CTCTask(model=Wav2Vec2ForCTC(cfg))
    rng = np.random.default_rng(1)
    pads = np.zeros((2, 1600), np.float32)
    pads[1, 900:] = 1.0
    batch = {"audio": jnp.asarray(rng.standard_normal((2, 1600)), jnp.float32), "audio_paddings": jnp.asarray(pads)}
    params = task.init(jax.random.PRNGKey(0), batch)["params"]
    lp, lp_pads = task.ctc_log_probs(params, {}, batch)
    logits, want_pads = task.ctc_logits(params, batch)
    assert task.has_ctc_head and lp.shape == logits.shape == (2, lp.shape[1], 9)
    np.testing.assert_allclose(np.asarray(lp), _log_softmax(logits), atol=1e-5)
    np.testing.assert_array_equal(np.asarray(lp_pads), np.asarray(want_pads))


# ------------------------------------------------------------------------------------------------------------
# a Conformer AED trained one step with the joint CTC/attention loss on FSDD digits

@pytest.fixture(scope="module")
def aed_run(tmp_path_factory):
    d = tmp_path_factory.mktemp("aed_joint")
    with open(os.path.join(FSDD, "manifest.jsonl")) as f:
        recs = [json.loads(line) for line in f]
    rows = [{**r, "audio": os.path.abspath(os.path.join(FSDD, r["audio"]))} for r in recs
            if r["id"].endswith("_george_0")]
    manifest = str(d / "digits.jsonl")
    with open(manifest, "w") as f:
        f.write("".join(json.dumps(r) + "\n" for r in rows[::-1]))
    cfg = load_config_file(os.path.join(ROOT, "configs", "fsdd.py"))
    m = cfg.model
    for k in list(m.keys()):
        if k != "name":
            del m[k]
    m.name = "conformer_aed"
    m.encoder = dict(d_model=32, num_layers=1, num_heads=2, ff_mult=2, conv_kernel=7, subsampling=4,
                     subsampling_channels=8)
    m.decoder = dict(type="transformer", num_layers=1, num_heads=2, ff_dim=64)
    for k, v in {"loss.type": "joint", "loss.ctc_weight": "0.5", "data.train_manifest": manifest,
                 "data.dev_manifest": manifest, "data.speakers_dev": "()", "data.speed_perturb": "()",
                 "data.gain_db": "()", "data.spec_augment": "False", "data.max_frames": "2400",
                 "data.num_buckets": "1", "optim.warmup_steps": "0", "optim.schedule": "constant",
                 "train.num_steps": "1", "train.log_every": "1", "train.eval_every": "100",
                 "train.checkpoint_every": "1", "train.progress": "False", "train.tensorboard": "False",
                 "train.async_checkpoint": "False"}.items():
        apply_override(cfg, k, v)
    workdir = str(d / "run")
    train(cfg, workdir, root=ROOT)
    return workdir, manifest, [r["id"] for r in rows[::-1]]


def test_aed_joint_hooks(aed_run):
    run = load_run(aed_run[0], root=ROOT)
    task = run.task
    assert isinstance(task, ConformerAEDTask) and task.has_ctc_head
    batch = _feature_batch(t=120, f=run.config.data.num_mel_bins)
    params, state = run.state.params, run.state.model_state
    lp, pads = jax.jit(task.ctc_log_probs)(params, state, batch)
    _, want_pads, logits = task.model.apply({"params": params, **state}, batch["features"],
                                            batch["feature_paddings"], False, method="encode")
    eos = task.model.config.eos_token
    assert eos == logits.shape[-1] - 1 == run.tokenizer.vocab_size and lp.shape[-1] == eos
    np.testing.assert_allclose(np.asarray(lp), _log_softmax(np.asarray(logits)[..., :eos]), atol=1e-5)
    np.testing.assert_array_equal(np.asarray(pads), np.asarray(want_pads))
    # greedy decoding of a joint run reads the CTC head over the tokenizer's ids only: even where the sos/eos
    # column wins every frame (as it can early in training), no id out of the tokenizer's range comes out
    loud = jax.tree_util.tree_map_with_path(
        lambda path, x: x.at[..., eos].add(1e4) if "ctc_head" in jax.tree_util.keystr(path) and "bias" in
        jax.tree_util.keystr(path) else x, params)
    assert any("ctc_head" in jax.tree_util.keystr(p) and "bias" in jax.tree_util.keystr(p)
               for p, _ in jax.tree_util.tree_flatten_with_path(params)[0])
    ids, lengths = jax.jit(task.greedy_decode)(loud, state, batch)
    ids, lengths = np.asarray(ids), np.asarray(lengths)
    assert all(0 <= t < eos for r in range(ids.shape[0]) for t in ids[r, :lengths[r]])
    assert all(run.tokenizer.decode(ids[r, :lengths[r]].tolist()) is not None for r in range(ids.shape[0]))
    # the attention decoder's teacher-forced score of whole sequences = a step-by-step scan of its KV-cache decoder
    variables = {"params": params, **state}
    seqs = [[5, 2, 7, 7, 1], [3, 1, 4]]
    enc, enc_pads, _ = task.model.apply(variables, batch["features"], batch["feature_paddings"], False,
                                        method="encode")
    step = jax.jit(lambda tok, t, st: task.model.apply(variables, tok, t, st, method="step"))
    want = []
    for row, seq in zip([1, 0], seqs):
        st = task.model.apply(variables, enc[row:row + 1], enc_pads[row:row + 1], 6, method="init_state")
        prev, total = task.model.config.sos_token, 0.0
        for t, y in enumerate(seq + [eos]):
            step_logits, st = step(jnp.array([prev]), jnp.int32(t), st)
            total += float(_log_softmax(np.asarray(step_logits))[0, y])
            prev = y
        want.append(total)
    width = max(len(q) for q in seqs)
    tok_arr = np.zeros((2, width), np.int32)
    pad_arr = np.ones((2, width), np.float32)
    for i, q in enumerate(seqs):
        tok_arr[i, :len(q)], pad_arr[i, :len(q)] = q, 0.0
    got = task.sequence_log_probs(params, state, batch, jnp.asarray(tok_arr), jnp.asarray(pad_arr), jnp.array([1, 0]))
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-4)
    # an attention-only AED has no CTC head
    attention_only = ConformerAEDTask(model=task.model.clone(config=task.model.config.replace(ctc_weight=0.0)))
    assert not attention_only.has_ctc_head and attention_only.ctc_log_probs(params, state, batch) is None




@pytest.mark.parametrize("method", ["lexicon", "graph", "attention_rescoring"])
def test_aed_joint_run_decodes_with_lexicon_and_graph(aed_run, tmp_path, capsys, method):
    workdir, manifest, ids = aed_run
    out_path = tmp_path / "out.jsonl"
    extra = (("--method", "graph", "--graph-decoding", "attention_rescoring", "--num-paths", "8", "--nbest", "4",
              "--lm-scales", "1.0,0.5", "--attention-scales", "0.5")
             if method == "attention_rescoring" else ("--method", method))
    rc, out, err = _decode(capsys, "--workdir", workdir, "--manifest", manifest, "--output", out_path, *extra)
    assert rc == 0, err
    res = _jsonl(out_path)
    assert [r["id"] for r in res] == ids
    assert all(set(r["hyp"].split()) <= DIGITS for r in res)
    if method == "attention_rescoring":
        assert "rescored by the attention decoder" in out
        assert "ngram_lm_scale_1.0_attention_scale_0.5: WER" in out and "ngram_lm_scale_0.5_attention_scale_0.5" in out
        for r in res:
            assert set(r["rescored"]) == {"ngram_lm_scale_1.0_attention_scale_0.5",
                                          "ngram_lm_scale_0.5_attention_scale_0.5"}
            assert r["rescored"]["ngram_lm_scale_1.0_attention_scale_0.5"]["text"] == r["hyp"]
            nb = r.get("nbest", [])
            assert all("attention_score" in h for h in nb) and [h["score"] for h in nb] == sorted(
                [h["score"] for h in nb], reverse=True) and (not nb or nb[0]["text"] == r["hyp"])
            # the ranking score: am + 1.0 * graph lm + 0.5 * attention
            for h in nb:
                assert h["score"] == pytest.approx(h["am_score"] + h["lm_score"] + 0.5 * h["attention_score"],
                                                   rel=1e-5, abs=1e-4)
