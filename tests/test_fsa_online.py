"""fsa_ops.online (k2's OnlineDenseIntersecter) against intersect_dense_pruned / intersect_dense over the frames so
far, and brute-force path enumeration (partial results) on a tiny graph."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fsa_oracle as oracle
from fsa_ops.dense import DenseFsaVec, intersect_dense
from fsa_ops.fsa import Fsa
from fsa_ops.graphs import ctc_topo
from fsa_ops.online import DecodeStateInfo, OnlineDenseIntersecter
from fsa_ops.pruned import intersect_dense_pruned
from fsa_ops.ragged import Ragged
from fsa_ops.scores import get_tot_scores
from fsa_ops.shortest_path import shortest_path


def _chunk(lp, durs):
    """DenseFsaVec of one chunk: lp [N, T, C], stream n holding its first durs[n] frames."""
    return DenseFsaVec(jnp.asarray(lp, jnp.float32),
                       np.array([[n, 0, d] for n, d in enumerate(durs)], np.int32))


def _row(fsa, b, n):
    """The first n arcs of lattice b: (src, dst, label, score, aux_labels) as numpy."""
    out = [np.asarray(getattr(fsa, f))[b, :n] for f in ("src", "dst", "label", "score")]
    return out + [np.asarray(fsa.attrs["aux_labels"])[b, :n]]


def _same_lattice(a, i, b, j):
    assert int(a.num_states[i]) == int(b.num_states[j]) and int(a.num_arcs[i]) == int(b.num_arcs[j])
    n = int(a.num_arcs[i])
    ra, rb = _row(a, i, n), _row(b, j, n)
    for k in (0, 1, 2, 4):
        np.testing.assert_array_equal(ra[k], rb[k])
    np.testing.assert_array_equal(np.isfinite(ra[3]), np.isfinite(rb[3]))
    np.testing.assert_allclose(ra[3][np.isfinite(ra[3])], rb[3][np.isfinite(rb[3])], rtol=1e-6, atol=1e-6)


def test_k2_online_dense_intersecter():
    """k2's online_dense_intersecter_test (ctc_topo(9), 2 streams, 3 chunks of 5 frames, beams 10 / 2, active
    states 1..10), checked: each chunk's lattice equals intersect_dense_pruned over the frames so far, and its best
    path is the frame-wise argmax (ctc_topo accepts every sequence)."""
    vocab_size, num_streams, chunk_size, num_chunks = 10, 2, 5, 3
    graph = Fsa.from_fsas([ctc_topo(vocab_size - 1)])
    it = OnlineDenseIntersecter(decoding_graph=graph, num_streams=num_streams, search_beam=10, output_beam=2,
                                min_active_states=1, max_active_states=10)
    assert it.num_streams == num_streams
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(num_streams, num_chunks * chunk_size, vocab_size)).astype(np.float32)
    decode_states = [DecodeStateInfo()] * num_streams
    history = []
    for i in range(num_chunks):
        dense = _chunk(logits[:, i * chunk_size:(i + 1) * chunk_size], [chunk_size] * num_streams)
        ofsa, decode_states = it.decode(dense, decode_states)
        history.append((ofsa, list(decode_states)))
    # the reference: every prefix of both streams in one call
    segs = np.array([[n, 0, (i + 1) * chunk_size] for i in range(num_chunks) for n in range(num_streams)], np.int32)
    ref = intersect_dense_pruned(graph, DenseFsaVec(jnp.asarray(logits), segs), 10, 2, 1, 10)
    for i, (ofsa, _) in enumerate(history):
        for n in range(num_streams):
            _same_lattice(ofsa, n, ref, i * num_streams + n)
    best = shortest_path(history[-1][0], use_double_scores=False).to_numpy()
    for n in range(num_streams):
        np.testing.assert_array_equal(best[n].label[:-1], logits[n].argmax(-1))
        am = logits[n].argmax(-1)
        np.testing.assert_array_equal(best[n].aux_labels[:-1], np.where(am != np.r_[0, am[:-1]], am, 0))
        assert abs(float(np.sum(best[n].score)) - float(logits[n].max(-1).sum())) < 1e-4

    # states are values: decoding again from the states after chunk 2 (copied to numpy, as if saved) gives the
    # same lattice; a NaN log-prob in stream 1 makes all of its arcs NaN and leaves stream 0 alone
    states2 = history[1][1]
    again, _ = it.decode(_chunk(logits[:, 10:15], [5, 5]), [jax.tree.map(np.asarray, s) for s in states2])
    np.testing.assert_array_equal(np.asarray(again.score), np.asarray(history[2][0].score))
    bad = logits[:, 10:15].copy()
    bad[1, 2, 3] = np.nan
    lat, bad_states = it.decode(_chunk(bad, [5, 5]), states2)
    n1 = int(lat.num_arcs[1])
    assert np.isnan(np.asarray(lat.score)[1, :n1]).all()
    np.testing.assert_array_equal(np.asarray(lat.score)[0], np.asarray(history[2][0].score)[0])
    assert bool(bad_states[1].bad) and not bool(bad_states[0].bad)
    jax.tree.map(lambda x: x.shape, bad_states[0])      # a pytree


def _random_graph(rng, S=6, C=4):
    """A cyclic acceptor with aux_labels: a few random arcs per state, final arcs from states 2.. S-2."""
    src, dst, lab = [], [], []
    for s in range(S - 1):
        for _ in range(3):
            src.append(s)
            dst.append(int(rng.integers(0, S - 1)))
            lab.append(int(rng.integers(0, C)))
        if s >= 2:
            src.append(s)
            dst.append(S - 1)
            lab.append(-1)
    src, dst, lab = np.array(src), np.array(dst), np.array(lab)
    aux = np.where(lab == -1, -1, rng.integers(0, 9, len(lab)))
    return Fsa.from_arcs(src, dst, lab, rng.uniform(-1, 0, len(src)).astype(np.float32), num_states=S,
                         aux_labels=aux, attrs={"words": Ragged.from_lists(_words(aux))})


def _words(aux):
    """A Ragged attribute's rows, a function of aux_labels: [a, a + 10] for a > 0, else empty."""
    return [[int(a), int(a) + 10] if a > 0 else [] for a in aux]


