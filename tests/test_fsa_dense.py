"""fsa_ops.dense / graph_ctc / pruned against brute force (graph paths x frames), optax and jasr.ctc_loss."""
import functools
import math
import warnings
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fsa_oracle as oracle
from fsa_ops import dense as dense_mod
from fsa_ops import dense_band
from fsa_ops.dense import DenseFsaVec, dense_tot_scores, intersect_dense, prepare_dense
from fsa_ops.dense_band import band_offsets
from fsa_ops.dense_labelled import is_state_labelled, label_gather_plan
from fsa_ops.fsa import Fsa, create_fsa_vec
from fsa_ops.graph_ctc import ctc_loss
from fsa_ops.graphs import ctc_graph, ctc_topo
from fsa_ops.pruned import intersect_dense_pruned
from fsa_ops import scores as scores_mod
from fsa_ops.scores import Float32ScoresWarning, fsa_arrays, get_forward_scores, get_tot_scores
from fsa_ops.shortest_path import shortest_path

B, N, T, C = 3, 2, 4, 5
A_PAD, S_PAD = 12, 6
SETTINGS = settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _pad(fsas):
    return create_fsa_vec(list(fsas), pad_arcs_to=A_PAD, max_states=S_PAD)


graphs = st.lists(oracle.random_fsas(min_states=2, max_states=5, max_arcs=10, num_labels=C - 1,
                                     acyclic=False, aux_labels=True), min_size=B, max_size=B).map(_pad)


@st.composite
def dense_inputs(draw):
    lp = np.array(draw(st.lists(st.floats(-3, 0, width=32), min_size=N * T * C, max_size=N * T * C)),
                  np.float32).reshape(N, T, C)
    segs = []
    for _ in range(B):
        d = draw(st.integers(1, T))
        s = draw(st.integers(0, T - d))
        segs.append((draw(st.integers(0, N - 1)), s, d))
    return lp, np.array(segs, np.int32)


def _brute(graph, lp, seg, beam=math.inf):
    """Enumerate graph paths of exactly `dur` frame arcs + the final arc.

    Returns (tot, best, grad_lp [N,T,C], grad_score [A], best_path or None) for one segment.
    """
    n, start, dur = (int(x) for x in seg)
    paths = []
    for p in oracle.enumerate_paths(graph, max_arcs=dur + 1):
        if len(p.arcs) != dur + 1 or p.labels[-1] != -1 or any(l < 0 for l in p.labels[:-1]):
            continue
        sc = p.score + sum(float(lp[n, start + t, p.labels[t]]) for t in range(dur))
        paths.append((sc, p))
    g_lp = np.zeros(lp.shape)
    g_sc = np.zeros(len(graph.src))
    if not paths:
        return -math.inf, -math.inf, g_lp, g_sc, None
    best = max(s for s, _ in paths)
    if math.isfinite(beam):
        # best score through each (frame, arc); keep paths all of whose (frame, arc) pass the cut
        through = {}
        for s, p in paths:
            for t, a in enumerate(p.arcs):
                through[(t, a)] = max(through.get((t, a), -math.inf), s)
        paths = [(s, p) for s, p in paths if all(through[(t, a)] > best - beam
                                                 for t, a in enumerate(p.arcs))]
    tot = float(np.logaddexp.reduce([s for s, _ in paths]))
    for s, p in paths:
        w = math.exp(s - tot)
        for t, a in enumerate(p.arcs):
            g_sc[a] += w
            if t < dur:
                g_lp[n, start + t, p.labels[t]] += w
    best_path = max(paths, key=lambda x: x[0])[1]
    return tot, best, g_lp, g_sc, best_path


def _close(a, b, tol=1e-4):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    inf = np.isneginf(a) & np.isneginf(b)
    np.testing.assert_allclose(np.where(inf, 0, a), np.where(inf, 0, b), atol=tol, rtol=tol)


