"""fsa_ops Nbest, levenshtein_alignment and mwer_loss: k2's levenshtein_alignment_test.py and mwer_test.py ported
(k2's fixed sampling positions), and brute-force checks (tests/fsa_oracle.py, a Python edit distance)."""
import math
import random

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings

import fsa_ops as k2
from fsa_ops.mwer import levenshtein_alignment, mwer_loss
from fsa_ops.nbest import Nbest, NbestShape, PathScores
from fsa_ops.ragged import Ragged
from fsa_ops.random_paths import k2_path_positions
from tests.fsa_oracle import enumerate_paths, random_fsa_vecs, weighted_language

pytestmark = pytest.mark.filterwarnings("ignore::fsa_ops.scores.Float32ScoresWarning")

# k2's mwer_test lattice: words 10/20 then 30/40; arcs 0 and 1 both carry word 10
S_MWER = """
0 1 1 10 -2.3026
0 1 5 10 -0.6931
0 1 2 20 -1.6094
1 2 3 30 -1.2040
1 2 4 40 -0.9163
2 3 -1 -1 -0.6931
3
"""

# a lattice with epsilon (0) words and several paths per word sequence
S_LAT = """
0 1 1 1 -0.5
0 1 2 0 -1.0
0 2 3 2 -1.5
1 2 4 2 -0.2
1 2 5 0 -0.6
1 3 6 3 -2.5
2 3 7 3 -0.1
2 3 8 0 -1.2
3 4 -1 -1 0.0
4
"""


def levenshtein_distance(a, b):
    d = list(range(len(b) + 1))
    for i in range(1, len(a) + 1):
        prev, d[0] = d[0], i
        for j in range(1, len(b) + 1):
            prev, d[j] = d[j], min(d[j] + 1, d[j - 1] + 1, prev + (a[i - 1] != b[j - 1]))
    return d[-1]


def _words_of(fsa, path):
    aux = fsa.attrs["aux_labels"]
    return tuple(int(aux[i]) for i in path.arcs if aux[i] > 0)


# ------------------------------------------------------------------ levenshtein_alignment (k2's test)
def test_k2_levenshtein_alignment():
    refs = k2.levenshtein_graph([[1, 2, 3, 4, 5]])
    hyps = k2.levenshtein_graph([[1, 2, 3, 3, 5], [1, 2, 4, 5], [1, 2, 3, 4, 5, 6]])
    al = levenshtein_alignment(refs, hyps, hyp_to_ref_map=np.array([0, 0, 0], np.int32), sorted_match_ref=True)

    def flat(x):
        x, n = np.asarray(x), np.asarray(al.num_arcs)
        return np.concatenate([x[i, :n[i]] for i in range(len(n))]).tolist()
    assert flat(al.label) == [1, 2, 3, 0, 5, -1, 1, 2, 0, 4, 5, -1, 1, 2, 3, 4, 5, 0, -1]
    assert flat(al.attrs["ref_labels"]) == [1, 2, 3, 4, 5, -1, 1, 2, 3, 4, 5, -1, 1, 2, 3, 4, 5, 0, -1]
    assert flat(al.attrs["hyp_labels"]) == [1, 2, 3, 3, 5, -1, 1, 2, 0, 4, 5, -1, 1, 2, 3, 4, 5, 6, -1]
    np.testing.assert_allclose(-k2.get_tot_scores(al, False, False), [1, 1, 1])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_k2_levenshtein_distance(seed):
    rng = random.Random(seed)
    refs_vec = [[rng.randint(1, 5) for _ in range(rng.randint(2, 8))] for _ in range(2)]
    hyps_vec = [[rng.randint(1, 5) for _ in range(rng.randint(0, 8))] for _ in range(5)]
    ref_map = np.array([rng.randint(0, 1) for _ in hyps_vec], np.int32)
    al = levenshtein_alignment(k2.levenshtein_graph(refs_vec), k2.levenshtein_graph(hyps_vec), ref_map, True)
    expected = [levenshtein_distance(refs_vec[r], h) for r, h in zip(ref_map, hyps_vec)]
    np.testing.assert_allclose(-np.asarray(k2.get_tot_scores(al, False, False)), expected)
    # the alignment spells out ref and hyp, and labels are the matches
    for i, h in enumerate(hyps_vec):
        n = int(al.num_arcs[i])
        ref_l, hyp_l, lab = (np.asarray(x)[i, :n].tolist() for x in (al.attrs["ref_labels"], al.attrs["hyp_labels"],
                                                                      al.label))
        assert [x for x in ref_l if x > 0] == refs_vec[ref_map[i]] and [x for x in hyp_l if x > 0] == h
        assert all(lb == (r if r == y else 0) for lb, r, y in zip(lab, ref_l, hyp_l))