def test_streams_joining_at_different_times_match_intersect_dense_pruned():
    """Three utterances (19, 9 and 6 frames) through 2 stream slots, chunks of 1..4 frames, a stream joining when
    the other is mid-utterance, an utterance moving between slots: after every chunk each stream's lattice equals
    intersect_dense_pruned over its frames so far, arc for arc (aux_labels and a Ragged attribute too), with
    pruning that bites."""
    rng = np.random.default_rng(1)
    C, T = 4, 19
    graph = _random_graph(rng, C=C)
    lens = [19, 9, 6]
    lp = np.asarray(jax.nn.log_softmax(jnp.asarray(rng.normal(size=(3, T, C)) * 2, jnp.float32)))
    it = OnlineDenseIntersecter(graph, 2, search_beam=2.0, output_beam=1.5, min_active_states=1,
                                max_active_states=3, allow_partial=False)
    # each call: (utterance, number of frames) per slot; utterance 1 moves from slot 1 to slot 0
    schedule = [((0, 4), (1, 3)), ((0, 2), (1, 4)), ((1, 2), (0, 4)), ((0, 4), (2, 1)), ((0, 4), (2, 4)),
                ((0, 1), (2, 1))]
    states, done, checks = {}, [0, 0, 0], []
    for step in schedule:
        chunk = np.full((2, 4, C), -np.inf, np.float32)
        for n, (u, k) in enumerate(step):
            chunk[n, :k] = lp[u, done[u]:done[u] + k]
        lat, new = it.decode(_chunk(chunk, [k for _, k in step]), [states.get(u) for u, _ in step])
        for n, (u, k) in enumerate(step):
            done[u] += k
            states[u] = new[n]
            checks.append((lat, n, u, done[u]))
    assert done == lens
    assert states[0].frame_scores.shape[0] == 24      # the capacity grew past 16 frames
    segs = np.array([[u, 0, f] for _, _, u, f in checks], np.int32)
    ref = intersect_dense_pruned(graph, DenseFsaVec(jnp.asarray(lp), segs), 2.0, 1.5, 1, 3)
    for j, (lat, n, _, _) in enumerate(checks):
        _same_lattice(lat, n, ref, j)
        m = int(lat.num_arcs[n])
        words = lat.attrs["words"]
        assert words[n].tolist()[:m] == _words(np.asarray(lat.aux_labels)[n, :m])     # Ragged rows follow the arcs
        assert words[n].tolist()[:m] == ref.attrs["words"][j].tolist()[:m]
    full = intersect_dense(graph, DenseFsaVec(jnp.asarray(lp), segs), output_beam=math.inf)
    n_pruned = np.isfinite(np.asarray(ref.score)).sum()
    assert 0 < n_pruned < np.isfinite(np.asarray(full.score)).sum()
    assert np.isfinite(np.asarray(get_tot_scores(ref, use_double_scores=False, log_semiring=False))).any()


