"""Graph constructors vs k2's test expectations and brute-force CTC semantics."""
import itertools
import os
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

sys.path.insert(0, os.path.dirname(__file__))
from fsa_oracle import enumerate_paths  # noqa: E402

from fsa_ops.fsa import check_fsa, to_str  # noqa: E402
from fsa_ops.graphs import (INS_DEL_OFFSET_ATTR, ctc_graph, ctc_topo, levenshtein_graph, linear_fsa,  # noqa: E402
                            linear_fst, trivial_graph)

SETTINGS = settings(max_examples=30, deadline=None)


def collapse(x):
    """Standard CTC: merge repeats, drop blanks."""
    out, prev = [], None
    for t in x:
        if t != prev and t != 0:
            out.append(t)
        prev = t
    return tuple(out)


def modified_outputs(x):
    """Modified CTC (k2): a run of r equal tokens (no blank between) emits any 1..r copies."""
    runs = [(k, len(list(g))) for k, g in itertools.groupby(x) if k != 0]
    outs = set()
    for counts in itertools.product(*[range(1, r + 1) for _, r in runs]):
        outs.add(tuple(t for (t, _), c in zip(runs, counts) for _ in range(c)))
    return outs


def frames(p):
    assert p.labels[-1] == -1
    return tuple(p.labels[:-1])


def test_linear_fsa_and_fst():
    f = linear_fsa([2, 5, 3])
    assert to_str(f) == "0 1 2 0\n1 2 5 0\n2 3 3 0\n3 4 -1 0\n4\n"
    v = linear_fsa([[1, 2], [], [3]])
    assert v.is_batch and v.num_states.tolist() == [4, 2, 3] and v.num_arcs.tolist() == [3, 1, 2]
    assert to_str(v[1]) == "0 1 -1 0\n1\n"
    check_fsa(v)
    t = linear_fst([1, 2], [3, 0])
    assert to_str(t) == "0 1 1 3 0\n1 2 2 0 0\n2 3 -1 -1 0\n3\n"
    tv = linear_fst([[1], [2, 3]], [[4], [5, 6]])
    assert tv[1].aux_labels.tolist() == [5, 6, -1]
    with pytest.raises(ValueError, match="-1"):
        linear_fsa([1, -1])
    with pytest.raises(ValueError, match="aux_labels"):
        linear_fst([1, 2], [3])


def test_ctc_graph_k2_expected():
    # k2/python/tests/ctc_graph_test.py
    exp0 = ["0 0 0 0 0", "0 1 1 1 0", "1 2 0 0 0", "1 1 1 0 0", "1 3 2 2 0", "2 2 0 0 0", "2 3 2 2 0",
            "3 4 0 0 0", "3 3 2 0 0", "4 4 0 0 0", "4 5 2 2 0", "5 6 0 0 0", "5 5 2 0 0", "5 7 -1 -1 0",
            "6 6 0 0 0", "6 7 -1 -1 0", "7"]
    exp1 = ["0 0 0 0 0", "0 1 1 1 0", "1 2 0 0 0", "1 1 1 0 0", "1 3 2 2 0", "2 2 0 0 0", "2 3 2 2 0",
            "3 4 0 0 0", "3 3 2 0 0", "3 5 3 3 0", "4 4 0 0 0", "4 5 3 3 0", "5 6 0 0 0", "5 5 3 0 0",
            "5 7 -1 -1 0", "6 6 0 0 0", "6 7 -1 -1 0", "7"]
    exp0_mod = exp0[:9] + ["3 5 2 2 0"] + exp0[9:]
    v = ctc_graph([[1, 2, 2], [1, 2, 3]])
    assert to_str(v[0]).strip() == "\n".join(exp0)
    assert to_str(v[1]).strip() == "\n".join(exp1)
    m = ctc_graph([[1, 2, 2], [1, 2, 3]], modified=True)
    assert to_str(m[0]).strip() == "\n".join(exp0_mod)
    assert to_str(m[1]).strip() == "\n".join(exp1)
    assert to_str(ctc_graph([1, 2, 3])) == to_str(v[1])
    with pytest.raises(ValueError, match="symbols\\[1\\].*> 0"):
        ctc_graph([[1], [0, 2]])


