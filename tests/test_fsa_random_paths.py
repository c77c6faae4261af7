"""fsa_ops.random_paths: k2's random_paths_test.py ported (k2's fixed positions), and sampled path frequencies
against exact path posteriors from the brute-force oracle."""
import math
import warnings

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from scipy.stats import chi2

import fsa_ops as k2
from fsa_ops.random_paths import k2_path_positions, paths_to_lists, random_paths
from tests.fsa_oracle import enumerate_paths, random_fsa_vecs

S_CASE2 = """
0 1 1 1
0 1 2 1
1 2 3 1
1 2 4 1
2 3 -1 1
2 3 -1 1
3
"""
S_VEC2 = """
0 1 1 1
0 1 2 1
0 1 3 1
0 1 4 1
1 2 1 1
1 2 2 1
1 2 3 1
2 3 1 1
2 3 2 1
3 4 -1 1
4
"""


def _k2_paths(vec, num_paths, use_double_scores):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")          # use_double_scores=True without x64 warns (float32 used)
        p, n = random_paths(vec, use_double_scores, num_paths, positions=k2_path_positions(len(vec), num_paths))
    return paths_to_lists(p, n, vec.num_arcs)


@pytest.mark.parametrize("use_double_scores", [True, False])
def test_k2_single_fsa_case1(use_double_scores):
    vec = k2.create_fsa_vec([k2.Fsa.from_str("0 1 1 0.1\n1 2 -1 0.2\n2\n")])
    assert _k2_paths(vec, 2, use_double_scores) == [[[0, 1], [0, 1]]]


@pytest.mark.parametrize("use_double_scores", [True, False])
def test_k2_single_fsa_case2(use_double_scores):
    vec = k2.create_fsa_vec([k2.Fsa.from_str(S_CASE2)])
    assert _k2_paths(vec, 1, use_double_scores) == [[[1, 2, 4]]]
    assert _k2_paths(vec, 2, use_double_scores) == [[[0, 3, 4], [1, 3, 4]]]
    assert _k2_paths(vec, 4, use_double_scores) == [[[0, 2, 5], [0, 3, 5], [1, 2, 5], [1, 3, 5]]]


@pytest.mark.parametrize("use_double_scores", [True, False])
def test_k2_fsa_vec(use_double_scores):
    vec = k2.create_fsa_vec([k2.Fsa.from_str(S_CASE2), k2.Fsa.from_str(S_VEC2)])
    assert _k2_paths(vec, 1, use_double_scores) == [[[1, 2, 4]], [[8, 10, 13, 15]]]
    assert _k2_paths(vec, 2, use_double_scores) == [[[0, 3, 4], [1, 3, 4]], [[7, 10, 13, 15], [9, 10, 13, 15]]]
    assert _k2_paths(vec, 4, use_double_scores) == [
        [[0, 2, 5], [0, 3, 5], [1, 2, 5], [1, 3, 5]],
        [[6, 11, 13, 15], [7, 11, 13, 15], [8, 11, 13, 15], [9, 11, 13, 15]]]


def test_shapes_padding_and_no_path():
    good = k2.Fsa.from_str(S_CASE2)
    dead = k2.Fsa.from_str("0 1 1 0\n0 2 -1 -inf\n1 2 -1 -inf\n2\n")          # total score -inf
    vec = k2.create_fsa_vec([good, dead])
    paths, lengths = random_paths(vec, False, 3, key=jax.random.PRNGKey(1))
    assert paths.shape == (2, 3, 3) and paths.dtype == np.int32 and lengths.shape == (2, 3)
    assert np.all(np.asarray(lengths)[0] == 3) and np.all(np.asarray(lengths)[1] == 0)
    assert np.all(np.asarray(paths)[1] == -1)
    assert paths_to_lists(paths, lengths)[1] == []                              # k2: no paths for such an FSA
    one_p, one_n = random_paths(good, False, 2, key=jax.random.PRNGKey(1))    # a single Fsa: no batch dim
    assert one_p.shape == (2, 3) and one_n.shape == (2,)


def test_bad_arguments():
    vec = k2.create_fsa_vec([k2.Fsa.from_str(S_CASE2)])
    with pytest.raises(ValueError, match="key"):
        random_paths(vec, False, 2)
    with pytest.raises(ValueError, match="exactly one"):
        random_paths(vec, False, 2, key=jax.random.PRNGKey(0), positions=k2_path_positions(1, 2))
    with pytest.raises(ValueError, match="num_paths"):
        random_paths(vec, False, 0, key=jax.random.PRNGKey(0))
    with pytest.raises(ValueError, match="positions"):
        random_paths(vec, False, 2, positions=np.zeros((1, 3)))
    with pytest.raises(ValueError, match="key"):
        random_paths(vec, False, 2, key="seed")


