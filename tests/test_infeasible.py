"""Labels that cannot align with the model's frames: the loader's up-front check uses the model's real output
length and CTC's repeats; a row that still reaches the loss is left out of it (and named), not the whole batch."""
import functools
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch

from jasr import optim
from jasr.config import apply_override, load_config_file
from jasr.data import BatchConfig, make_loader
from jasr.features import FeatureConfig, num_frames
from jasr.logs import read_jsonl
from jasr.losses import weighted_ctc_loss
from jasr.manifests import Utterance
from jasr.steps import create_train_state, step_key, train_step
from jasr.tasks.conformer import ConformerCTCTask
from jasr.tokenizers import CharTokenizer
from models.conformer import ConformerConfig, ConformerCTC

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FSDD = os.path.join(ROOT, "..", "shared", "data", "fsdd")


def _fsdd_rows():
    with open(os.path.join(FSDD, "manifest.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    return {r["id"]: dict(r, path=os.path.abspath(os.path.join(FSDD, r["audio"]))) for r in rows}


ROWS = _fsdd_rows()


def _torch_ctc(logits, frames, labels, lengths):
    lp = torch.log_softmax(torch.from_numpy(np.asarray(logits, np.float64)), -1).transpose(0, 1)
    return torch.nn.functional.ctc_loss(lp, torch.from_numpy(labels), torch.tensor(frames), torch.tensor(lengths),
                                        reduction="none").numpy()


def test_weighted_ctc_leaves_out_infeasible_rows_only():
    rng = np.random.default_rng(0)
    b, t, k = 4, 6, 5
    logits = rng.standard_normal((b, t, k)).astype(np.float32) * 3
    labels = np.array([[1, 2, 0, 0], [3, 3, 3, 3], [2, 4, 0, 0], [1, 1, 1, 1]], np.int32)
    lengths = np.array([2, 4, 2, 4])
    lpad = (np.arange(4)[None] >= lengths[:, None]).astype(np.float32)
    fpad = np.zeros((b, t), np.float32)
    weights = np.array([1.0, 1.0, 1.0, 0.0], np.float32)   # row 3: a padding row with an infeasible label
    # rows 1 and 3: 4 equal tokens need 4 + 3 = 7 frames > 6
    total, tokens, infeasible = jax.jit(weighted_ctc_loss)(logits, fpad, labels, lpad, weights)
    ref = _torch_ctc(logits, [t] * b, labels, lengths)
    assert np.isinf(ref[1]) and np.isinf(ref[3])
    np.testing.assert_allclose(float(total), ref[0] + ref[2], rtol=1e-5)
    assert float(tokens) == 4.0
    np.testing.assert_array_equal(np.asarray(infeasible), [0, 1, 0, 0])   # the padding row is not flagged
    grad = jax.grad(lambda x: weighted_ctc_loss(x, fpad, labels, lpad, weights)[0])(logits)
    assert np.isfinite(np.asarray(grad)).all() and not np.asarray(grad)[1].any() and not np.asarray(grad)[3].any()


def test_loader_fit_uses_the_models_output_frames_and_ctc_repeats():
    """A 0.47 s utterance at 8 kHz: 45 fbank frames; 45 // 4 = 11, but the 4x conv2d front end gives
    ((45 - 1) // 2 - 1) // 2 = 10 frames, and a CTC label needs one more frame per repeated token."""
    row = ROWS["1_george_10"]
    fc = FeatureConfig(kind="fbank", sample_rate=row["sample_rate"], num_mel_bins=16)
    enc = ConformerConfig.tiny(0, input_dim=16)
    def exact(samples):
        return enc.output_length(num_frames(samples, fc))
    samples = int(row["duration"] * row["sample_rate"]) - 40     # the loader's lower bound of the samples
    limit, estimate = exact(samples), num_frames(samples, fc) // 4
    assert limit < estimate, "the estimate must be looser for this test to mean anything"

    def alternating(n):
        return ("ab" * n)[:n]
    texts = {"fits": alternating(limit),                       # `limit` tokens, no repeats
             "estimate": alternating(estimate),                # fits frames // 4 only
             "repeats": "a" + alternating(limit - 1)}          # `limit` tokens, one repeat ("aa")
    utts = [Utterance(id=k, audio_path=row["path"], text=v, duration=row["duration"],
                      sample_rate=row["sample_rate"]) for k, v in texts.items()]
    tok = CharTokenizer.from_texts(texts.values())

    def kept(ctc_alignment, output_frames):
        bc = BatchConfig(max_frames=4000, num_buckets=1, subsampling=4, ctc_alignment=ctc_alignment,
                         drop_unfit=True)
        loader = make_loader(utts, tok, fc, bc, shuffle=False, output_frames=output_frames)
        return sorted(set(texts) - set(loader.dropped))
    assert kept(False, None) == ["estimate", "fits", "repeats"]           # the old check: frames // 4 tokens
    assert kept(False, exact) == ["fits", "repeats"]
    assert kept(True, exact) == ["fits"]
    with pytest.raises(ValueError, match="repeats"):
        make_loader(utts, tok, fc, BatchConfig(max_frames=4000, num_buckets=1, subsampling=4, ctc_alignment=True),
                    shuffle=False, output_frames=exact)


def test_train_step_leaves_out_an_infeasible_row_not_the_batch():
    cfg = ConformerConfig.tiny(vocab_size=6, input_dim=16, num_layers=1, dropout_rate=0.0,
                               attention_dropout_rate=0.0, ff_dropout_rate=0.0)
    task = ConformerCTCTask(model=ConformerCTC(cfg))
    rng = np.random.default_rng(0)
    b, t = 3, 48                                          # 48 frames -> 11 model frames
    labels = np.zeros((b, 16), np.int32)
    labels[0, :3], labels[1, :2], labels[2, :] = [1, 2, 3], [4, 5], 1 + np.arange(16) % 5   # row 2: 16 > 11
    batch = {"features": rng.standard_normal((b, t, 16)).astype(np.float32),
             "feature_paddings": np.zeros((b, t), np.float32), "labels": labels,
             "label_paddings": (labels == 0).astype(np.float32), "row_weights": np.ones(b, np.float32)}
    tx = optim.make_optimizer(schedule=optax.constant_schedule(1e-3))
    state = create_train_state(jax.random.PRNGKey(0), task, tx, batch)
    step = jax.jit(functools.partial(train_step, task=task, tx=tx))
    new, m = step(state, batch, step_key(state))
    assert float(m["skipped"]) == 0.0 and np.isfinite(float(m["loss"]))
    np.testing.assert_array_equal(np.asarray(m["infeasible_rows"]), [0, 0, 1])
    two = {k: v[:2] for k, v in batch.items()}
    _, m2 = step(state, two, step_key(state))
    np.testing.assert_allclose(float(m["loss"]), float(m2["loss"]), rtol=1e-5)


@pytest.mark.slow
def test_training_names_rows_left_out_of_the_loss(tmp_path, monkeypatch, capsys):
    """With the loader's fit check fooled (a model that claims 10^6 frames), an unfit utterance reaches the loss:
    the run still updates every step, names it in skipped.jsonl and on stdout, and counts it in metrics.jsonl."""
    from jasr.training import train
    monkeypatch.setattr(ConformerCTCTask, "output_frames", lambda self, samples, fc: 10 ** 6)
    real = [ROWS[f"{d}_george_{k}"] for d in range(3) for k in (5, 6)]
    unfit = dict(ROWS["6_yweweler_3"], id="unfit", text="SIX " * 10 + "SIX")      # 0.14 s, 43 tokens
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps({"id": r["id"], "audio": r["path"], "text": r["text"],
                                        "duration": r["duration"]}) + "\n" for r in real + [unfit]))
    cfg = load_config_file(os.path.join(ROOT, "configs", "fsdd.py"))
    for k, v in {"data.train_manifest": str(path), "data.dev_manifest": "", "data.speakers_dev": "()",
                 "data.max_frames": "2400", "data.num_buckets": "1", "data.speed_perturb": "()",
                 "data.gain_db": "()", "data.spec_augment": "False", "model.d_model": "32", "model.num_layers": "1",
                 "model.num_heads": "2", "model.ff_mult": "2", "model.conv_kernel": "7",
                 "model.subsampling_channels": "8", "train.num_steps": "2", "train.log_every": "1",
                 "train.eval_every": "2", "train.checkpoint_every": "2", "train.progress": "False",
                 "train.tensorboard": "False", "train.async_checkpoint": "False", "optim.warmup_steps": "0",
                 "optim.schedule": "constant"}.items():
        apply_override(cfg, k, v)
    workdir = str(tmp_path / "run")
    final = train(cfg, workdir, root=ROOT)
    assert final["step"] == 2
    recs = read_jsonl(os.path.join(workdir, "metrics.jsonl"))
    steps = [r for r in recs if r["kind"] == "train"]
    assert [r["skipped"] for r in steps] == [0.0, 0.0] and all(np.isfinite(r["loss"]) for r in steps)
    assert sum(r["infeasible_rows"] for r in steps) == 2                 # one row in each step's batch
    left_out = read_jsonl(os.path.join(workdir, "skipped.jsonl"))
    assert [(r["id"], r["action"], r["cause"]) for r in left_out] == [("unfit", "no_loss", "infeasible")]
    assert "[data] no_loss train utterance unfit" in capsys.readouterr().out
    assert [r for r in recs if r["kind"] == "data"][-1]["no_loss_utterances"] == 1
