"""jasr.ctc_loss / fsa_ops.ctc against independent references: torch.nn.functional.ctc_loss in
float64, optax.ctc_loss, a brute-force sum over all alignments (numpy float64) and finite
differences of that brute force. Shapes are bucketed so that each jitted function compiles once."""
import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch
from hypothesis import given, settings, strategies as st

from fsa_ops.ctc import ctc_forward_backward, ctc_nll, default_method
from jasr.losses import check_ctc_inputs, ctc_loss

# ----------------------------------------------------------------------------------------------
# References
# ----------------------------------------------------------------------------------------------


def torch_ctc(logits, frame_lengths, labels, label_lengths, blank_id=0, reduction="none",
              zero_infinity=False, log_probs=False):
    """float64 torch loss (with the given zero_infinity) and the gradient of the summed loss with
    zero_infinity=True (torch's gradient of an infinite loss is NaN; ours is 0)."""
    def run(zero_inf):
        x = torch.tensor(np.asarray(logits, np.float64), requires_grad=True)
        lp = x if log_probs else torch.log_softmax(x, dim=-1)
        loss = torch.nn.functional.ctc_loss(
            lp.transpose(0, 1), torch.tensor(np.asarray(labels), dtype=torch.long),
            torch.tensor(np.asarray(frame_lengths), dtype=torch.long),
            torch.tensor(np.asarray(label_lengths), dtype=torch.long), blank=blank_id,
            reduction=reduction, zero_infinity=zero_inf)
        return x, loss
    _, loss = run(zero_infinity)
    x, safe = run(True)
    safe.sum().backward()
    return loss.detach().numpy(), x.grad.numpy()


def collapse(path, blank_id):
    out, prev = [], None
    for k in path:
        if k != prev and k != blank_id:
            out.append(k)
        prev = k
    return tuple(out)


@functools.lru_cache(maxsize=None)
def alignment_table(frames, classes, label_seq, blank_id):
    """All K^T paths [P, T] and the mask of those that collapse to label_seq."""
    paths = np.array(list(itertools.product(range(classes), repeat=frames)), np.int64).reshape(-1, frames)
    mask = np.array([collapse(p, blank_id) == label_seq for p in paths], bool)
    return paths, mask


def brute_force_nll(logits, label_seq, blank_id=0, log_probs=False):
    """-log sum over alignments of prod p(path_t | t) for one sequence [T, K] (float64)."""
    logits = np.asarray(logits, np.float64)
    frames, classes = logits.shape
    lp = logits if log_probs else logits - np.logaddexp.reduce(logits, axis=-1, keepdims=True)
    paths, mask = alignment_table(frames, classes, tuple(label_seq), blank_id)
    if not mask.any():
        return np.inf
    scores = lp[np.arange(frames)[None, :], paths[mask]].sum(axis=1)
    return -np.logaddexp.reduce(scores)


def finite_difference_grad(fn, x, eps=1e-6):
    x = np.asarray(x, np.float64)
    grad = np.zeros_like(x)
    for idx in np.ndindex(x.shape):
        up, down = x.copy(), x.copy()
        up[idx] += eps
        down[idx] -= eps
        grad[idx] = (fn(up) - fn(down)) / (2 * eps)
    return grad


def paddings_from_lengths(lengths, size):
    return (np.arange(size)[None, :] >= np.asarray(lengths)[:, None]).astype(np.float32)


# ----------------------------------------------------------------------------------------------
# Shared jitted functions (compiled once per static configuration)
# ----------------------------------------------------------------------------------------------


def loss_and_grad(logits, logit_paddings, labels, label_paddings, blank_id=0, method="log",
                  log_probs=False, zero_infinity=False, cotangent=None):
    """Per-sequence loss [B] and the gradient of sum(cotangent * loss) (default: 1 for every row)."""
    if cotangent is None:
        cotangent = np.ones(np.shape(labels)[:1], np.float32)
    return _loss_and_vjp(logits, logit_paddings, labels, label_paddings, cotangent, blank_id=blank_id,
                         method=method, log_probs=log_probs, zero_infinity=zero_infinity)


@functools.partial(jax.jit, static_argnames=("blank_id", "method", "log_probs", "zero_infinity"))
def _loss_and_vjp(logits, logit_paddings, labels, label_paddings, cotangent, blank_id=0, method="log",
                  log_probs=False, zero_infinity=False):
    def fn(x):
        return ctc_loss(x, logit_paddings, labels, label_paddings, blank_id, method=method,
                        log_probs=log_probs, zero_infinity=zero_infinity)
    loss, vjp = jax.vjp(fn, logits)
    return loss, vjp(cotangent)[0]


B, T, K, N = 4, 10, 5, 4   # the hypothesis bucket


@st.composite
def ctc_batches(draw, blank_choices=(0, K - 1), scales=(0.1, 1.0, 4.0, 30.0)):
    blank_id = draw(st.sampled_from(blank_choices))
    non_blank = [k for k in range(K) if k != blank_id]
    frame_lengths = draw(st.lists(st.integers(0, T), min_size=B, max_size=B))
    label_lengths = draw(st.lists(st.integers(0, N), min_size=B, max_size=B))
    # A small alphabet makes repeated labels (which need an extra blank frame) common.
    labels = np.array(draw(st.lists(st.lists(st.sampled_from(non_blank[:3]), min_size=N, max_size=N),
                                    min_size=B, max_size=B)), np.int32)
    scale = draw(st.sampled_from(scales))
    seed = draw(st.integers(0, 2**31 - 1))
    logits = (np.random.default_rng(seed).normal(size=(B, T, K)) * scale).astype(np.float32)
    return logits, np.array(frame_lengths), labels, np.array(label_lengths), blank_id


def _feasible(frame_lengths, labels, label_lengths):
    out = []
    for t, lab, n in zip(frame_lengths, labels, label_lengths):
        repeats = int(np.sum(lab[1:n] == lab[:n - 1])) if n > 1 else 0
        out.append(t >= n + repeats)
    return np.array(out)