# a tiny graph: final arcs only from state 2, reached after 2 frames, so that 1 frame gives partial results
TINY = Fsa.from_arcs(np.array([[0, 0, 1, -0.1], [0, 1, 2, -0.5], [1, 1, 2, -0.2], [1, 2, 3, -0.3], [2, 2, 0, -0.1],
                               [2, 3, -1, -0.2]]), num_states=4, aux_labels=np.array([1, 2, 0, 3, 0, -1]))


def _with_partial_arcs(g):
    """`g` plus, for every arc, a copy into the final state labelled -1 scored by the graph (partial paths)."""
    final = int(g.num_states) - 1
    rows = [(int(s), int(d), int(lb), float(w)) for s, d, lb, w in zip(g.src, g.dst, g.label, g.score)]
    rows += [(s, final, -1, w) for s, _, _, w in rows]
    return Fsa.from_arcs(np.array(rows, np.float64), num_states=final + 1)


def _brute(g, lp_u, F, log_semiring):
    """Total over the paths of exactly F frame arcs (label >= 0) and one arc into the final state."""
    vals = []
    for p in oracle.enumerate_paths(g, max_arcs=F + 1):
        if len(p.arcs) == F + 1 and p.labels[-1] == -1 and all(lb >= 0 for lb in p.labels[:-1]):
            vals.append(p.score + sum(float(lp_u[t, lb]) for t, lb in enumerate(p.labels[:-1])))
    if not vals:
        return -math.inf
    return float(np.logaddexp.reduce(vals)) if log_semiring else max(vals)