def _tot_and_grads(graph, lp, segs, beam):
    gj = graph.to_jax()

    def f(lp_, score):
        return jnp.sum(dense_tot_scores(gj.replace(score=score), DenseFsaVec(lp_, segs), output_beam=beam))
    tot = dense_tot_scores(gj, DenseFsaVec(lp, segs), output_beam=beam)
    g_lp, g_sc = jax.grad(f, argnums=(0, 1))(jnp.asarray(lp), gj.score)
    return tot, g_lp, g_sc


@functools.partial(jax.jit, static_argnums=3)
def _traced_tot_and_grads(g, lp, segs, beam):
    """Graphs traced inside jit: the segment (scatter) layout instead of the host-built tables."""
    def f(lp_, score):
        return jnp.sum(dense_tot_scores(g.replace(score=score), DenseFsaVec(lp_, segs), output_beam=beam))
    return dense_tot_scores(g, DenseFsaVec(lp, segs), output_beam=beam), jax.grad(f, argnums=(0, 1))(lp, g.score)


@settings(SETTINGS, max_examples=12)
@given(graphs, dense_inputs(), st.sampled_from([math.inf, 1.0]))
def test_dense_tot_scores_and_grads_match_enumeration(graph, dense, beam):
    lp, segs = dense
    tot, g_lp, g_sc = _tot_and_grads(graph, lp, segs, beam)
    t_tot, (t_glp, t_gsc) = _traced_tot_and_grads(graph.to_jax(), jnp.asarray(lp), jnp.asarray(segs), beam)
    _close(t_tot, tot)
    _close(t_glp, g_lp)
    _close(t_gsc, g_sc)
    assert not np.any(np.isnan(np.asarray(g_lp))) and not np.any(np.isnan(np.asarray(g_sc)))
    _assert_matches_brute(graph, lp, [_brute(graph[b], lp, segs[b], beam) for b in range(B)], tot, g_lp, g_sc)


def _assert_matches_brute(graph, lp, refs, tot, g_lp, g_sc):
    """Totals, d/d log-probs and d/d arc scores equal the enumeration `refs` (one `_brute` per
    segment); padded arc slots get gradient 0."""
    ref_glp = np.zeros(lp.shape)
    for b, (r_tot, _, r_glp, r_gsc, _) in enumerate(refs):
        _close(tot[b], r_tot)
        ref_glp += r_glp
        na = int(graph.num_arcs[b])
        _close(g_sc[b, :na], r_gsc, 2e-4)
        assert np.all(np.asarray(g_sc[b, na:]) == 0)
    _close(g_lp, ref_glp, 2e-4)


def _label_by_state(graph, state_labels):
    """Every arc into state s gets label state_labels[b][s] (arcs into the final state keep -1)."""
    lab, dst = np.asarray(graph.label), np.asarray(graph.dst)
    per_state = np.asarray(state_labels, np.int32).reshape(B, S_PAD)
    new = np.where(lab < 0, lab, np.take_along_axis(per_state, np.clip(dst, 0, S_PAD - 1), axis=1))
    return graph.replace(label=new.astype(np.int32))


def _without_parallel_arcs(graph):
    """The same graphs keeping only the first arc of each (src, dst) pair (band layout applies)."""
    out = []
    for b in range(B):
        g = graph[b]
        src, dst = np.asarray(g.src), np.asarray(g.dst)
        _, first = np.unique(src.astype(np.int64) * S_PAD + dst, return_index=True)
        keep = np.sort(first)
        out.append(Fsa.from_arcs(src[keep], dst[keep], np.asarray(g.label)[keep], np.asarray(g.score)[keep],
                                 num_states=int(g.num_states),
                                 attrs={k: np.asarray(v)[keep] for k, v in g.attrs.items()}))
    return _pad(out)


labelled_graphs = st.tuples(graphs, st.lists(st.integers(0, C - 1), min_size=B * S_PAD, max_size=B * S_PAD),
                            st.booleans()).map(
    lambda x: _label_by_state(_without_parallel_arcs(x[0]) if x[2] else x[0], x[1]))


