"""random_fsa / random_fsa_vec (k2's generators, seeded) and is_rand_equivalent: k2's host equivalence tests
(fsa_equivalent_test.py, adapted to FSAs whose arcs into the final state carry -1), k2-equivalent pairs
(sorting, connecting, epsilon removal, determinization), perturbed pairs, and the brute-force oracle."""
import math
import os
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

sys.path.insert(0, os.path.dirname(__file__))
from fsa_oracle import languages_close, random_fsas, weighted_language  # noqa: E402

from fsa_ops.connect import connect  # noqa: E402
from fsa_ops.determinize import determinize  # noqa: E402
from fsa_ops.fsa import Fsa, check_fsa, create_fsa_vec  # noqa: E402
from fsa_ops.properties import is_acyclic  # noqa: E402
from fsa_ops.random_fsa import (is_rand_equivalent, rand_equivalence_report, random_fsa,  # noqa: E402
                                random_fsa_vec)
from fsa_ops.remove_epsilon import remove_epsilon  # noqa: E402
from fsa_ops.sort import arc_sort, top_sort  # noqa: E402


# ------------------------------------------------------------------ random_fsa / random_fsa_vec
@pytest.mark.parametrize("acyclic", [True, False])
def test_random_fsa_properties(acyclic):
    sizes = []
    for seed in range(60):
        f = random_fsa(acyclic=acyclic, max_symbol=7, min_num_arcs=3, max_num_arcs=40, seed=seed)
        check_fsa(f)
        assert not f.is_batch
        n = len(f.label)
        sizes.append(n)
        assert 3 <= n <= 40
        assert f.label.min() >= -1 and f.label.max() <= 7
        final = int(f.num_states) - 1
        np.testing.assert_array_equal(f.label == -1, f.dst == final)
        assert np.all((f.score >= 0) & (f.score < 10))
        if acyclic:
            assert np.all(f.dst > f.src) and is_acyclic(f)
    assert len(set(sizes)) > 5   # the arc count varies
    if not acyclic:   # cyclic mode draws cycles (self-loops or back arcs) in some FSAs
        assert any(not is_acyclic(random_fsa(acyclic=False, max_symbol=3, min_num_arcs=10, max_num_arcs=20,
                                             seed=s)) for s in range(10))


def test_random_fsa_seeds():
    a = random_fsa(max_num_arcs=30, min_num_arcs=5, seed=7)
    b = random_fsa(max_num_arcs=30, min_num_arcs=5, seed=7)
    c = random_fsa(max_num_arcs=30, min_num_arcs=5, seed=8)
    assert a.to_str() == b.to_str() != c.to_str()
    g1, g2 = np.random.default_rng(3), np.random.default_rng(3)
    assert random_fsa(seed=g1).to_str() == random_fsa(seed=g2).to_str()
    assert random_fsa(seed=g1).to_str() == random_fsa(seed=g2).to_str()   # the generator advances alike
    assert random_fsa(min_num_arcs=0, max_num_arcs=0, seed=1).label.shape == (0,)


def test_random_fsa_vec():
    v = random_fsa_vec(2, 6, acyclic=True, max_symbol=5, min_num_arcs=1, max_num_arcs=12, seed=0)
    check_fsa(v)
    assert 2 <= len(v) <= 6
    for f in v:
        assert 1 <= len(f.label) <= 12 and np.all(f.dst > f.src)
    counts = {len(random_fsa_vec(1, 4, max_num_arcs=3, seed=s)) for s in range(30)}
    assert counts == {1, 2, 3, 4}
    assert random_fsa_vec(3, 3, max_num_arcs=5, seed=1).to_str() == random_fsa_vec(3, 3, max_num_arcs=5,
                                                                                    seed=1).to_str()


@pytest.mark.parametrize("kw, err", [
    (dict(max_symbol=-1), ValueError), (dict(min_num_arcs=-1), ValueError),
    (dict(min_num_arcs=5, max_num_arcs=4), ValueError), (dict(max_num_arcs=2.5), TypeError),
    (dict(seed="x"), TypeError), (dict(seed=-3), ValueError)])
def test_random_fsa_bad_args(kw, err):
    with pytest.raises(err, match=next(iter(kw))):
        random_fsa(**kw)
    with pytest.raises(ValueError, match="max_num_fsas"):
        random_fsa_vec(3, 2)


# ------------------------------------------------------------------ k2's host tests (fsa_equivalent_test.py)
S_A = """0 1 1 2
0 1 2 2
0 1 3 3
0 2 4 3
0 2 5 1
1 3 5 3
1 3 6 2
2 4 5 5
2 4 6 4
3 5 -1 1
4 5 -1 3
5"""
S_B = """0 1 1 5
0 1 2 5
0 1 3 6
0 1 4 10
0 1 5 8
1 2 5 1
1 2 6 0
2 3 -1 0
3"""
S_C = S_B.replace("0 1 5 8", "0 1 5 9")


