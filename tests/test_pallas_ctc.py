"""fsa_ops.pallas_ctc: the Pallas frame loop of the CTC forward-backward, run on CPU with interpret=True
(tiny shapes), against a row-by-row numpy float64 loop (log and tropical semirings), the XLA path of
jasr.ctc_loss (relative 1e-5) and torch's ctc_loss in float64."""
import functools
from itertools import product

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from jax import export

from fsa_ops.ctc import ctc_nll
from fsa_ops.ctc_lattice import CtcLattice, log_normaliser
from fsa_ops.ctc_log import run_log
from fsa_ops.pallas_ctc import ctc_loop_pallas, next_power_of_two, use_pallas
from jasr.losses import ctc_loss

B, T, K, N = 3, 7, 5, 3
FRAME_LENGTHS = np.array([7, 5, 6])
LABEL_LENGTHS = np.array([3, 1, 0])
LABELS = np.array([[1, 1, 2], [3, 0, 0], [2, 4, 0]], np.int32)        # row 0 repeats a label


def _paddings(lengths, size):
    return (np.arange(size)[None, :] >= np.asarray(lengths)[:, None]).astype(np.float32)


def _batch(scale, seed=0):
    logits = (np.random.default_rng(seed).normal(size=(B, T, K)) * scale).astype(np.float32)
    return logits, _paddings(FRAME_LENGTHS, T), LABELS, _paddings(LABEL_LENGTHS, N)


def numpy_loop(lp_rows, valid_rows, skip, init, batch, semiring):
    """What the kernel computes, row by row in float64: incoming sums per natural frame, the removed
    per-frame maxima and the last scores (see fsa_ops.pallas_ctc.ctc_loop_pallas)."""
    rows, frames, states = lp_rows.shape
    table, scale, last = np.zeros((rows, frames, states)), np.zeros((rows, frames)), np.zeros((rows, states))
    with np.errstate(invalid="ignore"):
        for r in range(rows):
            post, offset = init[r].astype(np.float64), 0.0
            for t in range(frames):
                alpha = post - offset
                ext = np.concatenate([[-np.inf] * 2, alpha, [-np.inf] * 2])
                near, far = (ext[1:states + 1], ext[:states]) if r < batch else (ext[3:states + 3], ext[4:])
                terms = np.stack([alpha, near, np.where(skip[r], far, -np.inf)])
                incoming = np.logaddexp.reduce(terms, axis=0) if semiring == "log" else terms.max(axis=0)
                post = incoming + lp_rows[r, t] if valid_rows[r, t] else alpha
                offset = post.max() if np.isfinite(post.max()) else 0.0
                frame = t if r < batch else frames - 1 - t
                table[r, frame], scale[r, frame] = incoming, offset
            last[r] = post - offset
    return table, scale, last


@pytest.mark.parametrize("semiring", ["log", "tropical"])
def test_kernel_matches_a_numpy_loop(semiring):
    rng = np.random.default_rng(1)
    rows, frames, states = 4, 6, 5
    lp = np.log(rng.dirichlet(np.ones(states), size=(rows, frames))).astype(np.float32)
    lp[1, :, 4] = -np.inf                                     # a padding state
    valid = np.ones((rows, frames), bool)
    valid[2, 3] = valid[3, 0] = False                         # padded frames anywhere
    skip = rng.uniform(size=(rows, states)) < 0.5
    init = np.full((rows, states), -np.inf, np.float32)
    init[:2, 0] = 0.0
    init[2:, 3] = 0.0
    got = ctc_loop_pallas(jnp.asarray(lp), jnp.asarray(valid), jnp.asarray(skip), jnp.asarray(init), batch=2,
                          semiring=semiring, interpret=True)
    for out, ref in zip(got, numpy_loop(lp, valid, skip, init, 2, semiring)):
        out = np.asarray(out)
        assert np.array_equal(np.isfinite(out), np.isfinite(ref))
        np.testing.assert_allclose(out[np.isfinite(ref)], ref[np.isfinite(ref)], rtol=1e-5, atol=1e-5)


@functools.partial(jax.jit, static_argnames=("implementation",))
def _loss_and_grad(logits, fp, labels, lpad, implementation):
    return jax.value_and_grad(lambda x: jnp.sum(ctc_loss(x, fp, labels, lpad, implementation=implementation)))(
        logits)


