"""Training core: non-finite updates are skipped, gradient accumulation, schedules, weight-decay mask, greedy CTC
decoding, WER/CER, and a tiny Conformer-CTC that learns (fp32 and bf16)."""
import dataclasses
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jasr import losses, optim
from jasr.decoding import ctc_greedy_ids
from jasr.metrics import cer, wer, word_errors
from jasr.steps import create_train_state, eval_step, step_key, train_step
from jasr.tasks import Task, build_task
from jasr.tasks.conformer import ConformerCTCTask
from models.conformer import ConformerConfig, ConformerCTC

# ------------------------------------------------------------------------------------------------ optimiser

def test_cosine_and_noam_schedules():
    s = optim.make_schedule("cosine", lr=1e-3, warmup_steps=10, total_steps=110, final_lr_ratio=0.1)
    assert float(s(0)) == 0.0 and float(s(5)) == pytest.approx(5e-4)
    assert float(s(10)) == pytest.approx(1e-3) and float(s(60)) == pytest.approx(5.5e-4, rel=1e-3)
    assert float(s(110)) == pytest.approx(1e-4)
    n = optim.make_schedule("noam", lr=2e-3, warmup_steps=100, total_steps=1000)
    assert float(n(50)) == pytest.approx(1e-3) and float(n(100)) == pytest.approx(2e-3)
    assert float(n(400)) == pytest.approx(1e-3), "decays as 1/sqrt(step) after warmup"
    c = optim.make_schedule("constant", lr=1e-3, warmup_steps=4, total_steps=10)
    assert float(c(2)) == pytest.approx(5e-4) and float(c(9)) == pytest.approx(1e-3)
    with pytest.raises(ValueError, match="schedule"):
        optim.make_schedule("linear", lr=1e-3, warmup_steps=1, total_steps=2)


def _params():
    k1, k2 = jax.random.split(jax.random.PRNGKey(0))
    return {"kernel": jax.random.normal(k1, (3, 4)), "bias": jax.random.normal(k2, (4,))}


def test_adamw_betas_decay_mask_and_clipping():
    p = _params()
    zero = jax.tree.map(jnp.zeros_like, p)
    tx = optim.make_optimizer(schedule=optax.constant_schedule(0.1), weight_decay=0.01, clip_norm=None)
    upd, _ = tx.update(zero, tx.init(p), p)
    np.testing.assert_allclose(upd["kernel"], -0.1 * 0.01 * p["kernel"], rtol=1e-6)   # decoupled weight decay
    np.testing.assert_array_equal(upd["bias"], 0.0)                                    # no decay on vectors
    big = jax.tree.map(lambda x: 1e6 * jnp.ones_like(x), p)
    clipped = optim.make_optimizer(schedule=optax.constant_schedule(0.1), weight_decay=0.0, clip_norm=1.0)
    ref = optax.adamw(0.1, b1=0.9, b2=0.98, weight_decay=0.0)
    g = jax.tree.map(lambda x: x / optax.tree.norm(big), big)
    a, _ = clipped.update(big, clipped.init(p), p)
    b, _ = ref.update(g, ref.init(p), p)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_allclose(x, y, rtol=1e-5)


def test_gradient_accumulation_equals_mean_gradient():
    p = _params()
    g1 = jax.tree.map(lambda x: jnp.full_like(x, 0.3), p)
    g2 = jax.tree.map(lambda x: jnp.full_like(x, -0.1) + x, p)
    sched = optax.constant_schedule(0.05)
    acc = optim.make_optimizer(schedule=sched, grad_accum=2, clip_norm=None)
    one = optim.make_optimizer(schedule=sched, grad_accum=1, clip_norm=None)
    s = acc.init(p)
    u1, s = acc.update(g1, s, p)
    assert all(float(jnp.abs(x).max()) == 0.0 for x in jax.tree.leaves(u1)), "no update mid-accumulation"
    u2, s = acc.update(g2, s, p)
    ref, _ = one.update(jax.tree.map(lambda a, b: (a + b) / 2, g1, g2), one.init(p), p)
    for x, y in zip(jax.tree.leaves(u2), jax.tree.leaves(ref)):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-8)