# ----------------------------------------------------------------------------------------------
# Property tests against torch (float64) and optax
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["log", "auto"])
@settings(max_examples=40, deadline=None)
@given(batch=ctc_batches())
def test_matches_torch_and_optax(method, batch):
    logits, frame_lengths, labels, label_lengths, blank_id = batch
    fp, lpad = paddings_from_lengths(frame_lengths, T), paddings_from_lengths(label_lengths, N)
    loss, grad = loss_and_grad(logits, fp, labels, lpad, blank_id=blank_id, method=method)
    ref_loss, ref_grad = torch_ctc(logits, frame_lengths, labels, label_lengths, blank_id)
    loss, grad = np.asarray(loss), np.asarray(grad)
    feasible = _feasible(frame_lengths, labels, label_lengths)
    assert np.all(np.isposinf(loss[~feasible])) and np.all(np.isposinf(ref_loss[~feasible]))
    np.testing.assert_allclose(loss[feasible], ref_loss[feasible], rtol=2e-5, atol=2e-4)
    np.testing.assert_allclose(grad, ref_grad, atol=1e-4)
    assert np.all(grad[~feasible] == 0) and np.all(np.isfinite(grad))
    for b in range(B):   # padded frames get no gradient
        assert np.all(grad[b, frame_lengths[b]:] == 0)
    opt = np.asarray(optax.ctc_loss(logits, fp, labels, lpad, blank_id=blank_id))
    np.testing.assert_allclose(loss[feasible], opt[feasible], rtol=1e-4, atol=1e-3)


@settings(max_examples=15, deadline=None)
@given(ctc_batches(blank_choices=(0,), scales=(1.0, 30.0, 300.0)))
def test_auto_method_matches_torch_even_with_extreme_logits(batch):
    logits, frame_lengths, labels, label_lengths, blank_id = batch
    fp, lpad = paddings_from_lengths(frame_lengths, T), paddings_from_lengths(label_lengths, N)
    loss, grad = loss_and_grad(logits, fp, labels, lpad, blank_id=blank_id, method="auto")
    ref_loss, ref_grad = torch_ctc(logits, frame_lengths, labels, label_lengths, blank_id)
    feasible = _feasible(frame_lengths, labels, label_lengths)
    np.testing.assert_allclose(np.asarray(loss)[feasible], ref_loss[feasible], rtol=2e-5, atol=2e-3)
    assert np.all(np.isposinf(np.asarray(loss)[~feasible]))
    np.testing.assert_allclose(np.asarray(grad), ref_grad, atol=1e-3)   # logits up to ~1e3: float32 ulp 6e-5


def test_scaled_method_matches_torch_and_auto_falls_back_when_it_underflows():
    rng = np.random.default_rng(1)
    frame_lengths, label_lengths = np.array([10, 9, 7, 10]), np.array([4, 3, 2, 0])
    labels = rng.integers(1, K, size=(B, N)).astype(np.int32)
    fp, lpad = paddings_from_lengths(frame_lengths, T), paddings_from_lengths(label_lengths, N)
    moderate = rng.normal(size=(B, T, K)).astype(np.float32) * 2
    loss, grad = loss_and_grad(moderate, fp, labels, lpad, method="scaled")
    ref_loss, ref_grad = torch_ctc(moderate, frame_lengths, labels, label_lengths)
    np.testing.assert_allclose(np.asarray(loss), ref_loss, rtol=2e-5, atol=2e-4)
    np.testing.assert_allclose(np.asarray(grad), ref_grad, atol=1e-4)
    # Extreme logits: the rescaled recursion loses mass (float32 range), 'auto' notices and recomputes.
    extreme = moderate * 150
    *_, used_log = ctc_forward_backward(jnp.asarray(extreme), fp, labels, lpad, method="auto")
    _, _, scaled_z, _ = ctc_forward_backward(jnp.asarray(extreme), fp, labels, lpad, method="scaled")
    ref_loss, ref_grad = torch_ctc(extreme, frame_lengths, labels, label_lengths)
    assert bool(used_log)
    assert not np.allclose(-np.asarray(scaled_z), ref_loss, rtol=1e-4)   # the failure 'auto' guards against
    loss, grad = loss_and_grad(extreme, fp, labels, lpad, method="auto")
    np.testing.assert_allclose(np.asarray(loss), ref_loss, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(grad), ref_grad, atol=1e-3)   # logits ~1e3: float32 ulp 6e-5


def test_auto_falls_back_when_the_likely_path_needs_a_flushed_emission():
    """One label over 3 frames; at the middle frame the label is 81 nats below the frame's best
    class (flushed by the scaled recursion in both directions alike, so their totals agree) and
    the blank 79 below. The path that stays on the label (~ -82 nats) outweighs every path through
    the blank (~ -120): 'scaled' misses it, 'auto' must notice and recompute (found by hypothesis:
    the alpha/beta agreement check alone let it through)."""
    logits = np.zeros((B, T, K), np.float32)
    logits[0, 0, 1] = logits[0, 2, 1] = 40.0
    logits[0, 1, :2] = (-79.0, -81.0)
    frame_lengths, label_lengths = np.array([3, 0, 0, 0]), np.array([1, 0, 0, 0])
    labels = np.zeros((B, N), np.int32)
    labels[0, 0] = 1
    fp, lpad = paddings_from_lengths(frame_lengths, T), paddings_from_lengths(label_lengths, N)
    ref_loss, ref_grad = torch_ctc(logits, frame_lengths, labels, label_lengths)
    _, _, scaled_z, _ = ctc_forward_backward(jnp.asarray(logits), fp, labels, lpad, method="scaled")
    assert -float(scaled_z[0]) > ref_loss[0] + 30    # the failure 'auto' guards against
    *_, used_log = ctc_forward_backward(jnp.asarray(logits), fp, labels, lpad, method="auto")
    assert bool(used_log)
    loss, grad = loss_and_grad(logits, fp, labels, lpad, method="auto")
    np.testing.assert_allclose(np.asarray(loss), ref_loss, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(grad), ref_grad, atol=1e-4)