def test_ctc_topo_structure():
    t = ctc_topo(2)
    check_fsa(t)
    assert int(t.num_states) == 4 and len(t.label) == 3 * 4
    assert to_str(t).splitlines()[:4] == ["0 0 0 0 0", "0 1 1 1 0", "0 2 2 2 0", "0 3 -1 -1 0"]
    assert to_str(t).splitlines()[4:8] == ["1 0 0 0 0", "1 1 1 0 0", "1 2 2 2 0", "1 3 -1 -1 0"]
    m = ctc_topo(2, modified=True)
    check_fsa(m)
    # k2: (states-1)*2 + (states-2)*2 arcs
    assert len(m.label) == 3 * 2 + 2 * 2
    assert to_str(m) == ("0 0 0 0 0\n0 0 1 1 0\n0 0 2 2 0\n0 1 1 1 0\n0 2 2 2 0\n0 3 -1 -1 0\n"
                         "1 1 1 0 0\n1 0 1 0 0\n2 2 2 0 0\n2 0 2 0 0\n3\n")
    assert np.all(t.score == 0) and np.all(m.score == 0)


@pytest.mark.parametrize("max_token, n", [(1, 5), (2, 4), (3, 3)])
def test_ctc_topo_standard_maps_frames_to_collapse(max_token, n):
    paths = enumerate_paths(ctc_topo(max_token), max_arcs=n + 1)
    seen = {}
    for p in paths:
        x = frames(p)
        assert x not in seen, f"input {x} has two paths"
        seen[x] = tuple(a for a in p.attrs["aux_labels"] if a not in (0, -1))
    expected = [x for k in range(n + 1) for x in itertools.product(range(max_token + 1), repeat=k)]
    assert set(seen) == set(expected)
    for x, y in seen.items():
        assert y == collapse(x), x


@pytest.mark.parametrize("max_token, n", [(1, 5), (2, 4)])
def test_ctc_topo_modified_outputs(max_token, n):
    outs = {}
    for p in enumerate_paths(ctc_topo(max_token, modified=True), max_arcs=n + 1):
        outs.setdefault(frames(p), set()).add(tuple(a for a in p.attrs["aux_labels"] if a not in (0, -1)))
    expected = [x for k in range(n + 1) for x in itertools.product(range(max_token + 1), repeat=k)]
    assert set(outs) == set(expected)
    for x, ys in outs.items():
        assert ys == modified_outputs(x), x


@SETTINGS
@given(sym=st.lists(st.integers(1, 3), max_size=3), modified=st.booleans())
def test_ctc_graph_accepts_exactly_the_alignments(sym, modified):
    g = ctc_graph(sym, modified=modified)
    check_fsa(g)
    T = 5
    got = {}
    for p in enumerate_paths(g, max_arcs=T + 1):
        x = frames(p)
        got[x] = got.get(x, 0) + 1
        assert tuple(a for a in p.attrs["aux_labels"] if a not in (0, -1)) == tuple(sym)
    for x, c in got.items():  # the standard topology is unambiguous; the modified one can split runs
        assert c == 1 or modified, f"alignment {x} has {c} paths"
    expected = set()
    for k in range(T + 1):
        for x in itertools.product(range(4), repeat=k):
            ok = tuple(sym) in modified_outputs(x) if modified else collapse(x) == tuple(sym)
            if ok:
                expected.add(x)
    assert set(got) == expected