@settings(SETTINGS, max_examples=10)
@given(labelled_graphs, dense_inputs(), st.sampled_from([math.inf, 1.0]))
def test_state_labelled_paths_match_enumeration(graph, dense, beam):
    """Graphs whose arcs into a state share one label take the labelled path (state emissions,
    occupancy gradient), with the band layout where few dst - src offsets occur: both give the
    brute-force totals and gradients."""
    lp, segs = dense
    arcs, S, _ = fsa_arrays(graph.to_jax())
    assert is_state_labelled(arcs, S)
    refs = [_brute(graph[b], lp, segs[b], beam) for b in range(B)]
    for max_band in (0, 2 * S_PAD):      # 0: labelled degree tables; else band when no parallel arcs
        with mock.patch.object(dense_band, "MAX_BAND", max_band):
            pairs = {(b, int(u), int(v)) for b in range(B)
                     for u, v in zip(np.asarray(graph.src[b, :int(graph.num_arcs[b])]),
                                     np.asarray(graph.dst[b, :int(graph.num_arcs[b])]))}
            parallel = len(pairs) < int(np.sum(graph.num_arcs))
            assert (band_offsets(arcs, S) is None) == (max_band == 0 or parallel)
            tot, g_lp, g_sc = _tot_and_grads(graph, lp, segs, beam)
        _assert_matches_brute(graph, lp, refs, tot, g_lp, g_sc)


def test_label_gather_plan_of_a_ctc_graph_with_repeated_labels():
    """Blank states sum into column 0; a label's first state is gathered after its repeats (states
    5 and 7 for the second and third 1) were folded into it; fold lists padded with S."""
    arcs, S, _ = fsa_arrays(ctc_graph([[1, 2, 1, 1], [3]]))
    major, first, fold_src, fold_dst = (np.asarray(x) for x in label_gather_plan(arcs, S, 5))
    assert major.tolist() == [0, 0] and S == 10
    assert first.tolist() == [[S, 1, 3, S, S], [S, S, S, 1, S]]
    assert fold_src.tolist() == [[5, 7], [S, S]] and fold_dst.tolist() == [[1, 1], [S, S]]


def test_band_layout_is_taken_for_ctc_graphs_and_refused_for_parallel_arcs():
    arcs, S, _ = fsa_arrays(ctc_graph([[1, 2, 2], [3]]))
    assert is_state_labelled(arcs, S) and band_offsets(arcs, S) == (0, 1, 2)
    twin = Fsa.from_str("0 1 1 0.5\n0 1 1 -0.5\n1 2 -1 0\n2")
    arcs, S, _ = fsa_arrays(twin)
    assert is_state_labelled(arcs, S) and band_offsets(arcs, S) is None
    arcs, S, _ = fsa_arrays(ctc_topo(3))
    assert is_state_labelled(arcs, S)


@jax.jit
def _jit_tot(g, lp, segs):
    return dense_tot_scores(g, DenseFsaVec(lp, segs))


@settings(SETTINGS, max_examples=8)
@given(graphs, dense_inputs())
def test_lattice_matches_enumeration(graph, dense):
    """intersect_dense's lattice: total scores (log/tropical) and best path; traced (segment) path."""
    lp, segs = dense
    dv = DenseFsaVec(lp, segs)
    lat = intersect_dense(graph, dv, output_beam=1.5, frame_idx_name="frame")
    tot_log = get_tot_scores(intersect_dense(graph, dv, output_beam=math.inf))
    tot_trop = get_tot_scores(lat, log_semiring=False)
    traced = _jit_tot(graph.to_jax(), jnp.asarray(lp), jnp.asarray(segs))
    best = shortest_path(lat).to_numpy()
    for b in range(B):
        r_tot, r_best, _, _, r_path = _brute(graph[b], lp, segs[b])
        _close(tot_log[b], r_tot)
        _close(traced[b], r_tot)
        _close(tot_trop[b], r_best)
        if r_path is None:
            assert int(best.num_states[b]) == 0
            continue
        p = best[b]
        assert abs(float(np.sum(p.score)) - r_best) < 1e-4
        assert int(p.num_states) == int(segs[b, 2]) + 2
        np.testing.assert_array_equal(p.attrs["frame"], np.arange(int(segs[b, 2]) + 1))
        assert p.label[-1] == -1 and p.attrs["aux_labels"][-1] == -1