# ----------------------------------------------------------------------------------------------
# Brute force and finite differences on tiny cases (every alignment enumerated)
# ----------------------------------------------------------------------------------------------

TINY = [  # (frames, label sequence, blank_id)
    (6, (1, 2), 0),
    (6, (1, 1), 0),        # repeat: needs a blank in between
    (5, (), 0),            # empty label sequence: all blanks
    (6, (2, 2, 2), 0),     # needs 5 frames
    (4, (0, 1), 2),        # blank_id = 2, label 0 is a real class
    (3, (1, 1), 0),        # exactly fits (1, blank, 1)
]


@pytest.mark.parametrize("method", ["log", "scaled"])
@pytest.mark.parametrize("frames,label_seq,blank_id", TINY)
def test_brute_force_and_finite_differences(frames, label_seq, blank_id, method):
    classes, tb, nb = 3, 6, 3          # padded bucket for the jitted function
    rng = np.random.default_rng(frames * 7 + len(label_seq))
    logits = rng.normal(size=(1, tb, classes)).astype(np.float32) * 1.5
    labels = np.zeros((1, nb), np.int32)
    labels[0, :len(label_seq)] = label_seq
    fp, lpad = paddings_from_lengths([frames], tb), paddings_from_lengths([len(label_seq)], nb)
    loss, grad = loss_and_grad(logits, fp, labels, lpad, blank_id=blank_id, method=method)
    valid = logits[0, :frames].astype(np.float64)
    expected = brute_force_nll(valid, label_seq, blank_id)
    np.testing.assert_allclose(float(loss[0]), expected, rtol=1e-5)
    fd = finite_difference_grad(lambda x: brute_force_nll(x, label_seq, blank_id), valid)
    np.testing.assert_allclose(np.asarray(grad)[0, :frames], fd, atol=2e-5)
    assert np.all(np.asarray(grad)[0, frames:] == 0)
    # log_probs=True: the gradient is d/d(log-probs) with the log-probs as free variables.
    lp = np.asarray(jax.nn.log_softmax(jnp.asarray(logits), axis=-1))
    loss_lp, grad_lp = loss_and_grad(lp, fp, labels, lpad, blank_id=blank_id, method=method, log_probs=True)
    np.testing.assert_allclose(float(loss_lp[0]), expected, rtol=1e-5)
    valid_lp = lp[0, :frames].astype(np.float64)
    fd_lp = finite_difference_grad(lambda x: brute_force_nll(x, label_seq, blank_id, log_probs=True), valid_lp)
    np.testing.assert_allclose(np.asarray(grad_lp)[0, :frames], fd_lp, atol=2e-5)


def test_log_probs_gradient_composes_like_torch():
    """-occupancy through log_softmax equals the logits gradient; torch's own log_probs gradient is
    exp(lp) - occupancy (it assumes a log_softmax follows), i.e. ours + exp(lp)."""
    rng = np.random.default_rng(3)
    frame_lengths, label_lengths = np.array([10, 8, 6, 3]), np.array([3, 4, 1, 0])
    labels = rng.integers(1, K, size=(B, N)).astype(np.int32)
    fp, lpad = paddings_from_lengths(frame_lengths, T), paddings_from_lengths(label_lengths, N)
    logits = rng.normal(size=(B, T, K)).astype(np.float32)
    lp = np.asarray(jax.nn.log_softmax(jnp.asarray(logits), axis=-1))
    _, grad_logits = loss_and_grad(logits, fp, labels, lpad)
    _, grad_lp = loss_and_grad(lp, fp, labels, lpad, log_probs=True)
    through_softmax = jax.vjp(lambda x: jax.nn.log_softmax(x, axis=-1), jnp.asarray(logits))[1](grad_lp)[0]
    np.testing.assert_allclose(np.asarray(through_softmax), np.asarray(grad_logits), atol=1e-5)
    _, torch_grad_lp = torch_ctc(lp, frame_lengths, labels, label_lengths, log_probs=True)
    valid = paddings_from_lengths(frame_lengths, T)[:, :, None] == 0
    np.testing.assert_allclose(np.asarray(grad_lp) + np.exp(lp) * valid, torch_grad_lp, atol=1e-5)


# ----------------------------------------------------------------------------------------------
# Edge cases, options, transformations
# ----------------------------------------------------------------------------------------------


def test_infeasible_and_empty_sequences():
    logits = np.random.default_rng(4).normal(size=(B, T, K)).astype(np.float32)
    labels = np.array([[1, 1, 1, 1], [1, 2, 3, 4], [1, 2, 0, 0], [3, 3, 0, 0]], np.int32)
    frame_lengths = np.array([6, 10, 0, 0])    # 4 repeats of 1 need 7 frames; empty inputs
    label_lengths = np.array([4, 4, 2, 0])     # last: empty input and empty labels -> loss 0
    fp, lpad = paddings_from_lengths(frame_lengths, T), paddings_from_lengths(label_lengths, N)
    loss, grad = loss_and_grad(logits, fp, labels, lpad)
    assert np.isposinf(loss[0]) and np.isfinite(loss[1]) and np.isposinf(loss[2]) and loss[3] == 0
    assert np.all(np.asarray(grad)[[0, 2, 3]] == 0) and np.all(np.isfinite(grad))
    loss_z, grad_z = loss_and_grad(logits, fp, labels, lpad, zero_infinity=True)
    np.testing.assert_array_equal(np.asarray(loss_z), np.where(np.isinf(loss), 0.0, loss))
    np.testing.assert_array_equal(np.asarray(grad_z), np.asarray(grad))
    ref_loss, ref_grad = torch_ctc(logits, frame_lengths, labels, label_lengths, zero_infinity=True)
    np.testing.assert_allclose(np.asarray(loss_z), ref_loss, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(grad_z), ref_grad, atol=1e-5)