# ------------------------------------------------------------------------------------------------ decoding, metrics

def test_greedy_ctc_decode():
    seqs = [[1, 1, 0, 1, 2, 2, 3], [2, 0, 2, 2, 3, 3, 3]]
    logits = np.full((2, 7, 4), -5.0, np.float32)
    for b, s in enumerate(seqs):
        logits[b, np.arange(7), s] = 5.0
    pads = np.zeros((2, 7), np.float32)
    pads[1, 4:] = 1.0
    assert ctc_greedy_ids(logits, pads) == [[1, 1, 2, 3], [2, 2]]


def test_wer_cer():
    assert wer(["ONE TWO THREE", "FOUR"], ["ONE TOO THREE", "FOUR FIVE"]) == pytest.approx(2 / 4)
    assert cer(["AB"], ["AC"]) == pytest.approx(0.5)
    assert wer(["ONE TWO"], [""]) == 1.0
    e = word_errors(["A B C"], ["A C D E"])
    assert (e.errors, e.ref_tokens) == (3, 3)
    with pytest.raises(ValueError, match="reference 1 is empty"):
        wer(["A", " "], ["A", "B"])


# ------------------------------------------------------------------------------------------------ train_step

def _task(dtype="float32"):
    cfg = ConformerConfig.tiny(vocab_size=6, input_dim=16, num_layers=1, dtype=dtype, dropout_rate=0.0,
                               attention_dropout_rate=0.0, ff_dropout_rate=0.0)
    return ConformerCTCTask(model=ConformerCTC(cfg))


def _batch():
    rng = np.random.default_rng(0)
    b, t = 4, 48
    labels = np.array([[1, 2, 3, 0], [4, 4, 0, 0], [5, 1, 2, 3], [2, 0, 0, 0]], np.int32)
    feats = rng.standard_normal((b, t, 16)).astype(np.float32)
    for i, row in enumerate(labels):   # make the labels recoverable from the features
        for j, lab in enumerate(row[row > 0]):
            feats[i, 8 + 10 * j: 14 + 10 * j, lab] += 4.0
    pads = np.zeros((b, t), np.float32)
    pads[3, 30:] = 1.0
    return {"features": feats, "feature_paddings": pads, "labels": labels,
            "label_paddings": (labels == 0).astype(np.float32), "row_weights": np.ones((b,), np.float32)}


@pytest.fixture(scope="module")
def setup():
    task = _task()
    tx = optim.make_optimizer(schedule=optax.constant_schedule(3e-3), clip_norm=1.0)
    state = create_train_state(jax.random.PRNGKey(0), task, tx, _batch())
    step = jax.jit(functools.partial(train_step, task=task, tx=tx))
    return task, tx, state, step