@settings(SETTINGS, max_examples=6)
@given(graphs, dense_inputs(), st.sampled_from([math.inf, 1.0]), st.data())
def test_nonfinite_log_prob_or_graph_score_makes_its_segments_nan(graph, dense, beam, data):
    """A NaN or +inf log-prob in a valid frame (any symbol, used by the graph or not), or a NaN
    score on a real graph arc: every segment that contains it has a NaN total (host-built and
    traced layouts, pruned or not, and the totals of its intersect_dense and intersect_dense_pruned
    lattices) and NaN gradients
    on its valid frames and real arcs; the other segments still match the enumeration."""
    lp, segs = dense
    lp = lp.copy()
    b = data.draw(st.integers(0, B - 1))
    n, start, dur = (int(x) for x in segs[b])
    score = np.array(graph.score, np.float32)
    if data.draw(st.booleans()):
        t, c = start + data.draw(st.integers(0, dur - 1)), data.draw(st.integers(0, C - 1))
        lp[n, t, c] = data.draw(st.sampled_from([np.nan, np.inf]))
        bad = np.array([segs[o, 0] == n and segs[o, 1] <= t < segs[o, 1] + segs[o, 2] for o in range(B)])
    else:
        score[b, data.draw(st.integers(0, int(graph.num_arcs[b]) - 1))] = np.nan
        bad = np.arange(B) == b
    graph = graph.replace(score=score)
    tot, g_lp, g_sc = map(np.asarray, _tot_and_grads(graph, lp, segs, beam))
    t_tot, (t_glp, t_gsc) = _traced_tot_and_grads(graph.to_jax(), jnp.asarray(lp), jnp.asarray(segs), beam)
    lat_tot = np.asarray(get_tot_scores(intersect_dense(graph, DenseFsaVec(lp, segs), output_beam=beam)))
    pruned_tot = np.asarray(get_tot_scores(intersect_dense_pruned(
        graph, DenseFsaVec(lp, segs), search_beam=1e9, output_beam=1e9, min_active_states=0,
        max_active_states=S_PAD)))
    bad_frames = np.zeros(lp.shape[:2], bool)
    for o in np.flatnonzero(bad):
        bad_frames[segs[o, 0], segs[o, 1]:segs[o, 1] + segs[o, 2]] = True
    for o in range(B):
        na = int(graph.num_arcs[o])
        for x in (tot, np.asarray(t_tot), lat_tot, pruned_tot):
            assert np.isnan(x[o]) == bad[o], (o, x)
        for x in (g_sc, np.asarray(t_gsc)):
            assert np.all(np.isnan(x[o, :na]) == bad[o]) and np.all(x[o, na:] == 0)
    for x in (g_lp, np.asarray(t_glp)):
        np.testing.assert_array_equal(np.all(np.isnan(x), axis=-1), bad_frames)
        assert not np.any(np.isnan(x[~bad_frames]))
    good = np.flatnonzero(~bad)
    ref_glp = np.zeros(lp.shape)
    for o in good:
        r_tot, _, r_glp, r_gsc, _ = _brute(graph[o], lp, segs[o], beam)
        _close(tot[o], r_tot)
        _close(t_tot[o], r_tot)
        _close(pruned_tot[o], _brute(graph[o], lp, segs[o])[0])
        if not math.isfinite(beam):
            _close(lat_tot[o], r_tot)
        _close(g_sc[o, :int(graph.num_arcs[o])], r_gsc, 2e-4)
        ref_glp += r_glp
    _close(g_lp[~bad_frames], ref_glp[~bad_frames], 2e-4)