def test_levenshtein_alignment_bad_input():
    refs = k2.levenshtein_graph([[1, 2]])
    hyps = k2.levenshtein_graph([[1], [2]])
    with pytest.raises(ValueError, match="hyp_to_ref_map"):
        levenshtein_alignment(refs, hyps, np.array([0, 1]))
    with pytest.raises(ValueError, match="hyp_to_ref_map"):
        levenshtein_alignment(refs, hyps, np.array([0]))
    with pytest.raises(ValueError, match="hyps"):
        levenshtein_alignment(refs, k2.create_fsa_vec([k2.linear_fsa([1])]), np.array([0]))


# ------------------------------------------------------------------ Nbest
def _mwer_lattice():
    f = k2.Fsa.from_str(S_MWER, acceptor=False)
    return k2.create_fsa_vec([f, f])


def test_from_lattice_k2_positions():
    lat = _mwer_lattice()
    nb = Nbest.from_lattice(lat, 200, positions=k2_path_positions(2, 200), nbest_scale=1.0)
    assert str(nb) == "Nbest(num_seqs:2, num_fsas:8)"
    assert nb.shape == NbestShape([0, 4, 8]) and nb.shape.row_ids(1).tolist() == [0] * 4 + [1] * 4
    assert nb.words() == [[10, 30], [10, 40], [20, 30], [20, 40]] * 2
    assert nb.kept_path.tolist() == [[0, 3, 5], [0, 4, 5], [2, 3, 5], [2, 4, 5]] * 2   # first sample kept
    assert np.asarray(nb.fsa.label)[0, :3].tolist() == [1, 3, -1]
    assert np.asarray(nb.fsa.attrs["aux_labels"])[0, :3].tolist() == [10, 30, -1]
    sc = np.asarray(lat.score)[0]
    np.testing.assert_allclose(nb.tot_scores().values[:4], [sc[[0, 3, 5]].sum(), sc[[0, 4, 5]].sum(),
                                                            sc[[2, 3, 5]].sum(), sc[[2, 4, 5]].sum()], rtol=1e-6)
    assert nb.build_levenshtein_graphs().to_str() == k2.levenshtein_graph(nb.words()).to_str()


def test_from_lattice_key_matches_oracle():
    fsa = k2.Fsa.from_str(S_LAT, acceptor=False)
    lat = k2.create_fsa_vec([fsa, fsa])
    nb = Nbest.from_lattice(lat, 300, key=jax.random.PRNGKey(5), use_double_scores=False, nbest_scale=0.5)
    oracle = {p.arcs: p for p in enumerate_paths(fsa)}
    lang = weighted_language(fsa, log_semiring=False, key="aux_labels")
    scores = nb.tot_scores().tolist()
    for u in range(2):
        rows = nb.shape.row_splits(1)
        words = nb.words()[rows[u]:rows[u + 1]]
        assert len(set(map(tuple, words))) == len(words)                 # unique per utterance
        assert set(map(tuple, words)) == set(lang)                       # 300 samples find all 8 sequences
        for j, path in enumerate(nb.kept_path.tolist()[rows[u]:rows[u + 1]]):
            p = oracle[tuple(path)]
            assert _words_of(fsa, p) == tuple(words[j])
            assert scores[u][j] == pytest.approx(p.score, abs=1e-5)


def test_intersect_top_k_and_nbest_decoding_against_oracle():
    fsa = k2.Fsa.from_str(S_LAT, acceptor=False)
    lat = k2.create_fsa_vec([fsa, fsa])
    nb = Nbest.from_lattice(lat, 300, key=jax.random.PRNGKey(1), use_double_scores=False).intersect(lat, False)
    lang = weighted_language(fsa, log_semiring=False, key="aux_labels")    # best path score per word sequence
    for w, s in zip(nb.words(), np.asarray(nb.tot_scores().values)):
        assert s == pytest.approx(lang[tuple(w)], abs=1e-5)
    best = sorted(lang.items(), key=lambda kv: -kv[1])
    top = nb.top_k(3)
    assert top.shape == NbestShape([0, 3, 6])
    assert [tuple(w) for w in top.words()] == [kv[0] for kv in best[:3]] * 2
    np.testing.assert_allclose(top.tot_scores().values, [kv[1] for kv in best[:3]] * 2, atol=1e-5)
    # icefall's nbest_decoding: argmax of tot_scores, then index the paths
    idx = nb.tot_scores().argmax()
    assert [tuple(w) for w in (nb.words()[i] for i in idx)] == [best[0][0]] * 2
    # top_k beyond the list repeats the last path, as k2
    few = top.top_k(5)
    assert [tuple(w) for w in few.words()][:5] == [kv[0] for kv in best[:3]] + [best[2][0]] * 2
    assert few.kept_path.tolist()[3] == top.kept_path.tolist()[2]