@pytest.mark.parametrize("log", [False, True])
def test_k2_wfsa_rand_equivalent(log):
    a, b, c = (Fsa.from_str(s) for s in (S_A, S_B, S_C))
    assert is_rand_equivalent(a, b, log, seed=0)
    assert not is_rand_equivalent(a, c, log, seed=0)


def test_k2_wfsa_rand_equivalent_beam():
    a, b, c = (Fsa.from_str(s) for s in (S_A, S_B, S_C))
    assert is_rand_equivalent(a, b, False, beam=4.0, seed=0)
    assert not is_rand_equivalent(a, c, False, beam=6.0, seed=0)
    # the sequences that differ ((5, 5): 9 in a vs 10 in c, (5, 6): 8 vs 9) are all more than 0.5 below the
    # best score (11) in both FSAs, so a beam of 0.5 skips them
    assert is_rand_equivalent(a, c, False, beam=0.5, seed=0)
    assert rand_equivalence_report(a, c, False, beam=1.5, seed=0).startswith("label sequence [5, ")


# k2's unweighted host cases, with a final state (label -1 arc) appended after k2host's old final state 3
def _host(s):
    return Fsa.from_str(s.strip() + "\n3 4 -1 0\n4")


HOST_A = "0 1 1 0\n0 2 2 0\n1 2 3 0\n1 3 4 0\n2 3 5 0"


def test_k2_host_cases():
    # bad case 1: b cannot reach the final state (empty once connected), a can
    assert not is_rand_equivalent(_host(HOST_A), _host("0 1 1 0\n0 2 2 0\n1 2 3 0"), True, seed=0)
    # bad case 2: label 5 against 6
    assert not is_rand_equivalent(_host(HOST_A), _host(HOST_A.replace("2 3 5 0", "2 3 6 0")), True, seed=0)
    # good case 1: both empty once connected
    assert is_rand_equivalent(Fsa.from_str("0 1 1 0\n0 2 2 0\n1 2 3 0\n3"), Fsa.from_str("0 1 1 0\n0 2 2 0\n3"),
                              True, seed=0)
    # good case 2: the same FSA
    assert is_rand_equivalent(_host(HOST_A), _host(HOST_A), False, seed=0)
    # the same language with renumbered states and different dead ends (labels 8 / 9)
    a = Fsa.from_str("0 1 1 0\n0 2 2 0\n0 3 8 0\n1 4 4 0\n2 4 5 0\n4 5 -1 0\n5")
    b = Fsa.from_str("0 2 1 0\n0 1 2 0\n0 3 9 0\n1 4 5 0\n2 4 4 0\n4 5 -1 0\n5")
    assert is_rand_equivalent(a, b, True, seed=0) and is_rand_equivalent(a, b, False, seed=0)


# ------------------------------------------------------------------ equivalent and perturbed pairs
def _connected_random(seed, **kw):
    """The first connected, non-empty random FSA from seed, seed + 1000, ..."""
    for s in range(seed, seed + 100_000, 1000):
        f = connect(random_fsa(seed=s, **kw))
        if int(f.num_states) > 0:
            return f
    raise AssertionError("no connected FSA drawn")


KW = dict(max_symbol=3, min_num_arcs=4, max_num_arcs=14)


@pytest.mark.parametrize("seed", range(12))
def test_equivalent_transforms(seed):
    f = random_fsa(seed=seed, **KW)
    for g in (arc_sort(f), connect(f), top_sort(connect(f))):
        for log in (False, True):
            assert not (msg := rand_equivalence_report(f, g, log, delta=1e-5, seed=seed)), msg
    c = _connected_random(seed, **KW)
    eps_free = remove_epsilon(c)
    assert not (msg := rand_equivalence_report(c, eps_free, False, delta=1e-4, seed=seed)), msg
    assert not (msg := rand_equivalence_report(c, determinize(eps_free), False, delta=1e-4, seed=seed)), msg
    # log semiring: log-sum epsilon removal and determinization
    eps_free_log = remove_epsilon(c, log_semiring=True)
    assert not (msg := rand_equivalence_report(c, eps_free_log, True, delta=1e-4, seed=seed)), msg
    det_log = determinize(eps_free_log, log_semiring=True)
    assert not (msg := rand_equivalence_report(c, det_log, True, delta=1e-4, seed=seed)), msg