@pytest.mark.parametrize("labelled", [False, True])
def test_mixed_layouts_for_a_denominator_like_graph(monkeypatch, labelled):
    """Every state has an arc into the final state: the forward direction's degree table would be
    mostly padding and uses the segment layout, the backward one the table; same numbers as both
    tables (also for a state-labelled graph, which takes the labelled path)."""
    rng = np.random.default_rng(3)
    S, C, T = 30, 6, 7
    src = np.concatenate([np.repeat(np.arange(S), 2), np.arange(S)])
    dst = np.concatenate([rng.integers(0, S, size=2 * S), np.full(S, S)])
    lab = np.concatenate([rng.integers(0, C, size=2 * S), np.full(S, -1)])
    if labelled:
        lab = np.where(lab < 0, lab, rng.integers(0, C, size=S + 1)[dst])
    graph = Fsa.from_arcs(src, dst, lab, rng.normal(size=src.size).astype(np.float32) * 0.3, num_states=S + 1)
    lp = jax.nn.log_softmax(jnp.asarray(rng.normal(size=(2, T, C)).astype(np.float32)))
    segs = np.array([[0, 0, T], [1, 0, T - 2]], np.int32)
    cfg, arcs = prepare_dense(graph, DenseFsaVec(lp, segs), None, math.inf, True)[:2]
    assert cfg.kin is None and cfg.kout is not None
    assert is_state_labelled(arcs, cfg.S) == labelled

    def value_and_grad():
        f = lambda x, s: jnp.sum(dense_tot_scores(graph.replace(score=s), DenseFsaVec(x, segs)))
        return jax.value_and_grad(f, argnums=(0, 1))(lp, jnp.asarray(graph.score))

    (v1, g1) = value_and_grad()
    monkeypatch.setattr(dense_mod, "TABLE_PADDING", 10 ** 9)
    (v2, g2) = value_and_grad()
    assert np.isfinite(float(v1))
    np.testing.assert_allclose(v1, v2, rtol=1e-6)
    for a, b in zip(g1, g2):
        np.testing.assert_allclose(a, b, atol=1e-6)


def test_impossible_segment_and_errors():
    g = ctc_graph([[1, 1, 1]])        # needs >= 5 frames
    lp = jax.nn.log_softmax(jnp.zeros((1, 4, 3)))
    dv = DenseFsaVec(lp, np.array([[0, 0, 4]], np.int32))
    loss = ctc_loss(g, dv, reduction="none")
    assert np.isposinf(float(loss[0]))
    gr = jax.grad(lambda x: jnp.sum(jnp.where(jnp.isfinite(l := dense_tot_scores(
        g, DenseFsaVec(x, np.array([[0, 0, 4]], np.int32)))), l, 0.0)))(lp)
    assert not np.any(np.isnan(np.asarray(gr))) and np.all(np.asarray(gr) == 0)
    with pytest.raises(ValueError, match="duration"):
        DenseFsaVec(lp, np.array([[0, 0, 0]], np.int32))
    with pytest.raises(ValueError, match="start_frame"):
        DenseFsaVec(lp, np.array([[0, 2, 3]], np.int32))
    with pytest.raises(ValueError, match="sequence_index"):
        DenseFsaVec(lp, np.array([[1, 0, 3]], np.int32))
    with pytest.raises(ValueError, match="labels must be in"):
        dense_tot_scores(ctc_graph([[7]]), dv)
    with pytest.raises(ValueError, match="graphs for"):
        dense_tot_scores(ctc_graph([[1], [2]]), DenseFsaVec(jnp.zeros((3, 4, 3)), np.array(
            [[0, 0, 4], [1, 0, 4], [2, 0, 4]], np.int32)))
    with pytest.raises(ValueError, match="reduction"):
        ctc_loss(g, dv, reduction="avg")
    # allow_truncate shortens a segment running past the end
    d2 = DenseFsaVec(lp, np.array([[0, 1, 4]], np.int32), allow_truncate=1)
    assert int(d2.duration[0]) == 3


