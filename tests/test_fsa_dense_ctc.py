"""fsa_ops.graph_ctc (k2.ctc_loss over ctc_graph) against optax, torch and jasr.ctc_loss: bad rows, padded frames,
repeated labels, long segments."""
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch

from fsa_ops.dense import DenseFsaVec, dense_tot_scores
from fsa_ops.graph_ctc import ctc_loss
from fsa_ops.graphs import ctc_graph, ctc_topo
from jasr.losses import ctc_loss as jasr_ctc_loss

def test_graph_ctc_loss_nan_rows_padded_frames_and_infeasible_rows():
    """k2.ctc_loss (band layout) on log-probs: NaN in a symbol no label uses (row 0) or +inf in a
    label's (row 1), in a valid frame: NaN loss and NaN gradient on the row's valid frames, with
    output_beam=inf and 10; NaN past a segment's end (row 2) changes nothing; a row that no path
    fits (row 3) has loss +inf and gradient 0, as torch's zero_infinity gradient."""
    rng = np.random.default_rng(31)
    Bn, Tn, Cn = 4, 12, 6
    lp = np.array(jax.nn.log_softmax(jnp.asarray(rng.normal(size=(Bn, Tn, Cn)).astype(np.float32) * 2)))
    labels = [[1, 2], [2, 3, 1], [3, 3], [1, 1, 1, 1, 1, 1, 1]]      # row 3 needs 13 frames
    segs = np.array([[0, 0, 12], [1, 0, 12], [2, 0, 9], [3, 0, 12]], np.int32)
    graph = ctc_graph(labels)
    clean = lp.copy()
    lp[0, 5, 5], lp[1, 3, 3], lp[2, 10, 3], lp[2, 11] = np.nan, np.inf, np.nan, np.inf

    @functools.partial(jax.jit, static_argnums=1)
    def loss_and_grads(x, beam):
        """Per-row loss, the gradient of the sum over rows 0-2 and of the sum over row 2 alone
        (rows 0 and 1 masked out by a 0 cotangent)."""
        loss, vjp = jax.vjp(lambda x: ctc_loss(graph, DenseFsaVec(x, segs), output_beam=beam, reduction="none"), x)
        return loss, vjp(jnp.array([1.0, 1.0, 1.0, 0.0]))[0], vjp(jnp.array([0.0, 0.0, 1.0, 1.0]))[0]

    for beam in (None, 10.0):
        loss, grad, masked = map(np.asarray, loss_and_grads(jnp.asarray(lp), beam))
        clean_loss, clean_grad, _ = map(np.asarray, loss_and_grads(jnp.asarray(clean), beam))
        assert np.isnan(loss[0]) and np.isnan(loss[1]) and np.isposinf(loss[3])
        assert loss[2] == clean_loss[2] and np.isfinite(loss[2])
        assert np.all(np.isnan(grad[:2])) and np.all(grad[2] == clean_grad[2]) and np.all(grad[3] == 0)
        # NaN rows masked out of the loss (cotangent 0): gradient 0, the rest unchanged; the
        # infeasible row has gradient 0 with cotangent 1
        assert np.all(masked[:2] == 0) and np.all(masked[3] == 0) and np.all(masked[2] == clean_grad[2])