def test_partial_results_match_brute_force_and_wide_beams_match_intersect_dense():
    """Wide beams, one frame per call, k2's allow_partial=True: after F frames the lattice's total (log and
    tropical) is the brute-force total over F-frame paths ending with a final arc; when no state reachable in F
    frames has one, over F-frame paths followed by any arc (graph score only, label -1).  The complete lattices'
    totals equal intersect_dense's (no pruning); intersect_dense_pruned(allow_partial=True) gives the same lattices."""
    rng = np.random.default_rng(2)
    T, C = 6, 4
    lp = np.asarray(jax.nn.log_softmax(jnp.asarray(rng.normal(size=(2, T, C)), jnp.float32)))
    it = OnlineDenseIntersecter(TINY, 2, search_beam=1e9, output_beam=1e9, min_active_states=0,
                                max_active_states=4)
    partial_graph = _with_partial_arcs(TINY)
    states, lats = [None, None], []
    seen_partial = seen_final = False
    for F in range(1, T + 1):
        lat, states = it.decode(_chunk(lp[:, F - 1:F], [1, 1]), states)
        lats.append(lat)
        tot = np.asarray(get_tot_scores(lat, use_double_scores=False))
        best = np.asarray(get_tot_scores(lat, use_double_scores=False, log_semiring=False))
        for n in range(2):
            ref_log = _brute(TINY, lp[n], F, True)
            g = TINY
            if math.isinf(ref_log):
                g = partial_graph
                seen_partial = True
                assert np.isfinite(tot[n])
            else:
                seen_final = True
            assert abs(tot[n] - _brute(g, lp[n], F, True)) < 1e-4
            assert abs(best[n] - _brute(g, lp[n], F, False)) < 1e-4
    assert seen_partial and seen_final
    # the complete lattices: no pruning
    exact = intersect_dense(TINY, _chunk(lp, [T, T]), output_beam=math.inf)
    np.testing.assert_allclose(tot, np.asarray(get_tot_scores(exact, use_double_scores=False)), rtol=1e-5)
    # intersect_dense_pruned(allow_partial=True) over every prefix: the same lattices
    segs = np.array([[n, 0, F] for F in range(1, T + 1) for n in range(2)], np.int32)
    ref = intersect_dense_pruned(TINY, DenseFsaVec(jnp.asarray(lp), segs), 1e9, 1e9, 0, 4, allow_partial=True)
    for j, (F, n) in enumerate(segs[:, [2, 0]]):
        _same_lattice(lats[F - 1], n, ref, j)
    # F = 1: partial arcs labelled -1 with aux_labels the filler 0; with allow_partial=False no path
    first = lats[0]
    sc, lab, aux, dst = (np.asarray(x)[0, :int(first.num_arcs[0])] for x in (first.score, first.label,
                                                                                  first.aux_labels, first.dst))
    fin = np.isfinite(sc) & (dst == int(first.num_states[0]) - 1)
    assert fin.sum() == 4 and (lab[fin] == -1).all() and (aux[fin] == 0).all()   # every arc of states 0, 1
    no_partial = OnlineDenseIntersecter(TINY, 2, 1e9, 1e9, 0, 4, allow_partial=False)
    lat, _ = no_partial.decode(_chunk(lp[:, :1], [1, 1]), [None, None])
    assert np.isneginf(np.asarray(get_tot_scores(lat, use_double_scores=False))).all()


def test_bad_arguments():
    g = ctc_topo(3)
    with pytest.raises(TypeError, match="decoding_graph"):
        OnlineDenseIntersecter("g", 1, 10, 8, 1, 5)
    with pytest.raises(ValueError, match="decoding_graph: expected one FSA"):
        OnlineDenseIntersecter(Fsa.from_fsas([g, g]), 2, 10, 8, 1, 5)
    with pytest.raises(ValueError, match="num_streams"):
        OnlineDenseIntersecter(g, 0, 10, 8, 1, 5)
    with pytest.raises(ValueError, match="search_beam"):
        OnlineDenseIntersecter(g, 1, 0, 8, 1, 5)
    with pytest.raises(ValueError, match="min_active_states"):
        OnlineDenseIntersecter(g, 1, 10, 8, 6, 5)
    with pytest.raises(TypeError, match="allow_partial"):
        OnlineDenseIntersecter(g, 1, 10, 8, 1, 5, allow_partial="yes")
    it = OnlineDenseIntersecter(g, 2, 10, 8, 1, 5)
    ok = _chunk(np.zeros((2, 3, 4)), [3, 2])
    with pytest.raises(TypeError, match="dense_fsas"):
        it.decode(np.zeros((2, 3, 4)), [None, None])
    with pytest.raises(ValueError, match="dense_fsas: expected 2 segments"):
        it.decode(_chunk(np.zeros((1, 3, 4)), [3]), [None, None])
    with pytest.raises(ValueError, match="decode_states: expected 2 entries"):
        it.decode(ok, [None])
    with pytest.raises(TypeError, match=r"decode_states\[1\]"):
        it.decode(ok, [None, "state"])
    with pytest.raises(ValueError, match="labels must be < 3"):
        it.decode(_chunk(np.zeros((2, 3, 3)), [3, 3]), [None, None])
    other = OnlineDenseIntersecter(g, 1, 10, 8, 1, 3)
    foreign = DecodeStateInfo(np.zeros(3, np.int32), np.zeros(3, np.float32), np.zeros((), np.int32),
                              np.zeros((16, 3)), np.zeros((16, 3, 8)), np.zeros((16, 3, 8)), np.zeros((16, 3, 8)),
                              np.zeros((), bool))
    with pytest.raises(ValueError, match=r"decode_states\[0\]\.states: expected shape \(5,\)"):
        it.decode(ok, [foreign, None])
    assert other.num_streams == 1