@pytest.mark.parametrize("scale", [1.0, 10.0])
def test_pallas_loss_and_gradient_equal_the_xla_path_and_torch(scale):
    logits, fp, labels, lpad = _batch(scale)
    loss, grad = _loss_and_grad(logits, fp, labels, lpad, "pallas")
    xla_loss, xla_grad = _loss_and_grad(logits, fp, labels, lpad, "xla")
    np.testing.assert_allclose(float(loss), float(xla_loss), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(grad), np.asarray(xla_grad), rtol=1e-5, atol=1e-6)
    x = torch.tensor(logits.astype(np.float64), requires_grad=True)
    ref = torch.nn.functional.ctc_loss(torch.log_softmax(x, -1).transpose(0, 1), torch.tensor(LABELS, dtype=torch.long),
                                       torch.tensor(FRAME_LENGTHS), torch.tensor(LABEL_LENGTHS), reduction="sum")
    ref.backward()
    np.testing.assert_allclose(float(loss), ref.item(), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(grad), x.grad.numpy(), atol=1e-4)


def test_tropical_scores_are_the_best_alignment():
    """Viterbi through the kernel: the best alignment's log-probability, brute force over all paths."""
    logits, fp, labels, lpad = _batch(2.0, seed=3)
    lp = np.asarray(jax.nn.log_softmax(jnp.asarray(logits), axis=-1), np.float64)
    lat = CtcLattice.build(jnp.asarray(logits), fp, labels, lpad, 0).with_log_norm(
        *log_normaliser(jnp.asarray(logits), False))
    _, best = run_log(lat, lat.emissions(jnp.asarray(logits)), store=False, implementation="pallas",
                      semiring="tropical")
    for b in range(B):
        target = tuple(LABELS[b, :LABEL_LENGTHS[b]])
        frames = int(FRAME_LENGTHS[b])
        paths = np.array(list(product(range(K), repeat=frames)))
        fits = [tuple(k for i, k in enumerate(p) if k != 0 and (i == 0 or k != p[i - 1])) == target for p in paths]
        top = lp[b, np.arange(frames)[None, :], paths[np.array(fits)]].sum(axis=1).max()
        np.testing.assert_allclose(float(best[b]), top, rtol=1e-5)
        np.testing.assert_allclose(float(best[B + b]), top, rtol=1e-5)     # the backward rows agree


@pytest.mark.parametrize("semiring", ["log", "tropical"])
def test_kernel_lowers_to_triton_for_cuda(semiring):
    """No GPU here: lowering for the 'cuda' platform still runs Pallas's Triton lowering rules on every
    op of the kernel (an unsupported op or block shape fails here, not on a GPU); the Triton custom call
    and its barriers are in the module."""
    rows, frames, states = 4, 6, 5
    fn = jax.jit(functools.partial(ctc_loop_pallas, batch=2, semiring=semiring, interpret=False))
    args = (jax.ShapeDtypeStruct((rows, frames, states), jnp.float32), jax.ShapeDtypeStruct((rows, frames), bool),
            jax.ShapeDtypeStruct((rows, states), bool), jax.ShapeDtypeStruct((rows, states), jnp.float32))
    exported = export.export(fn, platforms=["cuda"], disabled_checks=[
        export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")])(*args)
    text = exported.mlir_module()
    assert "__gpu$xla.gpu.triton" in text and 'name = "ctc_frame_loop"' in text


def test_loss_and_gradient_lower_for_cuda_through_the_kernel():
    """jasr.ctc_loss's value_and_grad with implementation='pallas' lowers for 'cuda' (custom_vjp, the
    gather and the gradient around the kernel)."""
    logits, fp, labels, lpad = _batch(1.0)
    fn = jax.jit(jax.value_and_grad(lambda x: jnp.sum(ctc_loss(x, fp, labels, lpad, implementation="pallas"))))
    triton = [export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")]
    exported = export.export(fn, platforms=["cuda"], disabled_checks=triton)(
        jax.ShapeDtypeStruct(logits.shape, jnp.float32))
    assert exported.mlir_module().count('name = "ctc_frame_loop"') == 1


def test_dispatch_and_bad_arguments():
    assert not use_pallas("auto") or jax.default_backend() == "gpu"
    assert use_pallas("pallas") and not use_pallas("xla")
    assert next_power_of_two(1) == 1 and next_power_of_two(5) == 8 and next_power_of_two(8) == 8
    logits, fp, labels, lpad = _batch(1.0)
    with pytest.raises(ValueError, match="implementation"):
        ctc_nll(logits, fp, labels, lpad, implementation="triton")
    with pytest.raises(ValueError, match="method='scaled'"):
        ctc_nll(logits, fp, labels, lpad, method="scaled", implementation="pallas")
    with pytest.raises(ValueError, match="semiring"):
        ctc_loop_pallas(jnp.zeros((2, 3, 3)), jnp.ones((2, 3), bool), jnp.zeros((2, 3), bool), jnp.zeros((2, 3)),
                        batch=1, semiring="max", interpret=True)