@pytest.mark.parametrize("method", ["log", "scaled"])
def test_zero_probability_alignments_give_inf_not_nan(method):
    """log_probs with -inf entries: only impossible paths -> +inf loss, zero (finite) gradient."""
    lp = np.full((B, T, K), np.log(1.0 / K), np.float32)
    lp[0, :, 1] = -np.inf                     # label 1 can never be emitted in row 0
    labels = np.array([[1, 2, 0, 0]] * B, np.int32)
    fp, lpad = paddings_from_lengths([T] * B, T), paddings_from_lengths([2] * B, N)
    loss, grad = loss_and_grad(lp, fp, labels, lpad, log_probs=True, method=method)
    assert np.isposinf(loss[0]) and np.all(np.isfinite(loss[1:]))
    assert np.all(np.isfinite(grad)) and np.all(np.asarray(grad)[0] == 0)
    ref_loss, _ = torch_ctc(lp[1:], [T] * (B - 1), labels[1:], [2] * (B - 1), log_probs=True)
    np.testing.assert_allclose(np.asarray(loss[1:]), ref_loss, rtol=1e-5)


def test_reductions_match_torch():
    rng = np.random.default_rng(5)
    frame_lengths, label_lengths = np.array([10, 7, 9, 2]), np.array([4, 2, 0, 4])   # last infeasible
    labels = rng.integers(1, K, size=(B, N)).astype(np.int32)
    labels[3] = [1, 2, 3, 4]
    fp, lpad = paddings_from_lengths(frame_lengths, T), paddings_from_lengths(label_lengths, N)
    logits = jnp.asarray(rng.normal(size=(B, T, K)).astype(np.float32))
    for reduction in ("sum", "mean"):
        def fn(x):
            return ctc_loss(x, fp, labels, lpad, reduction=reduction, zero_infinity=True)
        value, grad = jax.jit(jax.value_and_grad(fn))(logits)
        ref, ref_grad = torch_ctc(logits, frame_lengths, labels, label_lengths, reduction=reduction,
                                  zero_infinity=True)
        np.testing.assert_allclose(float(value), float(ref), rtol=1e-5)
        np.testing.assert_allclose(np.asarray(grad), ref_grad, atol=1e-5)
    assert np.isposinf(float(ctc_loss(logits, fp, labels, lpad, reduction="sum")))


def test_padded_frames_anywhere_are_skipped():
    """Holes in logit_paddings (allowed by optax): same as removing those frames."""
    rng = np.random.default_rng(6)
    logits = rng.normal(size=(B, T, K)).astype(np.float32)
    labels = rng.integers(1, K, size=(B, N)).astype(np.int32)
    fp = (rng.uniform(size=(B, T)) < 0.3).astype(np.float32)
    lpad = paddings_from_lengths([2, 3, 1, 0], N)
    loss, grad = loss_and_grad(logits, fp, labels, lpad)
    np.testing.assert_allclose(np.asarray(loss), np.asarray(optax.ctc_loss(logits, fp, labels, lpad)),
                               rtol=1e-5, atol=1e-4)
    for b in range(B):
        keep = fp[b] == 0
        ref_loss, ref_grad = torch_ctc(logits[b:b + 1, keep], [keep.sum()], labels[b:b + 1],
                                       [int((lpad[b] == 0).sum())])
        np.testing.assert_allclose(float(loss[b]), ref_loss[0], rtol=1e-5)
        np.testing.assert_allclose(np.asarray(grad)[b, keep], ref_grad[0], atol=1e-5)
        assert np.all(np.asarray(grad)[b, ~keep] == 0)


@pytest.mark.parametrize("method", ["log", "scaled"])
def test_padded_frames_anywhere_with_and_without_tables(method):
    """Holes in the frames: the loop that stores tables (value and gradient) and the one that
    stores none (value only) both equal torch on the frames that remain."""
    rng = np.random.default_rng(16)
    logits = (rng.normal(size=(B, T, K)) * 2).astype(np.float32)
    labels = rng.integers(1, K, size=(B, N)).astype(np.int32)
    fp = (rng.uniform(size=(B, T)) < 0.2).astype(np.float32)
    fp[0] = 0.0
    lpad = paddings_from_lengths([4, 2, 1, 0], N)
    fn = jax.jit(jax.value_and_grad(lambda x: jnp.sum(ctc_nll(x, fp, labels, lpad, method=method))))
    total, grad = fn(jnp.asarray(logits))
    for b in range(B):
        keep = fp[b] == 0
        ref_loss, ref_grad = torch_ctc(logits[b:b + 1, keep], [keep.sum()], labels[b:b + 1],
                                       [int((lpad[b] == 0).sum())])
        np.testing.assert_allclose(np.asarray(grad)[b, keep], ref_grad[0], atol=1e-5)
    ref_total = sum(torch_ctc(logits[b:b + 1, fp[b] == 0], [(fp[b] == 0).sum()], labels[b:b + 1],
                              [int((lpad[b] == 0).sum())])[0][0] for b in range(B))
    np.testing.assert_allclose(float(total), ref_total, rtol=1e-5)
    # without a gradient the loss runs the loop without tables (store=False)
    forward_only = jax.jit(lambda x: jnp.sum(ctc_nll(x, fp, labels, lpad, method=method)))
    np.testing.assert_allclose(float(forward_only(jnp.asarray(logits))), ref_total, rtol=1e-5)


def test_long_input_no_overflow():
    """T = 5000 frames, peaky logits: finite and equal to torch float64."""
    rng = np.random.default_rng(7)
    b, t, k, n = 2, 5000, 6, 40
    logits = (rng.normal(size=(b, t, k)) * 8).astype(np.float32)
    labels = rng.integers(1, k, size=(b, n)).astype(np.int32)
    frame_lengths, label_lengths = np.array([5000, 4321]), np.array([40, 33])
    fp, lpad = paddings_from_lengths(frame_lengths, t), paddings_from_lengths(label_lengths, n)
    def one_sequence(x, f, lab, p):    # also exercises vmap over single-sequence calls
        return ctc_loss(x[None], f[None], lab[None], p[None])[0]
    loss, grad = jax.jit(jax.vmap(jax.value_and_grad(one_sequence)))(jnp.asarray(logits), fp, labels, lpad)
    ref_loss, ref_grad = torch_ctc(logits, frame_lengths, labels, label_lengths)
    assert np.all(np.isfinite(np.asarray(grad)))
    np.testing.assert_allclose(np.asarray(loss), ref_loss, rtol=1e-5)
    # float32 rounding accumulated over 5000 frames (values stay normalised per frame).
    np.testing.assert_allclose(np.asarray(grad), ref_grad, atol=5e-4)