def _ctc_batch(rng, Bn=3, Tn=12, Cn=6, Lmax=4, first_labels=None):
    """Random CTC batch; `first_labels` (length Lmax) fixes the labels of sequence 0."""
    logits = rng.normal(size=(Bn, Tn, Cn)).astype(np.float32) * 2
    lens = rng.integers(1, Lmax + 1, size=Bn)
    tlen = rng.integers(Tn // 2, Tn + 1, size=Bn)
    tlen[0] = Tn
    labels = np.zeros((Bn, Lmax), np.int32)
    for b in range(Bn):
        labels[b, :lens[b]] = rng.integers(1, Cn, size=lens[b])
    if first_labels is not None:
        lens[0], labels[0] = Lmax, first_labels
    lpad = (np.arange(Lmax)[None] >= lens[:, None]).astype(np.float32)
    tpad = (np.arange(Tn)[None] >= tlen[:, None]).astype(np.float32)
    segs = np.stack([np.arange(Bn), np.zeros(Bn, int), tlen], 1).astype(np.int32)
    graph = ctc_graph([list(labels[b, :lens[b]]) for b in range(Bn)])
    return logits, labels, lpad, tpad, segs, graph


def test_ctc_loss_equals_optax():
    rng = np.random.default_rng(0)
    logits, labels, lpad, tpad, segs, graph = _ctc_batch(rng)

    def ours(x, beam=math.inf):
        return ctc_loss(graph, DenseFsaVec(jax.nn.log_softmax(x), segs), output_beam=beam, reduction="none")

    def ref(x):
        return optax.ctc_loss(x, jnp.asarray(tpad), jnp.asarray(labels), jnp.asarray(lpad))

    x = jnp.asarray(logits)
    np.testing.assert_allclose(ours(x), ref(x), rtol=1e-5, atol=1e-4)
    g1 = jax.grad(lambda x: jnp.sum(ours(x)))(x)
    g2 = jax.grad(lambda x: jnp.sum(ref(x)))(x)
    np.testing.assert_allclose(g1, g2, atol=1e-5)
    # k2's default beam drops only paths far below the best one: the loss moves up, slightly
    l10 = ours(x, 10.0)
    assert np.all(np.asarray(l10) >= np.asarray(ours(x)) - 1e-5)
    np.testing.assert_allclose(l10, ours(x), atol=1e-2)
    # reductions
    assert abs(float(ctc_loss(graph, DenseFsaVec(jax.nn.log_softmax(x), segs), output_beam=None))
               - float(jnp.sum(ref(x)))) < 1e-3
    tl = jnp.asarray((1 - lpad).sum(1))
    m = ctc_loss(graph, DenseFsaVec(jax.nn.log_softmax(x), segs), None, "mean", target_lengths=tl)
    assert abs(float(m) - float(jnp.mean(ref(x) / tl))) < 1e-4
    # a shared graph (ctc_topo: any sequence) gives 0 loss on normalised log-probs
    topo = ctc_topo(5)
    lz = ctc_loss(topo, DenseFsaVec(jax.nn.log_softmax(x), segs), None, "none")
    np.testing.assert_allclose(lz, 0.0, atol=1e-4)


@pytest.mark.parametrize("first_labels", [None, [1, 2, 1, 1]])   # repeats: folded occupancies
def test_graph_ctc_equals_jasr_ctc_loss(first_labels):
    rng = np.random.default_rng(5)
    logits, labels, lpad, tpad, segs, graph = _ctc_batch(rng, first_labels=first_labels)
    x = jnp.asarray(logits)

    def ours(x):
        return ctc_loss(graph, DenseFsaVec(jax.nn.log_softmax(x), segs), output_beam=None, reduction="none")

    def theirs(x):
        return jasr_ctc_loss(x, jnp.asarray(tpad), jnp.asarray(labels), jnp.asarray(lpad), reduction="none")

    np.testing.assert_allclose(ours(x), theirs(x), rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(jax.grad(lambda x: jnp.sum(ours(x)))(x),
                               jax.grad(lambda x: jnp.sum(theirs(x)))(x), atol=1e-5)


def test_graph_ctc_gradient_keeps_float32_precision_on_long_segments_under_jit():
    """A total score of ~-3000 nats: posteriors taken as exp(alpha + beta - tot) would lose ~1e-3 to
    float32 rounding; the per-frame normalised posteriors match jasr.ctc_loss to ~1e-6. The graph is
    closed over by the jit (concrete structure: the degree-table layout)."""
    rng = np.random.default_rng(11)
    B, T, C, L = 2, 1000, 30, 100
    x = jnp.asarray(rng.normal(size=(B, T, C)).astype(np.float32))
    labels = rng.integers(1, C, size=(B, L)).astype(np.int32)
    graph = ctc_graph([list(r) for r in labels])
    segs = np.array([[0, 0, T], [1, 0, T - 37]], np.int32)
    tpad = (np.arange(T)[None] >= segs[:, 2:3]).astype(np.float32)
    lpad = np.zeros((B, L), np.float32)
    ours = jax.jit(jax.value_and_grad(lambda x: ctc_loss(
        graph, DenseFsaVec(jax.nn.log_softmax(x), segs), output_beam=None, reduction="sum")))
    theirs = jax.jit(jax.value_and_grad(lambda x: jnp.sum(jasr_ctc_loss(x, tpad, labels, lpad, method="log"))))
    (l1, g1), (l2, g2) = ours(x), theirs(x)
    assert float(l2) > 2500
    np.testing.assert_allclose(l1, l2, rtol=1e-6)
    np.testing.assert_allclose(g1, g2, atol=2e-5)


@pytest.mark.slow
def test_twenty_thousand_frames_give_finite_lattice_losses_and_gradients():
    """T = 20000 frames, C = 5 symbols: k2.ctc_loss (band layout, output_beam inf and k2's 10)
    equals torch in float64, for peaky ('trained') and N(0, 1) log-probs,
    with finite gradients; dense_tot_scores over ctc_topo (every sequence: total log 1 = 0, the
    state-labelled layout) stays ~0 with a ~0 gradient after 20000 frames."""
    rng = np.random.default_rng(26)
    Bn, Tn, Cn = 2, 20000, 5
    labels = [[1, 3, 2, 2, 4, 1], [2, 4, 4, 3]]
    segs = np.array([[0, 0, Tn], [1, 0, 15001]], np.int32)
    peaky = rng.normal(size=(Bn, Tn, Cn)).astype(np.float32)
    for b, lab in enumerate(labels):
        top = np.zeros(Tn, np.int64)
        for j, start in enumerate(np.sort(rng.choice(np.arange(1, segs[b, 2] - 5), size=len(lab), replace=False))):
            top[start:start + 3] = lab[j]
        peaky[b, np.arange(Tn), top] += rng.uniform(10, 20, size=Tn).astype(np.float32)
    graph, topo = ctc_graph(labels), ctc_topo(Cn - 1)

    @functools.partial(jax.jit, static_argnums=1)
    def graph_loss(x, beam):
        return jax.value_and_grad(lambda x: jnp.sum(ctc_loss(graph, DenseFsaVec(jax.nn.log_softmax(x), segs),
                                                             output_beam=beam, reduction="none",
                                                             use_double_scores=False)))(x)

    @jax.jit
    def topo_total(x):
        return jax.value_and_grad(lambda x: jnp.sum(dense_tot_scores(topo, DenseFsaVec(jax.nn.log_softmax(x), segs),
                                                                     use_double_scores=False)))(x)

    for name, x in (("peaky", peaky), ("normal", rng.normal(size=(Bn, Tn, Cn)).astype(np.float32))):
        xt = torch.tensor(x.astype(np.float64), requires_grad=True)
        ref = torch.nn.functional.ctc_loss(
            torch.log_softmax(xt, -1).transpose(0, 1), torch.tensor([lab + [0] * (6 - len(lab)) for lab in labels]),
            torch.tensor(segs[:, 2]), torch.tensor([len(lab) for lab in labels]), reduction="sum")
        ref.backward()
        ref = float(ref.detach())
        for beam in (None, 10.0):
            loss, grad = graph_loss(jnp.asarray(x), beam)
            assert np.isfinite(float(loss)) and np.all(np.isfinite(np.asarray(grad))), (name, beam)
            if beam is None:     # (beam 10 drops paths: compare only the exact total)
                np.testing.assert_allclose(float(loss), ref, rtol=5e-6, atol=5e-3, err_msg=name)
                np.testing.assert_allclose(np.asarray(grad), xt.grad.numpy(), atol=5e-4, err_msg=name)
        tot, g = topo_total(jnp.asarray(x))
        assert abs(float(tot)) < 1e-2 and float(np.abs(np.asarray(g)).max()) < 1e-4, name