def test_non_finite_update_is_skipped(setup):
    _, _, state, step = setup
    bad = _batch()
    bad["features"] = bad["features"].copy()
    bad["features"][1, 3, 2] = np.nan
    new, m = step(state, bad, step_key(state))
    assert int(new.skipped) == 1 and float(m["skipped"]) == 1.0 and int(new.step) == 1
    for a, b in zip(jax.tree.leaves((state.params, state.opt_state)), jax.tree.leaves((new.params, new.opt_state))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    good, m = step(new, _batch(), step_key(new))
    assert int(good.skipped) == 1 and float(m["skipped"]) == 0.0 and np.isfinite(float(m["loss"]))
    assert any(not np.array_equal(np.asarray(a), np.asarray(b))
               for a, b in zip(jax.tree.leaves(good.params), jax.tree.leaves(new.params)))


def test_a_batch_without_rows_in_the_loss_makes_no_update(setup):
    """Every row a padding row (e.g. every file of the batch failed to load): AdamW's momentum and weight decay
    would still move the weights, so the update is skipped."""
    _, _, state, step = setup
    warm, _ = step(state, _batch(), step_key(state))        # non-zero momentum
    empty = _batch()
    empty["row_weights"] = np.zeros_like(empty["row_weights"])
    new, m = step(warm, empty, step_key(warm))
    assert float(m["skipped"]) == 1.0 and int(new.skipped) == int(warm.skipped) + 1
    for a, b in zip(jax.tree.leaves((warm.params, warm.opt_state)), jax.tree.leaves((new.params, new.opt_state))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_tiny_model_learns_and_padding_rows_do_not_count(setup):
    _, _, state, step = setup
    batch = _batch()
    losses = []
    for _ in range(40):
        state, m = step(state, batch, step_key(state))
        losses.append(float(m["loss"]))
    assert losses[-1] < 0.5 * losses[0], losses
    # a padding row (row weight 0) with garbage labels changes nothing
    padded = {k: np.concatenate([v, v[:1]]) for k, v in batch.items()}
    padded["row_weights"][-1] = 0.0
    padded["labels"][-1] = [5, 5, 5, 5]
    padded["label_paddings"][-1] = 0.0
    _, m1 = step(state, batch, jax.random.PRNGKey(1))
    _, m2 = step(state, padded, jax.random.PRNGKey(1))
    # (a counted garbage row would move the mean by O(1); the per-sequence nll is a float32
    # difference of O(10-100) log-scale sums, so a batch of another shape rounds ~1e-7 apart)
    assert float(m1["loss"]) == pytest.approx(float(m2["loss"]), rel=1e-5, abs=1e-6)


def test_bf16_mixed_precision_step():
    task = _task("bfloat16")
    tx = optim.make_optimizer(schedule=optax.constant_schedule(3e-3))
    state = create_train_state(jax.random.PRNGKey(0), task, tx, _batch())
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(state.params)), "params stay fp32"
    step = jax.jit(functools.partial(train_step, task=task, tx=tx))
    losses = []
    for _ in range(15):
        state, m = step(state, _batch(), step_key(state))
        losses.append(float(m["loss"]))
    assert all(np.isfinite(losses)) and losses[-1] < losses[0]
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(state.opt_state) if hasattr(x, "dtype")
               and jnp.issubdtype(x.dtype, jnp.floating))


# ------------------------------------------------------------------------------------------------ other configs

def _tiny_from_config(name, **model):
    import os

    from jasr.config import load_config_file, validate_config
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    cfg = load_config_file(os.path.join(root, "configs", name))
    for k, v in model.items():
        cfg.model[k] = v
    validate_config(cfg, check_paths=False)
    return cfg


def test_conformer_aed_config_trains_a_few_steps():
    import dataclasses

    from jasr.features import FeatureConfig
    cfg = _tiny_from_config("conformer_aed.py",
                            encoder=dict(d_model=32, num_layers=1, num_heads=2, ff_mult=2, conv_kernel=7,
                                         subsampling_channels=8),
                            decoder=dict(type="transformer", num_layers=1, num_heads=2, ff_dim=64))
    assert cfg.loss.type == "joint"
    cfg.data.device_features = False
    cfg.data.spec_augment = False
    task = build_task(cfg, 6, FeatureConfig(num_mel_bins=16))
    assert task.model.config.vocab_size == 7 and task.model.config.sos_token == 6, "one extra id for sos/eos"
    batch = _batch()
    tx = optim.make_optimizer(schedule=optax.constant_schedule(3e-3))
    state = create_train_state(jax.random.PRNGKey(0), task, tx, batch)
    step = jax.jit(functools.partial(train_step, task=task, tx=tx))
    losses = []
    for _ in range(5):
        state, m = step(state, batch, step_key(state))
        losses.append(float(m["loss"]))
    assert all(np.isfinite(losses)) and losses[-1] < losses[0], losses
    for t in (task, dataclasses.replace(task, joint=False)):   # CTC-head and attention greedy decoding
        out = jax.jit(functools.partial(eval_step, task=t))(state, batch)
        assert out["ids"].shape[0] == 4 and out["lengths"].shape == (4,) and np.isfinite(float(out["loss_sum"]))


# ------------------------------------------------------------------------------------------------ NaN storm