def test_bfloat16_inputs_accumulate_in_float32():
    rng = np.random.default_rng(8)
    frame_lengths, label_lengths = np.array([10, 9, 8, 10]), np.array([4, 3, 2, 1])
    labels = rng.integers(1, K, size=(B, N)).astype(np.int32)
    fp, lpad = paddings_from_lengths(frame_lengths, T), paddings_from_lengths(label_lengths, N)
    logits16 = jnp.asarray(rng.normal(size=(B, T, K)) * 3, jnp.bfloat16)
    loss, grad = loss_and_grad(logits16, fp, labels, lpad)
    assert loss.dtype == jnp.float32 and grad.dtype == jnp.bfloat16
    ref_loss, ref_grad = torch_ctc(np.asarray(logits16.astype(jnp.float32)), frame_lengths, labels, label_lengths)
    np.testing.assert_allclose(np.asarray(loss), ref_loss, rtol=1e-5)     # float32 accuracy, not bf16's
    np.testing.assert_allclose(np.asarray(grad.astype(jnp.float32)), ref_grad, atol=1e-2)


def test_vmap_matches_flat_batch():
    rng = np.random.default_rng(9)
    logits = rng.normal(size=(2, B, T, K)).astype(np.float32)
    labels = rng.integers(1, K, size=(2, B, N)).astype(np.int32)
    fp = np.stack([paddings_from_lengths([10, 9, 5, 7], T), paddings_from_lengths([3, 10, 10, 8], T)])
    lpad = np.stack([paddings_from_lengths([4, 2, 1, 0], N), paddings_from_lengths([1, 4, 3, 2], N)])
    vmapped = jax.jit(jax.vmap(jax.grad(lambda x, f, lab, p: ctc_loss(x, f, lab, p).sum())))(logits, fp, labels, lpad)
    loss, grad = loss_and_grad(logits.reshape(2 * B, T, K), fp.reshape(2 * B, T),
                               labels.reshape(2 * B, N), lpad.reshape(2 * B, N))
    np.testing.assert_allclose(np.asarray(vmapped).reshape(2 * B, T, K), np.asarray(grad), atol=1e-6)


def test_invalid_labels_under_jit_give_nan():
    logits = np.zeros((B, T, K), np.float32)
    labels = np.array([[1, 2, 0, 0], [0, 1, 0, 0], [1, K, 0, 0], [2, 2, 0, 0]], np.int32)
    lpad = paddings_from_lengths([2, 2, 2, 2], N)   # row 1 has the blank, row 2 label K
    loss = jax.jit(ctc_loss)(logits, np.zeros((B, T), np.float32), labels, lpad)
    assert np.isfinite(loss[0]) and np.isnan(loss[1]) and np.isnan(loss[2]) and np.isfinite(loss[3])
    # their gradient is NaN too (not a finite gradient of the clamped labels), or 0 when masked out
    for method in ("log", "scaled"):
        _, grad = loss_and_grad(logits, np.zeros((B, T), np.float32), labels, lpad, method=method)
        grad = np.asarray(grad)
        assert np.all(np.isnan(grad[1:3])) and np.all(np.isfinite(grad[[0, 3]]))
        _, masked = loss_and_grad(logits, np.zeros((B, T), np.float32), labels, lpad, method=method,
                                  cotangent=np.array([1, 0, 0, 1], np.float32))
        assert np.all(np.asarray(masked)[1:3] == 0)
        np.testing.assert_array_equal(np.asarray(masked)[[0, 3]], grad[[0, 3]])


def test_check_ctc_inputs_names_the_cause_of_a_nan_row_under_jit():
    """Under jit a row with a bad label or a NaN/+inf logit is NaN and nothing is checked per call;
    jasr.losses.check_ctc_inputs on host copies names the first culprit (labels; with
    finite_logits=True also logits in valid frames; padded frames and -inf are fine)."""
    logits = np.zeros((B, T, K), np.float32)
    labels = np.array([[1, 2, 0, 0], [1, 2, 0, 0], [1, K + 1, 0, 0], [2, 2, 0, 0]], np.int32)
    fp, lpad = paddings_from_lengths([10, 10, 10, 7], T), paddings_from_lengths([2, 2, 2, 2], N)
    logits[1, 3, 4] = np.nan
    logits[3, 8, 0] = np.nan         # padded frame: ignored
    logits[0, 2, 3] = -np.inf        # probability 0: fine
    loss = np.asarray(jax.jit(ctc_loss)(logits, fp, labels, lpad))
    assert np.isfinite(loss[[0, 3]]).all() and np.isnan(loss[[1, 2]]).all()
    with pytest.raises(ValueError, match=rf"labels\[2, 1\] = {K + 1} is outside \[0, K={K}\)"):
        check_ctc_inputs(logits, fp, labels, lpad, 0, finite_logits=True)
    labels[2, 1] = 3
    check_ctc_inputs(logits, fp, labels, lpad, 0)        # logits are not read by default
    with pytest.raises(ValueError, match=r"logits\[1, 3, 4\] = nan in a valid frame .*row 1's loss is NaN"):
        check_ctc_inputs(jnp.asarray(logits, jnp.bfloat16), fp, labels, lpad, 0, finite_logits=True)
    logits[1, 3, 4] = 0.0
    check_ctc_inputs(logits, fp, labels, lpad, 0, finite_logits=True)