def test_levenshtein_graph_k2_expected():
    # k2/python/tests/levenshtein_graph_test.py structure, with the current scores (-0.5 deletion arcs,
    # ins_del_score self-loops, offset ins_del_score + 0.5)
    for w in [-0.501, -1.0, -1.25]:
        v = levenshtein_graph([[1, 2, 3], [], [4, 5, 6]], ins_del_score=w)
        ws = to_str(v[0]).splitlines()[0].split()[-1]
        exp0 = [f"0 0 0 0 {ws}", "0 1 0 1 -0.5", "0 1 1 1 0", f"1 1 0 0 {ws}", "1 2 0 2 -0.5", "1 2 2 2 0",
                f"2 2 0 0 {ws}", "2 3 0 3 -0.5", "2 3 3 3 0", f"3 3 0 0 {ws}", "3 4 -1 -1 0", "4"]
        exp1 = [f"0 0 0 0 {ws}", "0 1 -1 -1 0", "1"]
        assert float(ws) == pytest.approx(w)
        assert to_str(v[0]).strip() == "\n".join(exp0)
        assert to_str(v[1]).strip() == "\n".join(exp1)
        exp2 = [f"0 0 0 0 {ws}", "0 1 0 4 -0.5", "0 1 4 4 0", f"1 1 0 0 {ws}", "1 2 0 5 -0.5", "1 2 5 5 0",
                f"2 2 0 0 {ws}", "2 3 0 6 -0.5", "2 3 6 6 0", f"3 3 0 0 {ws}", "3 4 -1 -1 0", "4"]
        assert to_str(v[2]).strip() == "\n".join(exp2)
        b = w + 0.5
        expected_off = [b, 0, 0, b, 0, 0, b, 0, 0, b, 0, b, 0, b, 0, 0, b, 0, 0, b, 0, 0, b, 0]
        got = np.concatenate([v[i].attrs[INS_DEL_OFFSET_ATTR] for i in range(3)])
        np.testing.assert_allclose(got, expected_off, atol=1e-6)


def test_levenshtein_graph_min_cost_is_edit_distance():
    # Every path outputs the reference on its aux side; its label side is a subsequence of the reference
    # (deletions are label-0 arcs scoring -0.5, self-loops score ins_del_score), so the best score for each
    # label sequence is -0.5 per deleted symbol.
    ref = [1, 2, 3]
    g = levenshtein_graph(ref, ins_del_score=-0.5)
    best = {}
    for p in enumerate_paths(g, max_arcs=9):
        hyp = tuple(x for x in p.labels if x not in (0, -1))
        best[hyp] = max(best.get(hyp, -np.inf), p.score)

    def lcs(a, b):
        d = np.zeros((len(a) + 1, len(b) + 1), int)
        for i in range(len(a)):
            for j in range(len(b)):
                d[i + 1, j + 1] = d[i, j] + 1 if a[i] == b[j] else max(d[i, j + 1], d[i + 1, j])
        return d[-1, -1]

    # the graph only emits hyp labels that match ref symbols (insertions are epsilon self-loops), so the
    # hyps it accepts are the subsequences of ref; their best score is -0.5 * number of deleted symbols
    for hyp, s in best.items():
        assert lcs(hyp, ref) == len(hyp)
        assert s == pytest.approx(-0.5 * (len(ref) - len(hyp)))
    assert len(best) == 2 ** len(ref)


def test_trivial_graph():
    t = trivial_graph(3)
    assert to_str(t) == "0 0 1 1 0\n0 0 2 2 0\n0 0 3 3 0\n0 1 -1 -1 0\n1\n"
    check_fsa(t)


def test_linear_with_self_loops():
    from fsa_ops.graphs import linear_fsa_with_self_loops, linear_fst_with_self_loops
    f = linear_fsa_with_self_loops([2, 5])
    assert to_str(f) == "0 0 0 0\n0 1 2 0\n1 1 0 0\n1 2 5 0\n2 2 0 0\n2 3 -1 0\n3\n"
    v = linear_fsa_with_self_loops([[1], [2, 3]])
    assert to_str(v[1]) == to_str(linear_fsa_with_self_loops([2, 3]))
    t = linear_fst_with_self_loops(linear_fst([1], [7]))   # k2: ragged aux_labels, [] on self-loops and final arc
    assert to_str(t) == "0 0 0 [ ] 0\n0 1 1 [ 7 ] 0\n1 1 0 [ ] 0\n1 2 -1 [ ] 0\n2\n"
    with pytest.raises(ValueError, match="aux_labels"):
        linear_fst_with_self_loops(linear_fsa([1]))