def test_intersect_with_other_lattice_and_broadcast():
    fsa = k2.Fsa.from_str(S_LAT, acceptor=False)
    lat = k2.create_fsa_vec([fsa, fsa])
    nb = Nbest.from_lattice(lat, 50, key=jax.random.PRNGKey(2), use_double_scores=False)
    # an "LM": a word acceptor that knows only [1, 2, 3] and [3] (score 1 and 2)
    G = k2.Fsa.from_str("0 1 1 0.5\n1 2 2 0.5\n2 3 3 0\n0 2 0 1\n3 4 -1 0\n4\n")
    lm = nb.intersect(G, use_double_scores=False)                  # one FSA serves all utterances
    assert lm.shape == nb.shape
    for w, s in zip(nb.words(), np.asarray(lm.tot_scores().values)):
        expect = {(1, 2, 3): 1.0, (3,): 1.0}.get(tuple(w), -math.inf)
        assert s == pytest.approx(expect) if expect > -math.inf else s == -math.inf
    # paths G lacks are empty FSAs and stay empty when intersected again
    again = np.asarray(lm.intersect(lat, use_double_scores=False).tot_scores().values)
    np.testing.assert_array_equal(np.isneginf(again), np.isneginf(np.asarray(lm.tot_scores().values)))


def _padded(lat, A=16, S=5):
    """The batch with A arc slots and max_states S (fewer compiled shapes across hypothesis examples)."""
    pad = A - lat.label.shape[1]
    p2 = lambda x, v: np.pad(np.asarray(x), ((0, 0), (0, pad)), constant_values=v)  # noqa: E731
    return k2.Fsa(p2(lat.src, 0), p2(lat.dst, 0), p2(lat.label, 0), p2(lat.score, -np.inf), lat.num_states,
                  lat.num_arcs, {k: p2(v, 0) for k, v in lat.attrs.items()}, max_states=S)


@settings(max_examples=6, deadline=None)
@given(random_fsa_vecs(min_size=2, max_size=2, max_states=5, max_arcs=8, aux_labels=True))
def test_random_lattices_against_oracle(lat):
    lat = _padded(lat)
    nb = Nbest.from_lattice(lat, 12, key=jax.random.PRNGKey(0), use_double_scores=False, nbest_scale=0.7)
    best = nb.intersect(lat, use_double_scores=False)
    rows = nb.shape.row_splits(1)
    for u in range(len(lat)):
        lang = weighted_language(lat[u], log_semiring=False, key="aux_labels")
        paths = {p.arcs: p.score for p in enumerate_paths(lat[u])}
        words = nb.words()[rows[u]:rows[u + 1]]
        assert len({tuple(w) for w in words}) == len(words)
        if not any(v > -math.inf for v in lang.values()):
            assert words == []
        for j, w in enumerate(words):
            n = rows[u] + j
            assert paths[tuple(nb.kept_path.tolist()[n])] > -math.inf
            assert float(nb.tot_scores().values[n]) == pytest.approx(paths[tuple(nb.kept_path.tolist()[n])], abs=1e-5)
            assert float(best.tot_scores().values[n]) == pytest.approx(lang[tuple(w)], abs=1e-5)
            assert best.words()[n] == w


def test_icefall_rescore_with_n_best_list_flow():
    """icefall's rescore_with_n_best_list with fsa_ops in place of k2 (k2.index_fsa: FsaVec indexing here)."""
    fsa = k2.Fsa.from_str(S_LAT, acceptor=False)
    lm = np.linspace(-0.9, -0.1, 9).astype(np.float32)
    lattice = k2.create_fsa_vec([fsa.replace(lm_scores=lm), fsa.replace(lm_scores=lm[::-1].copy())])
    G = k2.Fsa.from_str("0 0 1 -0.1\n0 0 2 -0.2\n0 0 3 -0.3\n0 1 -1 0\n1\n")
    nbest = Nbest.from_lattice(lattice=lattice, num_paths=40, key=jax.random.PRNGKey(3), use_double_scores=False,
                               nbest_scale=0.5)
    nbest = nbest.intersect(lattice, use_double_scores=False)
    am, lm_sc = nbest.compute_am_scores(), nbest.compute_lm_scores()
    np.testing.assert_allclose(am.values + lm_sc.values, nbest.tot_scores().values, rtol=1e-6)
    lm_scores = nbest.intersect(G, use_double_scores=False).tot_scores()
    np.testing.assert_allclose(lm_scores.values, [-0.1 * sum(w) for w in nbest.words()], rtol=1e-5)
    tot = PathScores(nbest.shape, am.values / 0.5 + lm_scores.values)
    best = nbest.fsa[tot.argmax().tolist()]
    assert len(best) == 2
    for u, i in enumerate(tot.argmax()):
        rows = nbest.shape.row_splits(1)
        assert rows[u] <= i < rows[u + 1]
        assert float(tot.values[i]) == pytest.approx(float(tot.max()[u]))