def test_a_to_b_map_and_finite_differences():
    rng = np.random.default_rng(1)
    lp = jax.nn.log_softmax(jnp.asarray(rng.normal(size=(2, 5, 4)), jnp.float32))
    segs = np.array([[0, 0, 5], [1, 1, 4]], np.int32)
    dv = DenseFsaVec(lp, segs)
    g = Fsa.from_str("0 0 0 0.1\n0 1 1 -0.2\n1 1 1 0.3\n1 0 2 0.5\n1 2 -1 0\n0 2 -1 -0.1\n2")
    gv = create_fsa_vec([g, g, g])
    t_map = dense_tot_scores(gv, dv, a_to_b_map=np.array([1, 0, 1], np.int32))
    t_shared = dense_tot_scores(g, dv)
    np.testing.assert_allclose(t_map, np.asarray(t_shared)[[1, 0, 1]], rtol=1e-6)
    gj = create_fsa_vec([g]).to_jax()

    def f(score, x):
        return jnp.sum(dense_tot_scores(gj.replace(score=score), DenseFsaVec(x, segs), output_beam=20.0))

    gs, gx = jax.grad(f, argnums=(0, 1))(gj.score, lp)
    eps = 1e-2
    base = np.asarray(gj.score, np.float64)
    for i in range(base.shape[1]):
        d = np.zeros_like(base)
        d[0, i] = eps
        fd = (f(jnp.asarray(base + d, jnp.float32), lp) - f(jnp.asarray(base - d, jnp.float32), lp)) / (2 * eps)
        assert abs(float(fd) - float(gs[0, i])) < 5e-3, (i, float(fd), float(gs[0, i]))
    for (n, t, c) in [(0, 0, 0), (0, 3, 1), (1, 2, 2), (1, 4, 1)]:
        d = np.zeros(lp.shape, np.float32)
        d[n, t, c] = eps
        fd = (f(gj.score, lp + d) - f(gj.score, lp - d)) / (2 * eps)
        assert abs(float(fd) - float(gx[n, t, c])) < 5e-3, ((n, t, c), float(fd), float(gx[n, t, c]))


# ------------------------------------------------------------------ intersect_dense_pruned
def _greedy_k1(graph, lp, seg):
    """Reference beam search with one active state (max_active_states=1): plain Python."""
    n, start, dur = (int(x) for x in seg)
    f = graph.to_numpy()
    na = int(f.num_arcs)
    state, score = 0, 0.0
    for t in range(dur + 1):
        cand = {}
        for a in range(na):
            if f.src[a] != state:
                continue
            lab = int(f.label[a])
            if (t < dur) != (lab >= 0):
                continue
            s = score + float(f.score[a]) + (float(lp[n, start + t, lab]) if lab >= 0 else 0.0)
            cand[int(f.dst[a])] = max(cand.get(int(f.dst[a]), -math.inf), s)
        if not cand:
            return -math.inf
        ranked = sorted(cand.values(), reverse=True)
        if len(ranked) > 1 and ranked[0] - ranked[1] < 1e-4:
            return None       # a tie: which state survives is arbitrary (both searches are right)
        state, score = max(cand.items(), key=lambda x: x[1])
    return score


@settings(SETTINGS, max_examples=8)
@given(graphs, dense_inputs())
def test_pruned_wide_beam_equals_intersect_dense_and_k1_is_greedy(graph, dense):
    lp, segs = dense
    dv = DenseFsaVec(lp, segs)
    wide = intersect_dense_pruned(graph, dv, search_beam=1e9, output_beam=1e9, min_active_states=0,
                                  max_active_states=S_PAD, frame_idx_name="frame")
    tot_log = get_tot_scores(wide)
    tot_trop = get_tot_scores(wide, log_semiring=False)
    ref_log = dense_tot_scores(graph, dv)
    k1 = get_tot_scores(intersect_dense_pruned(graph, dv, search_beam=1e-3, output_beam=1e9,
                                               min_active_states=1, max_active_states=1), log_semiring=False)
    for b in range(B):
        r_tot, r_best, _, _, _ = _brute(graph[b], lp, segs[b])
        _close(tot_log[b], r_tot)
        _close(ref_log[b], r_tot)
        _close(tot_trop[b], r_best)
        g1 = _greedy_k1(graph[b], lp, segs[b])
        if g1 is None:
            assert float(k1[b]) <= r_best + 1e-4
        elif math.isfinite(g1):
            # ties between equally good states may be broken differently: compare scores only
            assert float(k1[b]) <= r_best + 1e-4
            _close(k1[b], g1)
        else:
            assert np.isneginf(float(k1[b]))


