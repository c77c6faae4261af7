"""linear_fsa_with_self_loops / linear_fst_with_self_loops with k2's conventions: k2's
linear_fsa_with_self_loops_test.py and linear_fst_with_self_loops_test.py, errors, and the brute-force oracle
(the weighted label/aux relation is the input's, epsilon arcs merged away)."""
import os
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

sys.path.insert(0, os.path.dirname(__file__))
from fsa_oracle import languages_close, weighted_language  # noqa: E402

from fsa_ops.fsa import Fsa, check_fsa, create_fsa_vec  # noqa: E402
from fsa_ops.graphs import (linear_fsa, linear_fsa_with_self_loops, linear_fst,  # noqa: E402
                            linear_fst_with_self_loops)
from fsa_ops.ragged import Ragged  # noqa: E402
from fsa_ops.remove_epsilon import remove_epsilon  # noqa: E402
from fsa_ops.unary import add_epsilon_self_loops  # noqa: E402


def _flat_labels(f):
    return [x for g in (f if f.is_batch else [f]) for x in g.label.tolist()]


def test_k2_linear_fsa_with_self_loops_single():
    src = linear_fsa([2, 0, 0, 0, 5, 8])
    dst = linear_fsa_with_self_loops(src)
    assert dst.label.tolist() == [0, 2, 0, 5, 0, 8, 0, -1]


def test_k2_linear_fsa_with_self_loops_multiple():
    src = linear_fsa([[2, 0, 0, 0, 5, 0, 0, 0, 8, 0, 0], [1, 2], [0, 0, 0, 3, 0, 2]])
    dst = linear_fsa_with_self_loops(src)
    expected = [0, 2, 0, 5, 0, 8, 0, -1] + [0, 1, 0, 2, 0, -1] + [0, 3, 0, 2, 0, -1]
    assert _flat_labels(dst) == expected
    check_fsa(dst)


S0 = """
  0 1 1 10 -0.1
  1 2 2 20 -0.2
  2 3 3 0 -0.5
  3 4 0 40 -0.1
  4 5 0 50 -0.1
  5 6 0 0 -0.1
  6 7 -1 0 -0.1
  7
"""
S1 = S0.replace("2 3 3 0 -0.5", "2 3 0 0 -0.5")
S2 = """
  0 1 0 10 -0.5
  1 2 20 20 -0.2
  2 3 30 0 -0.5
  3 4 0 40 -0.1
  4 5 0 50 -0.1
  5 6 6 0 -0.1
  6 7 -1 0 -0.1
  7
"""
S3 = """
  0 1 0 1 0.1
  1 2 0 2 0.2
  2 3 0 3 0.3
  3 4 0 4 0.4
  4 5 0 5 0.5
  5 6 -1 6 0.6
  6
"""


def test_k2_linear_fst_with_self_loops():
    """k2's test: the result equals add_epsilon_self_loops(remove_epsilon(fst)) in labels, aux_labels, scores."""
    fsts = [Fsa.from_str(s, acceptor=False) for s in (S0, S1, S2, S3)]
    for src in fsts + [create_fsa_vec(fsts)]:
        expected = add_epsilon_self_loops(remove_epsilon(src))
        out = linear_fst_with_self_loops(src)
        check_fsa(out)
        np.testing.assert_array_equal(out.label, expected.label)
        assert out.aux_labels == expected.aux_labels
        np.testing.assert_allclose(out.score, expected.score, rtol=1e-6, atol=1e-6)


def test_linear_fst_with_self_loops_values():
    out = linear_fst_with_self_loops(Fsa.from_str(S2, acceptor=False))
    # [eps:10, 20:20] merge; 30:0 alone; [eps:40, eps:50, 6:0] merge; the final arc alone
    assert out.label.tolist() == [0, 20, 0, 30, 0, 6, 0, -1]
    assert out.aux_labels.tolist() == [[], [10, 20], [], [], [], [40, 50], [], []]
    np.testing.assert_allclose(out.score, [0, -0.7, 0, -0.5, 0, -0.3, 0, -0.1], atol=1e-6)
    assert isinstance(out.aux_labels, Ragged)
    # ragged input aux_labels: rows concatenated, values <= 0 dropped
    f = linear_fst([3, 0, 4], [0, 0, 0]).replace(aux_labels=Ragged.from_lists([[7, 0], [8], [9, 10], [-1]]))
    out = linear_fst_with_self_loops(f)
    assert out.label.tolist() == [0, 3, 0, 4, 0, -1]
    assert out.aux_labels.tolist() == [[], [7], [], [8, 9, 10], [], []]


def test_self_loops_drop_scores_and_check_linearity():
    # k2 builds a new linear_fsa from the labels: scores and attributes are not kept
    f = Fsa.from_str("0 1 2 1.5\n1 2 0 0.5\n2 3 -1 0.25\n3")
    out = linear_fsa_with_self_loops(f)
    assert out.label.tolist() == [0, 2, 0, -1] and out.score.tolist() == [0, 0, 0, 0]
    not_linear = Fsa.from_str("0 1 2 0\n0 1 3 0\n1 2 -1 0\n2")
    with pytest.raises(ValueError, match="fsas: expected a linear FSA"):
        linear_fsa_with_self_loops(not_linear)
    with pytest.raises(ValueError, match=r"fsts\[1\]: expected a linear FSA"):
        linear_fst_with_self_loops(create_fsa_vec([linear_fst([1], [2]), Fsa.from_str(
            "0 1 1 5 0\n0 1 2 6 0\n1 2 -1 -1 0\n2", acceptor=False)]))
    with pytest.raises(ValueError, match="negative label -2"):
        linear_fsa_with_self_loops(Fsa.from_str("0 1 -2 0\n1 2 -1 0\n2"))
    with pytest.raises(ValueError, match="no aux_labels"):
        linear_fst_with_self_loops(linear_fsa([1]))
    with pytest.raises(TypeError, match="expected an Fsa"):
        linear_fst_with_self_loops([1, 2])


@st.composite
def linear_fsts(draw):
    n = draw(st.integers(0, 5))
    labels = draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))
    aux = draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))
    f = linear_fst(labels, aux)
    scores = draw(st.lists(st.floats(-2, 2, width=32), min_size=n + 1, max_size=n + 1))
    return f.replace(score=np.asarray(scores, np.float32))


@settings(max_examples=30, deadline=None)
@given(linear_fsts())
def test_matches_oracle(f):
    """The (labels, aux_labels) relation with its scores is the input's; every non-final state has one epsilon
    self-loop (score 0, no aux label) first; no other epsilon arc is left."""
    out = linear_fst_with_self_loops(f)
    check_fsa(out)
    k = np.nonzero(out.label != 0)[0]    # without the self-loops (each would add paths of the same sequence)
    no_loops = Fsa.from_arcs(out.src[k], out.dst[k], out.label[k], out.score[k], num_states=int(out.num_states),
                             attrs={"aux_labels": out.aux_labels.take(k)})
    for log in (True, False):
        ok, msg = languages_close(weighted_language(no_loops, log_semiring=log, key="both"),
                                  weighted_language(f, log_semiring=log, key="both"))
        assert ok, msg
    loops = (out.label == 0)
    np.testing.assert_array_equal(loops, out.src == out.dst)
    np.testing.assert_array_equal(np.nonzero(loops)[0], np.arange(0, len(out.label), 2))
    assert out.score[loops].tolist() == [0.0] * int(loops.sum())
    acc = linear_fsa_with_self_loops(f)
    assert acc.label.tolist() == out.label.tolist() and acc.score.tolist() == [0.0] * len(acc.label)
