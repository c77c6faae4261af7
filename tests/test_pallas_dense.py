"""fsa_ops.pallas_dense against the XLA loops and path enumeration (tests/fsa_oracle.py); interpret mode on CPU, the
compiled kernels on a GPU.

Every kernel variant runs here: forward and backward, 'state' (labelled graphs) and 'arc' (general graphs) weights,
log and tropical semirings, with and without output_beam's prune masks, and the gradients of the Pallas path.
"""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fsa_oracle as oracle
from fsa_ops.dense import DenseFsaVec, dense_tot_scores, prepare_dense
from fsa_ops.dense_labelled import is_state_labelled
from fsa_ops.dense_loops import backward_loop, dense_graph, forward_loop, loop_input
from fsa_ops.fsa import Fsa, create_fsa_vec
from fsa_ops.graph_ctc import ctc_loss
from fsa_ops.graphs import ctc_graph
from fsa_ops.pallas_dense import next_pow2, pallas_available, resolve_implementation, slot_sizes

B, T, C = 3, 5, 5
SEGS = np.array([[0, 0, 5], [1, 0, 3], [2, 1, 4]], np.int32)


def _log_probs(seed=0):
    rng = np.random.default_rng(seed)
    return np.asarray(jax.nn.log_softmax(rng.normal(size=(B, T, C)).astype(np.float32) * 2))


def _general_graph(rng, S=4, A=9):
    """A random graph with self loops, parallel arcs, label 0 arcs and several arcs into the final state."""
    src = np.concatenate([rng.integers(0, S, A), [S - 1], rng.integers(0, S, 2)])
    dst = np.concatenate([rng.integers(0, S, A), [S], np.full(2, S)])
    lab = np.concatenate([rng.integers(0, C, A), [-1, -1, -1]])
    src[0], dst[0] = 0, 1
    src[1], dst[1] = src[0], dst[0]             # a parallel arc
    score = rng.normal(size=src.size).astype(np.float32)
    return Fsa.from_arcs(src, dst, lab, score, num_states=S + 1)


def _graphs():
    rng = np.random.default_rng(1)
    general = create_fsa_vec([_general_graph(rng) for _ in range(B)], pad_arcs_to=16)
    labelled = ctc_graph([[1, 2, 2], [3], [4, 1]])      # repeated label: two states of label 2
    return {"general": general, "labelled": labelled}


GRAPHS = _graphs()


def _paths(graph, lp, seg):
    """[(score, arcs, labels)] of the lattice paths of one segment: `dur` arcs with labels >= 0 (one per frame)
    then the arc with label -1."""
    n, start, dur = (int(x) for x in seg)
    out = []
    for p in oracle.enumerate_paths(graph, max_arcs=dur + 1):
        if len(p.arcs) == dur + 1 and p.labels[-1] == -1 and min(p.labels[:-1], default=0) >= 0:
            out.append((p.score + sum(float(lp[n, start + t, p.labels[t]]) for t in range(dur)), p.arcs, p.labels))
    return out


def _brute(graph_vec, lp):
    """Per segment: log-sum-exp and max over paths; d tot / d lp and d tot / d score of sum(tot)."""
    tot, best = np.zeros(B), np.zeros(B)
    g_lp = np.zeros(lp.shape)
    g_sc = np.zeros(np.asarray(graph_vec.score).shape)
    for b in range(B):
        paths = _paths(graph_vec[b], lp, SEGS[b])
        scores = np.array([s for s, _, _ in paths])
        tot[b], best[b] = np.logaddexp.reduce(scores), scores.max()
        for s, arcs, labels in paths:
            w = math.exp(s - tot[b])
            n, start, _ = SEGS[b]
            for t, (a, lab) in enumerate(zip(arcs, labels)):
                g_sc[b, a] += w
                if lab >= 0:
                    g_lp[n, start + t, lab] += w
    return tot, best, g_lp, g_sc


def _tot_and_grads(graph, lp, beam, impl):
    gj = graph.to_jax()

    def f(lp_, score):
        return dense_tot_scores(gj.replace(score=score), DenseFsaVec(lp_, SEGS), output_beam=beam,
                                use_double_scores=False, implementation=impl)
    tot, vjp = jax.vjp(f, jnp.asarray(lp), gj.score)
    return (tot,) + vjp(jnp.ones_like(tot))


def _close(a, b, tol=1e-5):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    both_inf = np.isneginf(a) & np.isneginf(b)
    np.testing.assert_allclose(np.where(both_inf, 0, a), np.where(both_inf, 0, b), rtol=tol, atol=tol)


@pytest.mark.parametrize("kind", ["labelled", "general"])
def test_pallas_tot_scores_and_grads_equal_xla_and_enumeration(kind):
    graph, lp = GRAPHS[kind], _log_probs()
    pallas = _tot_and_grads(graph, lp, math.inf, "pallas")
    for p, x in zip(pallas, _tot_and_grads(graph, lp, math.inf, "xla")):
        _close(p, x)
    tot, _, g_lp, g_sc = _brute(graph, lp)
    _close(pallas[0], tot, 1e-4)
    _close(pallas[1], g_lp, 1e-4)
    _close(pallas[2], g_sc, 1e-4)