@pytest.mark.parametrize("change,message", [
    (dict(labels=np.array([[1, 0]] * 2, np.int32), label_paddings=np.zeros((2, 2), np.float32)), "blank_id"),
    (dict(labels=np.array([[1, 7]] * 2, np.int32), label_paddings=np.zeros((2, 2), np.float32)), "outside"),
    (dict(label_paddings=np.array([[1, 0]] * 2, np.float32)), "right-padded"),
    (dict(logit_paddings=np.full((2, 3), 0.5, np.float32)), "logit_paddings"),
    (dict(logits=np.zeros((2, 3), np.float32)), "logits"),
    (dict(logit_paddings=np.zeros((2, 4), np.float32)), "logit_paddings"),
    (dict(labels=np.zeros((3, 2), np.int32)), "labels"),
    (dict(labels=np.ones((2, 2), np.float32)), "labels"),
    (dict(blank_id=5), "blank_id"),
    (dict(reduction="avg"), "reduction"),
])
def test_bad_input_raises_clear_error(change, message):
    args = dict(logits=np.zeros((2, 3, 5), np.float32), logit_paddings=np.zeros((2, 3), np.float32),
                labels=np.array([[1, 2]] * 2, np.int32), label_paddings=np.array([[0, 1]] * 2, np.float32))
    args.update(change)
    with pytest.raises((ValueError, TypeError), match=message):
        ctc_loss(**args)


def test_default_method_is_the_exact_log_recursion_for_every_vocabulary():
    assert default_method(K) == "log" and default_method(5000) == "log"


@pytest.mark.parametrize("scale", [3.0, 10.0])
def test_default_method_is_exact_on_peaky_long_inputs(scale):
    """N(0, 1) logits x3 and x10 with long label sequences (where 'scaled' loses mass): the default
    equals torch in float64 (loss and gradient), and 'scaled' shows the loss it would have had."""
    rng = np.random.default_rng(31)
    b, t, k, n = 2, 120, 6, 30
    logits = (rng.normal(size=(b, t, k)) * scale).astype(np.float32)
    labels = rng.integers(1, k, size=(b, n)).astype(np.int32)
    frame_lengths, label_lengths = np.array([120, 90]), np.array([30, 22])
    fp, lpad = paddings_from_lengths(frame_lengths, t), paddings_from_lengths(label_lengths, n)
    value_and_grad = jax.jit(jax.value_and_grad(lambda x: jnp.sum(ctc_loss(x, fp, labels, lpad))))
    loss, grad = value_and_grad(jnp.asarray(logits))
    ref_loss, ref_grad = torch_ctc(logits, frame_lengths, labels, label_lengths)
    np.testing.assert_allclose(float(loss), float(np.sum(ref_loss)), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(grad), ref_grad, atol=2e-4)


def test_fsa_ops_entry_point_is_the_same_function():
    rng = np.random.default_rng(10)
    logits = rng.normal(size=(B, T, K)).astype(np.float32)
    labels = rng.integers(1, K, size=(B, N)).astype(np.int32)
    fp, lpad = paddings_from_lengths([10, 9, 5, 7], T), paddings_from_lengths([4, 2, 1, 0], N)
    np.testing.assert_allclose(np.asarray(ctc_nll(logits, fp, labels, lpad, method="log")),
                               np.asarray(loss_and_grad(logits, fp, labels, lpad)[0]), rtol=1e-6)


def test_scaled_method_with_many_padding_labels():
    """Short label sequences in a wide label bucket: the forward rows' padding states must stay
    empty (otherwise the mass that reaches them grows combinatorially over the frames, dominates
    the per-frame normaliser and flushes the real states)."""
    rng = np.random.default_rng(17)
    b, t, k, n = 2, 400, 6, 60
    logits = rng.normal(size=(b, t, k)).astype(np.float32)
    labels = rng.integers(1, k, size=(b, n)).astype(np.int32)
    frame_lengths, label_lengths = np.array([400, 300]), np.array([2, 5])
    fp, lpad = paddings_from_lengths(frame_lengths, t), paddings_from_lengths(label_lengths, n)
    loss, grad = jax.jit(jax.value_and_grad(lambda x: jnp.sum(ctc_nll(x, fp, labels, lpad, method="scaled"))))(
        jnp.asarray(logits))
    ref_loss, ref_grad = torch_ctc(logits, frame_lengths, labels, label_lengths)
    np.testing.assert_allclose(float(loss), float(np.sum(ref_loss)), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(grad), ref_grad, atol=1e-4)