def test_pruned_decodes_ctc_best_path_and_honours_min_active():
    rng = np.random.default_rng(3)
    Tn, Cn = 10, 5
    lp = jax.nn.log_softmax(jnp.asarray(rng.normal(size=(2, Tn, Cn)) * 3, jnp.float32))
    segs = np.array([[0, 0, Tn], [1, 0, 7]], np.int32)
    dv = DenseFsaVec(lp, segs)
    topo = ctc_topo(Cn - 1)
    lat = intersect_dense_pruned(topo, dv, search_beam=20, output_beam=8, min_active_states=2,
                                 max_active_states=3)
    best = shortest_path(lat).to_numpy()
    # ctc_topo accepts every label sequence: the best path is the frame-wise argmax (greedy CTC)
    am = np.asarray(jnp.argmax(lp, -1))
    for b in range(2):
        d = int(segs[b, 2])
        np.testing.assert_array_equal(best[b].label[:-1], am[b, :d])
        assert abs(float(np.sum(best[b].score)) - float(np.max(lp[b, :d], -1).sum())) < 1e-4
    # a tiny search beam keeps only the best state per frame ... unless min_active_states asks more
    fw = get_forward_scores(intersect_dense_pruned(topo, dv, 1e-6, 1e9, 2, 3), log_semiring=False)
    fw1 = get_forward_scores(intersect_dense_pruned(topo, dv, 1e-6, 1e9, 1, 3), log_semiring=False)
    per_frame = np.isfinite(np.asarray(fw)[:, :-1].reshape(2, Tn + 1, 3)).sum(-1)
    per_frame1 = np.isfinite(np.asarray(fw1)[:, :-1].reshape(2, Tn + 1, 3)).sum(-1)
    assert per_frame[0, 1:Tn].min() >= 2 and per_frame1[0, 1:Tn].max() <= 1
    with pytest.raises(ValueError, match="min_active_states"):
        intersect_dense_pruned(topo, dv, 10, 8, 5, 3)


def test_double_scores_without_x64_warn_once_for_the_users_option(monkeypatch):
    """dense_tot_scores and k2.ctc_loss take use_double_scores=True by default (as k2): without
    x64 they compute in float32 and warn once; intersect_dense / intersect_dense_pruned have no
    such option and never warn."""
    lp = jax.nn.log_softmax(jnp.zeros((2, 6, 4), jnp.float32))
    g = ctc_graph([[1, 2], [3, 3, 1]])
    dv = DenseFsaVec(lp, np.array([[0, 0, 6], [1, 0, 5]], np.int32))
    for fn in (lambda: dense_tot_scores(g, dv), lambda: ctc_loss(g, dv, output_beam=None)):
        monkeypatch.setattr(scores_mod, "_warned_float32", False)
        with pytest.warns(Float32ScoresWarning, match="jax_enable_x64"):
            assert fn().dtype == jnp.float32
        with warnings.catch_warnings():
            warnings.simplefilter("error", Float32ScoresWarning)
            fn()                                    # once per process
    monkeypatch.setattr(scores_mod, "_warned_float32", False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", Float32ScoresWarning)
        dense_tot_scores(g, dv, use_double_scores=False)
        ctc_loss(g, dv, use_double_scores=False)
        intersect_dense(g, dv, output_beam=10.0)
        intersect_dense_pruned(g, dv, 20, 8, 1, 10)