def test_under_jit_with_traced_key():
    vec = k2.create_fsa_vec([k2.Fsa.from_str(S_CASE2), k2.Fsa.from_str(S_VEC2)])
    f = jax.jit(lambda key: random_paths(vec, False, 4, key=key))
    p1, n1 = f(jax.random.PRNGKey(3))
    p2, n2 = random_paths(vec, False, 4, key=jax.random.PRNGKey(3))
    np.testing.assert_array_equal(p1, p2)
    np.testing.assert_array_equal(n1, n2)


def _chi2_stat(counts, probs, n):
    expected = n * probs
    return float(np.sum((counts - expected) ** 2 / expected))


def _frequencies(fsa, paths, lengths):
    """Counts of each oracle path (by arc tuple) among the samples; every sample must be an oracle path."""
    oracle = enumerate_paths(fsa)
    index = {p.arcs: i for i, p in enumerate(oracle)}
    counts = np.zeros(len(oracle))
    for arcs, n in zip(np.asarray(paths).tolist(), np.asarray(lengths).tolist()):
        key = tuple(arcs[:n])
        assert key in index, f"sampled {key} is not a path of the FSA"
        counts[index[key]] += 1
    scores = np.array([p.score for p in oracle])
    probs = np.exp(scores - np.logaddexp.reduce(scores))
    return counts, probs


# a lattice-like FSA with 18 paths, some improbable (scores differ by up to 6) and one -inf arc
S_FREQ = """
0 1 1 0.5
0 2 2 -1.0
0 1 3 0.0
1 2 1 0.3
1 3 2 -2.0
1 3 0 0.0
2 3 1 1.0
2 4 2 -3.0
2 4 0 -inf
3 4 3 0.0
3 5 -1 -2.0
4 5 -1 0.0
5
"""


@pytest.mark.parametrize("mode", ["key", "random_positions"])
def test_path_frequencies_match_exact_posteriors(mode):
    fsa = k2.Fsa.from_str(S_FREQ)
    n = 6000
    vec = k2.create_fsa_vec([fsa])
    if mode == "key":
        paths, lengths = random_paths(vec, False, n, key=jax.random.PRNGKey(2026))
    else:      # k2's rescaling scheme with uniform random positions also samples exactly
        pos = np.asarray(jax.random.uniform(jax.random.PRNGKey(7), (1, n)))
        paths, lengths = random_paths(vec, False, n, positions=pos)
    counts, probs = _frequencies(fsa, paths[0], lengths[0])
    assert counts[probs == 0].sum() == 0                         # the -inf arc is never taken
    keep = probs > 0
    df = int(keep.sum()) - 1
    bound = chi2.ppf(1 - 1e-6, df)
    stat = _chi2_stat(counts[keep], probs[keep], n)
    assert stat < bound, (stat, bound)
    # the bound has power: wrong samplers are rejected (uniform over paths; first-arc scores ignored)
    uniform = np.where(keep, 1.0, 0.0) / keep.sum()
    assert _chi2_stat(counts[keep], uniform[keep], n) > bound
    tilted = probs[keep] * np.exp(0.3 * np.arange(df + 1))
    assert _chi2_stat(counts[keep], tilted / tilted.sum(), n) > bound


@settings(max_examples=15, deadline=None)
@given(random_fsa_vecs(min_size=1, max_size=3, max_states=6, max_arcs=10))
def test_samples_are_paths_of_positive_probability(vec):
    paths, lengths = random_paths(vec, False, 8, key=jax.random.PRNGKey(0))
    paths, lengths = np.asarray(paths), np.asarray(lengths)
    for b in range(len(vec)):
        f = vec[b]
        oracle = {p.arcs: p.score for p in enumerate_paths(f)}
        has_path = any(s > -math.inf for s in oracle.values())
        for i in range(8):
            arcs = tuple(paths[b, i, :lengths[b, i]].tolist())
            assert np.all(paths[b, i, lengths[b, i]:] == -1)
            if not has_path:
                assert arcs == ()
            else:
                assert arcs in oracle and oracle[arcs] > -math.inf