def test_ragged_aux_labels():
    # a lattice whose arcs carry 0, 1 or 2 words (k2: RaggedTensor aux_labels from an LG graph)
    src = [0, 0, 1, 1, 2]
    dst = [1, 2, 2, 2, 3]
    lab = [1, 2, 3, 4, -1]
    sc = [-0.1, -1.0, -0.5, -3.0, 0.0]
    words = [[7, 8], [9], [], [5, 6], [-1]]
    f = k2.Fsa.from_arcs(src, dst, lab, sc, num_states=4, attrs={"aux_labels": Ragged.from_lists(words)})
    lat = k2.create_fsa_vec([f, f])
    nb = Nbest.from_lattice(lat, 100, key=jax.random.PRNGKey(0), use_double_scores=False, nbest_scale=0.3)
    expect = {(7, 8): -0.6, (9,): -1.0, (7, 8, 5, 6): -3.1}
    for w, s in zip(nb.words(), np.asarray(nb.tot_scores().values)):
        assert s == pytest.approx(expect[tuple(w)], abs=1e-6)
    assert {tuple(w) for w in nb.words()} == set(expect)
    assert isinstance(nb.fsa.attrs["aux_labels"], Ragged)
    inter = nb.intersect(lat, use_double_scores=False)
    assert inter.words() == nb.words() and inter.kept_path.tolist() == nb.kept_path.tolist()
    # a word acceptor with the same words scores each sequence too
    G = k2.Fsa.from_str("0 1 7 0\n1 2 8 0\n2 3 9 0\n0 3 9 2\n2 4 -1 1\n3 4 -1 0\n4\n")
    g = nb.intersect(G, use_double_scores=False)
    for w, s in zip(nb.words(), np.asarray(g.tot_scores().values)):
        assert s == pytest.approx({(7, 8): 1.0, (9,): 2.0}.get(tuple(w), -math.inf))


def test_nbest_shape():
    sh = NbestShape([0, 2, 2, 5])
    assert sh.dim0 == 3 and sh.tot_size(0) == 3 and sh.tot_size(1) == 5 and sh.max_size(1) == 3
    assert sh.row_ids(1).tolist() == [0, 0, 2, 2, 2] and sh.row_splits(1).tolist() == [0, 2, 2, 5]
    assert NbestShape.regular(2, 3) == NbestShape([0, 3, 6])
    for bad in ([1, 2], [0, 3, 2], []):
        with pytest.raises(ValueError, match="row_splits"):
            NbestShape(bad)
    with pytest.raises(ValueError, match="axis"):
        sh.row_ids(2)


def test_acceptor_lattice_and_errors():
    f = k2.Fsa.from_str("0 1 3 -1\n0 1 0 -2\n1 2 4 0\n2 3 -1 0\n3\n")
    lat = k2.create_fsa_vec([f])
    nb = Nbest.from_lattice(lat, 20, key=jax.random.PRNGKey(0), use_double_scores=False, nbest_scale=1.0)
    assert sorted(nb.words()) == [[3, 4], [4]]
    with pytest.raises(ValueError, match="key"):
        Nbest.from_lattice(lat, 5)
    with pytest.raises(ValueError, match="FsaVec"):
        Nbest.from_lattice(f, 5, key=jax.random.PRNGKey(0))
    dead = k2.create_fsa_vec([f, k2.Fsa.from_str("0 1 -1 -inf\n1\n")])
    nb2 = Nbest.from_lattice(dead, 5, key=jax.random.PRNGKey(0), use_double_scores=False)
    assert nb2.shape.row_splits(1)[1] == nb2.shape.row_splits(1)[2]          # no paths for the dead FSA
    assert nb2.tot_scores().argmax()[1] == -1
    with pytest.raises(ValueError, match="no paths"):
        nb2.top_k(2)
    with pytest.raises(TypeError, match="traced"):
        jax.jit(lambda s: Nbest.from_lattice(lat.replace(score=s), 5, key=jax.random.PRNGKey(0)).fsa.score)(
            jnp.asarray(lat.score))


