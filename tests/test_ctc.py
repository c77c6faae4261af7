"""jasr.ctc_loss / fsa_ops.ctc against independent references: torch.nn.functional.ctc_loss in
float64, optax.ctc_loss, a brute-force sum over all alignments (numpy float64) and finite
differences of that brute force. Shapes are bucketed so that each jitted function compiles once."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from hypothesis import given, settings, strategies as st

from ctc_references import (B, K, N, T, brute_force_nll, finite_difference_grad,
                            loss_and_grad, paddings_from_lengths, torch_ctc)
from fsa_ops.ctc import ctc_forward_backward, ctc_nll, default_method
from jasr.losses import check_ctc_inputs, ctc_loss


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