@jax.custom_vjp
def _poison_grad(x, flag):
    return x


def _poison_fwd(x, flag):
    return x, flag


def _poison_bwd(flag, g):
    return jnp.where(flag > 0, jnp.inf, 1.0) * g, jnp.zeros_like(flag)


_poison_grad.defvjp(_poison_fwd, _poison_bwd)


class _LinearCTC(nn.Module):
    vocab_size: int

    @nn.compact
    def __call__(self, features, paddings):
        return nn.Dense(self.vocab_size)(nn.tanh(nn.Dense(32)(features))), paddings


@dataclasses.dataclass(frozen=True)
class _PoisonTask(Task):
    """A small CTC model (fast to compile); batch["poison"] = 1 makes every gradient non-finite while the loss
    stays finite."""
    name = "poison_ctc"
    loss_types = ("ctc",)

    def init(self, key, batch):
        return self.model.init(key, batch["features"], batch["feature_paddings"])

    def loss(self, params, model_state, batch, key, train):
        params = jax.tree.map(lambda p: _poison_grad(p, batch["poison"]), params)
        logits, pads = self.model.apply({"params": params}, batch["features"], batch["feature_paddings"])
        total, tokens, _ = losses.weighted_ctc_loss(logits, pads, batch["labels"], batch["label_paddings"],
                                                    batch["row_weights"])
        return total, (jnp.maximum(tokens, 1.0), model_state, {})


def _storm_batches():
    """Non-finite batches: NaN in the features, inf in the features, non-finite gradients of a finite loss."""
    nan, inf, grads = _batch(), _batch(), _batch()
    nan["features"] = nan["features"].copy()
    nan["features"][1, 3, 2] = np.nan
    inf["features"] = inf["features"].copy()
    inf["features"][0, :, :] = np.inf
    grads["poison"] = np.float32(1.0)
    return [nan, inf, grads]


@pytest.mark.parametrize("grad_accum", [1, 3])
def test_nan_storm_leaves_weights_and_optimizer_untouched(grad_accum):
    """Several non-finite steps in a row (also inside a gradient-accumulation window: optax.MultiSteps' running
    sum must not take in a NaN micro-batch) change nothing but the counters; training then goes on exactly as if
    they had never happened (the model has no dropout, so the step keys do not matter)."""
    task = _PoisonTask(model=_LinearCTC(vocab_size=6))
    tx = optim.make_optimizer(schedule=optax.constant_schedule(3e-3), clip_norm=1.0, grad_accum=grad_accum)
    good = {**_batch(), "poison": np.float32(0.0)}
    state0 = create_train_state(jax.random.PRNGKey(0), task, tx, good)
    step = jax.jit(functools.partial(train_step, task=task, tx=tx))
    n_good = 2 * grad_accum           # two optimiser updates

    clean = state0
    for _ in range(n_good):
        clean, m = step(clean, good, step_key(clean))
        assert float(m["skipped"]) == 0.0

    state = state0
    storm = [{**b, "poison": b.get("poison", np.float32(0.0))} for b in _storm_batches()]
    storm_after = {0} if grad_accum == 1 else {0, grad_accum + 1}     # between updates / mid-window
    for i in range(n_good):
        state, _ = step(state, good, step_key(state))
        if i in storm_after:
            for bad in storm:
                before = state
                state, m = step(state, bad, step_key(state))
                assert float(m["skipped"]) == 1.0 and np.isnan(float(m["loss"]))
                for a, b in zip(jax.tree.leaves((before.params, before.opt_state, before.model_state)),
                                jax.tree.leaves((state.params, state.opt_state, state.model_state))):
                    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    n_bad = len(storm_after) * len(storm)
    assert int(state.skipped) == n_bad and int(state.step) == n_good + n_bad
    for a, b in zip(jax.tree.leaves((clean.params, clean.opt_state)), jax.tree.leaves((state.params, state.opt_state))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert any(not np.array_equal(np.asarray(a), np.asarray(b))
               for a, b in zip(jax.tree.leaves(clean.params), jax.tree.leaves(state0.params))), "it did train"