# ------------------------------------------------------------------ mwer_loss (k2's test)
def _k2_expected(prob):
    logp = jnp.log(prob)
    paths = [[0, 3, 5], [0, 4, 5], [2, 3, 5], [2, 4, 5]]
    lp0 = jnp.stack([logp[jnp.array(p)].sum() for p in paths])
    lp1 = jnp.stack([logp[jnp.array(p) + 6].sum() for p in paths])
    pn = jnp.concatenate([jnp.exp(lp0 - jax.nn.logsumexp(lp0)), jnp.exp(lp1 - jax.nn.logsumexp(lp1))])
    return pn * jnp.array([1, 1, 2, 2, 2, 2, 2, 2.0])


@pytest.mark.parametrize("reduction", ["sum", "mean", "none"])
def test_k2_mwer(reduction):
    lat = _mwer_lattice()
    prob = jnp.tile(jnp.array([0.1, 0.5, 0.2, 0.3, 0.4, 0.5]), 2)
    pos = k2_path_positions(2, 200)

    def loss(pr):
        out = mwer_loss(lat.replace(score=jnp.log(pr).reshape(2, 6)), [[10], [50]], nbest_scale=1.0, num_paths=200,
                        reduction=reduction, positions=pos)
        if reduction == "none":
            per_utt = out.sum()
            assert per_utt.shape == (2,)
            return per_utt.sum(), out.values
        return out, None

    def expected(pr):
        e = _k2_expected(pr)
        return e.mean() if reduction == "mean" else e.sum()
    (value, values), grad = jax.value_and_grad(loss, has_aux=True)(prob)
    assert value == pytest.approx(float(expected(prob)), rel=1e-5)
    if reduction == "none":
        np.testing.assert_allclose(values, _k2_expected(prob), rtol=1e-5)
    np.testing.assert_allclose(grad, jax.grad(expected)(prob), atol=1e-5)


def test_mwer_brute_force_and_finite_differences():
    fsa = k2.Fsa.from_str(S_LAT, acceptor=False)
    lat = k2.create_fsa_vec([fsa, fsa])
    refs = [[1, 3], [2]]
    key = jax.random.PRNGKey(11)
    kw = {"nbest_scale": 0.5, "num_paths": 8, "temperature": 0.7, "use_double_scores": False}

    def loss(score):
        return mwer_loss(lat.replace(score=score), refs, key, **kw)
    score = jnp.asarray(lat.score)
    # brute force over the same sampled paths: softmax of path scores x Python edit distances
    nb = Nbest.from_lattice(lat, 8, key=key, use_double_scores=False, nbest_scale=0.5)
    sc = np.asarray(score, np.float64)
    total = 0.0
    rows = nb.shape.row_splits(1)
    for u in range(2):
        paths = nb.kept_path.tolist()[rows[u]:rows[u + 1]]
        lp = np.array([sc[u, p].sum() for p in paths]) / 0.7
        post = np.exp(lp - np.logaddexp.reduce(lp))
        errs = [levenshtein_distance(refs[u], w) for w in nb.words()[rows[u]:rows[u + 1]]]
        total += float(np.dot(post, errs))
    assert float(loss(score)) == pytest.approx(total, rel=1e-5)
    ragged_refs = mwer_loss(lat, Ragged.from_lists(refs), key, **kw)       # k2 also takes a RaggedTensor
    assert float(ragged_refs) == pytest.approx(total, rel=1e-5)
    # gradient against central differences (the sampled paths stay the same for small steps)
    g = np.asarray(jax.grad(loss)(score))
    eps = 1e-2
    for b, a in [(0, 0), (0, 1), (0, 3), (0, 6), (1, 2), (1, 5), (1, 8)]:
        d = np.zeros(score.shape, np.float32)
        d[b, a] = eps
        fd = (float(loss(score + d)) - float(loss(score - d))) / (2 * eps)
        assert g[b, a] == pytest.approx(fd, abs=2e-3), (b, a)
    assert np.any(np.abs(g) > 1e-3)


def test_mwer_bad_arguments():
    lat = _mwer_lattice()
    with pytest.raises(ValueError, match="reduction"):
        mwer_loss(lat, [[10], [50]], jax.random.PRNGKey(0), reduction="max")
    with pytest.raises(ValueError, match="ref_texts"):
        mwer_loss(lat, [[10]], jax.random.PRNGKey(0))
    with pytest.raises(ValueError, match="key"):
        mwer_loss(lat, [[10], [50]])