@pytest.mark.parametrize("kind", ["labelled", "general"])
def test_pallas_output_beam_equals_xla(kind):
    """A finite output_beam runs the tropical (Viterbi) kernels for the prune tables, then the masked kernels."""
    graph, lp = GRAPHS[kind], _log_probs(2)
    for p, x in zip(_tot_and_grads(graph, lp, 1.0, "pallas"), _tot_and_grads(graph, lp, 1.0, "xla")):
        _close(p, x)


def _configs(kind, lp):
    cfg, arcs, lpp, dur = prepare_dense(GRAPHS[kind], DenseFsaVec(jnp.asarray(lp), SEGS), None, math.inf, False)
    cfg = cfg._replace(labelled=kind == "labelled")
    assert is_state_labelled(arcs, cfg.S) == (kind == "labelled")
    # blocks of one state per gather-reduce step (the default holds these graphs in one block)
    sizes = slot_sizes(arcs, cfg.S)[:4] + (2,)
    return cfg, cfg._replace(slots=sizes, interpret=not pallas_available()), arcs, lpp, dur


@pytest.mark.parametrize("kind", ["labelled", "general"])
def test_pallas_tropical_and_true_value_tables_equal_xla(kind):
    """The score tables themselves, both directions, max semiring, true values (the Viterbi tables of
    output_beam), the kernels looping over blocks of states; the best total equals the best enumerated path."""
    lp = _log_probs(3)
    xla_cfg, pallas_cfg, arcs, lpp, dur = _configs(kind, lp)

    @jax.jit
    def tables(lpp, dur):
        out = []
        for cfg in (xla_cfg, pallas_cfg):
            G = dense_graph(cfg, arcs)
            x = loop_input(cfg, arcs, lpp, dur)
            out.append(forward_loop(cfg, G, x, dur, False, true_values=True)
                       + (backward_loop(cfg, G, x, dur, False),))
        return out

    (x_best, x_amax, x_bmax), (p_best, p_amax, p_bmax) = tables(lpp, dur)
    _close(p_best, x_best)
    _close(p_amax, x_amax)
    _close(p_bmax, x_bmax)
    _close(p_best, _brute(GRAPHS[kind], lp)[1], 1e-4)


def test_slot_sizes_pad_to_powers_of_two_and_keep_final_arcs_apart():
    cfg, arcs, _, _ = prepare_dense(GRAPHS["general"], DenseFsaVec(jnp.asarray(_log_probs()), SEGS), None,
                                    math.inf, False)
    Sp, Kin, Kout, F, _ = slot_sizes(arcs, cfg.S)
    assert Sp == next_pow2(cfg.S) and all(k == next_pow2(k) for k in (Kin, Kout, F))
    src, dst, valid = np.asarray(arcs.src), np.asarray(arcs.dst), np.arange(arcs.src.shape[1]) < arcs.num_arcs[:, None]
    into_final = dst == (np.asarray(arcs.num_states)[:, None] - 1)
    assert F >= max(int((valid[b] & into_final[b]).sum()) for b in range(B))
    assert Kin >= max(np.bincount(dst[b][valid[b] & ~into_final[b]]).max() for b in range(B))
    assert Kout >= max(np.bincount(src[b][valid[b]]).max() for b in range(B))


def test_implementation_argument_is_checked():
    assert resolve_implementation("auto") == ("pallas" if jax.default_backend() == "gpu" else "xla")
    with pytest.raises(ValueError, match="implementation"):
        dense_tot_scores(GRAPHS["labelled"], DenseFsaVec(jnp.asarray(_log_probs()), SEGS), implementation="cuda")

    @jax.jit
    def traced(g, lp):
        return dense_tot_scores(g, DenseFsaVec(lp, SEGS), use_double_scores=False, implementation="pallas")
    with pytest.raises(ValueError, match="on the host"):
        traced(GRAPHS["labelled"].to_jax(), jnp.asarray(_log_probs()))


def test_graph_ctc_loss_passes_the_implementation_through():
    """k2.ctc_loss over ctc_graph: the Pallas path (interpret mode here) gives the XLA loss and gradient."""
    lp = jnp.asarray(_log_probs(3))
    graph = GRAPHS["labelled"]

    def loss(x, impl):
        return ctc_loss(graph, DenseFsaVec(x, SEGS), output_beam=math.inf, use_double_scores=False,
                        implementation=impl)

    ref, gref = jax.value_and_grad(loss)(lp, "xla")
    got, g = jax.value_and_grad(loss)(lp, "pallas")
    np.testing.assert_allclose(float(got), float(ref), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(g), np.asarray(gref), rtol=1e-5, atol=1e-6)