@pytest.mark.parametrize("seed", range(8))
def test_perturbed_not_equivalent(seed):
    f = _connected_random(seed, **KW)
    # a score change on an arc of an accepting path changes the log-semiring total
    g = f.replace(score=f.score + np.where(np.arange(len(f.score)) == 0, np.float32(0.25), np.float32(0)))
    assert "total scores" in rand_equivalence_report(f, g, True, seed=seed)
    # a new symbol on one arc makes the label sets differ
    lab = f.label.copy()
    i = int(np.nonzero(lab != -1)[0][0]) if np.any(lab != -1) else None
    if i is not None:
        lab[i] = 99
        assert not is_rand_equivalent(f, f.replace(label=lab), False, seed=seed)


def test_same_total_different_sequences():
    # two one-symbol paths with swapped scores: the totals agree, every path's sequence differs
    a = Fsa.from_str("0 1 1 0.5\n0 1 2 1.5\n1 2 -1 0\n2")
    b = Fsa.from_str("0 1 1 1.5\n0 1 2 0.5\n1 2 -1 0\n2")
    for log in (False, True):
        msg = rand_equivalence_report(a, b, log, seed=0, npath=1)
        assert msg.startswith("label sequence ["), msg
    assert is_rand_equivalent(a, b, True, npath=0)   # no path drawn: only the totals are compared
    # each sequence is the best one (1.5) in one of the FSAs, so no beam skips it
    assert not is_rand_equivalent(a, b, False, beam=0.1, seed=0)


def test_epsilons_and_batches():
    f = Fsa.from_str("0 1 0 0.5\n0 1 1 0.25\n1 2 2 0\n2 3 -1 0\n3")
    g = remove_epsilon(f)
    assert is_rand_equivalent(f, g, False, seed=0)
    # with epsilon as an ordinary symbol, the label sets differ by 0: not equivalent
    assert not is_rand_equivalent(f, g, False, treat_epsilons_specially=False, seed=0)
    assert is_rand_equivalent(f, f, True, treat_epsilons_specially=False, seed=0)
    va, vb = create_fsa_vec([f, f]), create_fsa_vec([g, g])
    assert is_rand_equivalent(va, vb, False, seed=0)
    h = g.replace(score=g.score + np.float32(1.0))
    assert rand_equivalence_report(va, create_fsa_vec([g, h]), False, seed=0).startswith("FSA 1:")


def test_rand_equivalent_bad_input():
    f = Fsa.from_str("0 1 1 0\n1 2 -1 0\n2")
    cyc = Fsa.from_str("0 1 1 0\n1 1 2 0\n1 2 -1 0\n2")
    with pytest.raises(ValueError, match="a: .*acyclic"):
        is_rand_equivalent(cyc, f, True, seed=0)
    with pytest.raises(ValueError, match="beam"):
        is_rand_equivalent(f, f, True, beam=0)
    with pytest.raises(ValueError, match="both be single FSAs or both batches"):
        is_rand_equivalent(f, create_fsa_vec([f]), True)
    with pytest.raises(ValueError, match="a has 2 FSAs, b has 1"):
        is_rand_equivalent(create_fsa_vec([f, f]), create_fsa_vec([f]), True)
    with pytest.raises(TypeError, match="b: expected an Fsa"):
        is_rand_equivalent(f, "0 1 1 0", True)


# ------------------------------------------------------------------ against the brute-force oracle
@settings(max_examples=40, deadline=None)
@given(random_fsas(max_states=5, max_arcs=8, num_labels=3), st.integers(0, 7), st.floats(-1.0, 1.0),
       st.booleans())
def test_matches_oracle(f, arc, shift, log):
    """No false alarm: equal weighted languages (oracle) are always judged equivalent; and a changed score
    on an arc that lies on an accepting path is caught when the oracle shows a sequence that changed by
    more than delta and the change survives in the total (log semiring) or in a checked sequence."""
    arc = arc % len(f.label)
    g = f.replace(score=np.where(np.arange(len(f.label)) == arc, f.score + np.float32(shift), f.score)
                  .astype(np.float32))
    la = weighted_language(f, log_semiring=log)
    lb = weighted_language(g, log_semiring=log)
    same, _ = languages_close(la, lb, atol=1e-6, rtol=0)
    verdict = is_rand_equivalent(f, g, log, delta=1e-4, npath=50, seed=0)
    if same:
        assert verdict
    total_a = _combine(list(la.values()), log)
    total_b = _combine(list(lb.values()), log)
    if not math.isclose(total_a, total_b, abs_tol=2e-4, rel_tol=0):
        assert not verdict


def _combine(vals, log):
    vals = [v for v in vals if v != -math.inf]
    if not vals:
        return -math.inf
    if not log:
        return max(vals)
    m = max(vals)
    return m + math.log(sum(math.exp(v - m) for v in vals))