def test_auto_method_does_not_fall_back_on_long_sequences_with_small_vocabulary():
    """Moderate logits at T = 250 (a bench shape): the scaled forward and backward totals must
    agree to float32 rounding, so 'auto' keeps its fast path, with and without a gradient (a prefix
    sum that accumulated the log-scales without centring was ~1e-3 nats off and silently doubled
    the cost; tripled it for the loss alone)."""
    rng = np.random.default_rng(0)      # (bench/ctc.py's make_inputs)
    B, T, K, N = 32, 250, 32, 60
    logits = jnp.asarray(rng.normal(size=(B, T, K)).astype(np.float32))
    frame_lengths = rng.integers(int(0.8 * T), T + 1, size=B)
    frame_lengths[0] = T
    label_lengths = rng.integers(N // 2, N + 1, size=B)
    label_lengths[0] = N
    labels = rng.integers(1, K, size=(B, N)).astype(np.int32)
    fp, lpad = paddings_from_lengths(frame_lengths, T), paddings_from_lengths(label_lengths, N)

    @functools.partial(jax.jit, static_argnums=(0, 1))
    def totals(method, store):
        return ctc_forward_backward(logits, fp, labels, lpad, method=method, store_tables=store)[2:]

    assert not bool(totals("auto", True)[1])
    # the same without tables (the loss without a gradient): a running float32 sum of the
    # log-scales drifted ~1e-3 nats apart in the two directions and made every such call fall back
    value_z, used_log = totals("auto", False)
    assert not bool(used_log)
    scaled_z, log_z = totals("scaled", True)[0], totals("log", False)[0]
    np.testing.assert_allclose(np.asarray(value_z), np.asarray(scaled_z), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(scaled_z), np.asarray(log_z), rtol=1e-6)


# ----------------------------------------------------------------------------------------------
# Non-finite inputs: NaN rows, never a finite wrong value
# ----------------------------------------------------------------------------------------------


@functools.partial(jax.jit, static_argnames=("method", "log_probs"))
def loss_only(logits, logit_paddings, labels, label_paddings, method="log", log_probs=False):
    """The loss without a gradient (the loops that store no tables)."""
    return ctc_loss(logits, logit_paddings, labels, label_paddings, method=method, log_probs=log_probs)


def _nonfinite_batch(log_probs):
    """Row 0: +inf in the blank at frame 0 (the first entry of the scaled loop, whose gain once
    made every row's renormalisation NaN); row 1: NaN in a class that no label uses; row 2: clean
    but -inf (probability 0) in some classes; row 3: NaN and +inf only in its padded frames.
    Returns (x, the same with padded frames zeroed, frame lengths, labels, label lengths)."""
    rng = np.random.default_rng(21)
    frame_lengths, label_lengths = np.array([10, 9, 10, 6]), np.array([3, 2, 2, 3])
    labels = np.array([[1, 3, 2, 0], [1, 2, 0, 0], [2, 1, 0, 0], [3, 3, 1, 0]], np.int32)
    x = rng.normal(size=(B, T, K)).astype(np.float32) * 2
    if log_probs:
        x = np.array(jax.nn.log_softmax(jnp.asarray(x), axis=-1))
    x[0, 0, 0] = np.inf
    x[1, 4, 4] = np.nan
    x[2, 2:5, 4] = -np.inf
    x[2, 6, 1] = -np.inf
    clean = np.where(np.arange(T)[None, :, None] < frame_lengths[:, None, None], x, 0.0).astype(np.float32)
    x[3, 6, 1], x[3, 8, 0], x[3, 9] = np.nan, np.inf, np.nan
    return x, clean, frame_lengths, labels, label_lengths


@pytest.mark.parametrize("log_probs", [False, True])
@pytest.mark.parametrize("method", ["log", "scaled", "auto"])
def test_nonfinite_inputs_give_nan_rows(method, log_probs):
    """A NaN or +inf in any class of a valid frame makes that row's loss NaN (used class or not:
    optax and torch give NaN too, through the log-softmax) with a NaN gradient on its valid frames;
    -inf classes are probabilities 0; the other rows, and rows whose non-finite values sit only
    in padded frames, equal torch in float64 and the all-finite computation exactly."""
    x, clean, frame_lengths, labels, label_lengths = _nonfinite_batch(log_probs)
    fp, lpad = paddings_from_lengths(frame_lengths, T), paddings_from_lengths(label_lengths, N)
    loss, grad = map(np.asarray, loss_and_grad(x, fp, labels, lpad, method=method, log_probs=log_probs))
    value = np.asarray(loss_only(x, fp, labels, lpad, method=method, log_probs=log_probs))
    clean_loss, clean_grad = map(np.asarray, loss_and_grad(clean, fp, labels, lpad, method=method,
                                                           log_probs=log_probs))
    clean_value = np.asarray(loss_only(clean, fp, labels, lpad, method=method, log_probs=log_probs))
    valid = fp == 0
    for out, ref in ((loss, clean_loss), (value, clean_value)):
        assert np.isnan(out[0]) and np.isnan(out[1]) and np.all(np.isfinite(out[2:]))
        np.testing.assert_array_equal(out[2:], ref[2:])
    assert np.all(np.isnan(grad[:2][valid[:2]])) and np.all(grad[:2][~valid[:2]] == 0)
    np.testing.assert_array_equal(grad[2:], clean_grad[2:])
    # the NaN rows masked out of the loss (cotangent 0, as jnp.where(jnp.isnan(loss), 0, loss) gives):
    # gradient 0 there, the other rows unchanged
    _, masked_grad = loss_and_grad(x, fp, labels, lpad, method=method, log_probs=log_probs,
                                   cotangent=np.isfinite(loss).astype(np.float32))
    assert np.all(np.asarray(masked_grad)[:2] == 0)
    np.testing.assert_array_equal(np.asarray(masked_grad)[2:], clean_grad[2:])
    ref_loss, ref_grad = torch_ctc(clean, frame_lengths, labels, label_lengths, log_probs=log_probs)
    np.testing.assert_allclose(loss[2:], ref_loss[2:], rtol=1e-5)
    if log_probs:    # torch's log-probs gradient assumes a log_softmax follows (see above)
        ref_grad = ref_grad - np.exp(clean) * valid[:, :, None]
    # (torch's gradient is NaN at -inf entries, and through its log_softmax on their whole frame;
    # ours is finite there, 0 at the -inf entries: no path uses them)
    frames_with_neginf = np.any(np.isneginf(clean[2:]), axis=-1, keepdims=True)
    assert np.all(np.isnan(ref_grad[2:]) <= frames_with_neginf)
    assert np.all(np.isfinite(grad[2:])) and np.all(grad[2:][np.isneginf(clean[2:])] == 0)
    torch_ok = ~np.isnan(ref_grad[2:])
    np.testing.assert_allclose(grad[2:][torch_ok], ref_grad[2:][torch_ok], atol=1e-5)
    if not log_probs:   # the references agree that rows 0 and 1 are NaN
        assert np.all(np.isnan(np.asarray(optax.ctc_loss(x, fp, labels, lpad))[:2]))
        assert np.all(np.isnan(torch_ctc(np.where(valid[:, :, None], x, 0.0), frame_lengths, labels,
                                         label_lengths)[0][:2]))


@settings(max_examples=20, deadline=None)
@given(method=st.sampled_from(["log", "scaled", "auto"]), log_probs=st.booleans(), row=st.integers(0, B - 1),
       frame=st.integers(0, T - 1), cls=st.integers(0, K - 1), bad=st.sampled_from([np.nan, np.inf]))
def test_one_nonfinite_value_anywhere_poisons_only_its_row(method, log_probs, row, frame, cls, bad):
    rng = np.random.default_rng(22)
    frame_lengths, label_lengths = np.array([10, 8, 9, 10]), np.array([3, 2, 4, 1])
    labels = rng.integers(1, K, size=(B, N)).astype(np.int32)
    fp, lpad = paddings_from_lengths(frame_lengths, T), paddings_from_lengths(label_lengths, N)
    x = rng.normal(size=(B, T, K)).astype(np.float32)
    if log_probs:
        x = np.array(jax.nn.log_softmax(jnp.asarray(x), axis=-1))
    clean_loss, clean_grad = map(np.asarray, loss_and_grad(x, fp, labels, lpad, method=method, log_probs=log_probs))
    x[row, frame, cls] = bad
    loss, grad = map(np.asarray, loss_and_grad(x, fp, labels, lpad, method=method, log_probs=log_probs))
    others = np.arange(B) != row
    np.testing.assert_array_equal(loss[others], clean_loss[others])
    np.testing.assert_array_equal(grad[others], clean_grad[others])
    if frame < frame_lengths[row]:
        assert np.isnan(loss[row]) and np.all(np.isnan(grad[row, :frame_lengths[row]]))
    else:               # a padded frame: ignored
        assert loss[row] == clean_loss[row]
        np.testing.assert_array_equal(grad[row], clean_grad[row])


def test_a_nan_row_does_not_send_auto_to_the_log_recursion():
    """'auto' decides per batch whether to recompute with 'log'; a row whose loss is NaN anyway
    (non-finite logits, invalid labels) must not make the whole batch pay for it."""
    rng = np.random.default_rng(23)
    logits = rng.normal(size=(B, T, K)).astype(np.float32)
    labels = np.array([[1, 2, 0, 0], [1, 2, 3, 0], [2, 0, 0, 0], [3, 1, 0, 0]], np.int32)
    fp, lpad = paddings_from_lengths([10, 10, 10, 10], T), paddings_from_lengths([2, 3, 2, 2], N)
    logits[0, 3, 1] = np.inf           # row 0: non-finite input (a used class); row 2: blank as a label
    _, _, log_z, used_log = jax.jit(functools.partial(ctc_forward_backward, method="auto"))(
        jnp.asarray(logits), fp, labels, lpad)
    log_z = np.asarray(log_z)
    assert not bool(used_log) and np.isnan(log_z[0]) and np.all(np.isfinite(log_z[[1, 3]]))


def test_a_nonfinite_first_frame_leaves_the_other_rows_renormalised():
    """The scaled loop's row-sum weights were derived from the first row's first gain, and +inf in
    that frame's blank made them NaN: no row was renormalised any more, and a clean row of 300
    frames came out +inf. The clean row must equal its loss and gradient without the bad row."""
    rng = np.random.default_rng(24)
    b, t, k, n = 2, 300, 5, 20
    x = (rng.normal(size=(b, t, k)) * 3).astype(np.float32)
    labels = rng.integers(1, k, size=(b, n)).astype(np.int32)
    fp, lpad = np.zeros((b, t), np.float32), np.zeros((b, n), np.float32)
    clean_loss, clean_grad = map(np.asarray, loss_and_grad(x, fp, labels, lpad, method="scaled"))
    x[0, 0, 0] = np.inf
    loss, grad = map(np.asarray, loss_and_grad(x, fp, labels, lpad, method="scaled"))
    assert np.isnan(loss[0]) and loss[1] == clean_loss[1] and np.isfinite(loss[1])
    np.testing.assert_array_equal(grad[1], clean_grad[1])


def _peaky_logits(rng, frame_lengths, labels, label_lengths, frames, classes):
    """Logits of a 'trained network': N(0, 1) plus a dominant class at +10..+20 on every frame --
    each label on 3 frames at random places in order, the blank elsewhere."""
    logits = rng.normal(size=(len(frame_lengths), frames, classes)).astype(np.float32)
    for b, (f, n) in enumerate(zip(frame_lengths, label_lengths)):
        top = np.zeros(frames, np.int64)
        for j, start in enumerate(np.sort(rng.choice(np.arange(1, f - 5), size=n, replace=False))):
            top[start:start + 3] = labels[b, j]
        logits[b, np.arange(frames), top] += rng.uniform(10, 20, size=frames).astype(np.float32)
    return logits


@pytest.mark.slow
def test_twenty_thousand_frames_give_finite_losses_and_gradients():
    """T = 20000 frames (B = 2, K = 5): every method gives a finite loss and gradient, for peaky
    ('trained') and N(0, 1) logits, equal to torch in float64 -- except 'scaled' on N(0, 1), which
    is finite but loses mass there (documented; 'auto' recomputes with 'log'). Tolerance: float32
    rounding of ~1e-7 nats per frame over 20000 frames (torch's own float32 loss is ~3e-4 off)."""
    rng = np.random.default_rng(25)
    b, t, k, n = 2, 20000, 5, 8
    labels = rng.integers(1, k, size=(b, n)).astype(np.int32)
    frame_lengths, label_lengths = np.array([20000, 17001]), np.array([8, 6])
    fp, lpad = paddings_from_lengths(frame_lengths, t), paddings_from_lengths(label_lengths, n)
    peaky = _peaky_logits(rng, frame_lengths, labels, label_lengths, t, k)
    normal = rng.normal(size=(b, t, k)).astype(np.float32)
    for name, logits in (("peaky", peaky), ("normal", normal)):
        ref_loss, ref_grad = torch_ctc(logits, frame_lengths, labels, label_lengths)
        for method in ("log", "scaled", "auto"):
            loss, grad = map(np.asarray, loss_and_grad(logits, fp, labels, lpad, method=method))
            assert np.all(np.isfinite(loss)) and np.all(np.isfinite(grad)), (name, method)
            assert np.all(grad[1, frame_lengths[1]:] == 0)
            if name == "normal" and method == "scaled":
                assert np.all(loss > ref_loss)           # lost mass, not NaN or inf
                continue
            np.testing.assert_allclose(loss, ref_loss, rtol=5e-6, atol=5e-3, err_msg=f"{name} {method}")
            np.testing.assert_allclose(grad, ref_grad, atol=5e-4, err_msg=f"{name} {method}")
