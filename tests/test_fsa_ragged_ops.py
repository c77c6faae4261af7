"""Ragged attributes through remove_epsilon, determinize, intersect / compose and shortest_path (issue 22):
k2's expected RaggedTensors (remove_epsilon_test.py, fsa_from_unary_function_ragged_test.py), brute-force
weighted relations (tests/fsa_oracle.py), and an icefall-style LG build and decode on a tiny lexicon."""
import itertools
import math
import os
import sys

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

sys.path.insert(0, os.path.dirname(__file__))
from fsa_oracle import enumerate_paths, languages_close, random_fsas, weighted_language  # noqa: E402

from fsa_ops.connect import connect  # noqa: E402
from fsa_ops.dense import DenseFsaVec, intersect_dense  # noqa: E402
from fsa_ops.determinize import determinize  # noqa: E402
from fsa_ops.fsa import Fsa, check_fsa, create_fsa_vec  # noqa: E402
from fsa_ops.graphs import ctc_topo  # noqa: E402
from fsa_ops.intersect import compose, intersect  # noqa: E402
from fsa_ops.properties import ARC_SORTED, get_properties, is_deterministic  # noqa: E402
from fsa_ops.pruned import intersect_dense_pruned  # noqa: E402
from fsa_ops.random_fsa import is_rand_equivalent, random_fsa  # noqa: E402
from fsa_ops.ragged import Ragged  # noqa: E402
from fsa_ops.remove_epsilon import attrs_from_arc_paths, remove_epsilon, remove_epsilon_and_add_self_loops  # noqa
from fsa_ops.shortest_path import shortest_path  # noqa: E402
from fsa_ops.sort import arc_sort, top_sort  # noqa: E402

SETTINGS = settings(max_examples=20, deadline=None)


def k2_src():
    # k2's remove_epsilon_test.py / fsa_from_unary_function_ragged_test.py input: arc map [[1] [0 2] [2]]
    f = Fsa.from_str("0 1 0 0.1\n0 1 1 0.2\n1 2 -1 0.3\n2\n")
    return f.replace(float_attr=np.array([0.1, 0.2, 0.3], np.float32), int_attr=np.array([1, 2, 3], np.int32),
                     ragged_attr=Ragged.from_lists([[10, 20], [30, 40, 50], [60, 70]]))


def test_remove_epsilon_k2_attributes():
    src = k2_src()
    d = remove_epsilon(src)
    assert d.labels.tolist() == [1, -1, -1]
    assert d.attrs["int_attr"] == Ragged.from_lists([[2], [1, 3], [3]])
    assert d.attrs["ragged_attr"] == Ragged.from_lists([[30, 40, 50], [10, 20, 60, 70], [60, 70]])
    np.testing.assert_allclose(d.attrs["float_attr"], [0.2, 0.1 + 0.3, 0.3], rtol=1e-6)
    np.testing.assert_allclose(d.scores, [0.2, 0.1 + 0.3, 0.3], rtol=1e-6)
    # with self-loops: arc map [[] [1] [0 2] [] [2]]
    e = remove_epsilon_and_add_self_loops(src)
    assert e.labels.tolist() == [0, 1, -1, 0, -1]
    assert e.attrs["int_attr"] == Ragged.from_lists([[], [2], [1, 3], [], [3]])
    assert e.attrs["ragged_attr"] == Ragged.from_lists([[], [30, 40, 50], [10, 20, 60, 70], [], [60, 70]])
    np.testing.assert_allclose(e.attrs["float_attr"], [0, 0.2, 0.4, 0, 0.3], rtol=1e-6)
    np.testing.assert_allclose(e.scores, [0, 0.2, 0.4, 0, 0.3], rtol=1e-6)


def test_remove_epsilon_and_add_self_loops_k2_rules():
    src = k2_src()
    # remove_filler=False keeps 0 and the final -1 of 1-D integer attributes
    f = Fsa.from_str("0 1 0 0 0.1\n0 1 1 2 0.2\n1 2 -1 -1 0.3\n2\n", acceptor=False)
    assert remove_epsilon_and_add_self_loops(f).aux_labels.tolist() == [[], [2], [], [], []]
    assert remove_epsilon_and_add_self_loops(f, remove_filler=False).aux_labels.tolist() == [
        [], [2], [0, -1], [], [-1]]
    # an epsilon-free input only gets the self-loops: attributes stay as they are (k2)
    g = Fsa.from_str("0 1 1 2 0.2\n1 2 -1 -1 0.3\n2\n", acceptor=False)
    h = remove_epsilon_and_add_self_loops(g)
    assert h.labels.tolist() == [0, 1, 0, -1] and h.aux_labels.tolist() == [0, 2, 0, -1]
    v = remove_epsilon_and_add_self_loops(create_fsa_vec([src, src]))
    assert v[1].attrs["int_attr"].tolist() == [[], [2], [1, 3], [], [3]]


def test_attrs_from_arc_paths_k2():
    # fsa_from_unary_function_ragged_test.py: the attribute rules applied to a given ragged arc map
    src = k2_src()
    for rows, exp_int, exp_rag, exp_f in [
            ([[1], [0, 2], [2]], [[2], [1, 3], [3]], [[30, 40, 50], [10, 20, 60, 70], [60, 70]], [.2, .4, .3]),
            ([[], [1], [0, 2], [], [2]], [[], [2], [1, 3], [], [3]],
             [[], [30, 40, 50], [10, 20, 60, 70], [], [60, 70]], [0, .2, .4, 0, .3])]:
        amap = Ragged.from_lists(rows)
        out = attrs_from_arc_paths(src, amap.row_splits, amap.flat_values)
        assert out["int_attr"].tolist() == exp_int and out["ragged_attr"].tolist() == exp_rag
        np.testing.assert_allclose(out["float_attr"], exp_f, rtol=1e-6)
    # fillers: 0 is dropped from 1-D integer attributes, and -1 only on arcs into the final state
    f = Fsa.from_str("0 1 1 0\n1 2 -1 0\n2\n").replace(a=np.array([0, -1], np.int32), b=np.array([-1, -1], np.int32))
    out = attrs_from_arc_paths(f, [0, 2, 3], [0, 1, 1])
    assert out["a"].tolist() == [[], []] and out["b"].tolist() == [[-1], []]


def test_remove_epsilon_k2_fillers_and_ragged_aux():
    # k2's TestRemoveEpsilonDeviceFillers input: no filler (0) left in the ragged result
    s = "0 1 0 1 1\n1 2 0 2 1\n2 3 0 3 1\n3 4 4 4 1\n3 5 -1 5 1\n4 5 -1 6 1\n5\n"
    d = remove_epsilon(Fsa.from_str(s, aux_label_names=["foo"]))
    assert sorted(d.attrs["foo"].tolist()) == [[1, 2, 3, 4], [1, 2, 3, 5], [6]]
    # Ragged aux_labels in: rows concatenated, 0s removed (k2 removes them from a ragged aux_labels), and the
    # final arc's [-1] row of a Ragged input kept
    f = Fsa.from_str("0 1 0 0\n1 2 3 0\n2 3 -1 0\n3\n").replace(
        aux_labels=Ragged.from_lists([[7, 0], [8, 9], [-1]]))
    g = remove_epsilon(f)
    assert g.labels.tolist() == [3, -1] and g.aux_labels.tolist() == [[7, 8, 9], [-1]]


@SETTINGS
@given(random_fsas(acyclic=False, aux_labels="ragged", max_states=5, max_arcs=9, num_labels=3), st.booleans())
def test_remove_epsilon_ragged_input(f, log):
    g = remove_epsilon(f, log_semiring=log)
    check_fsa(g)
    assert isinstance(g.aux_labels, Ragged) and not np.any(g.label == 0)
    nb = dict(max_labels=3, max_arcs=40)
    key = "both" if log else "labels"   # tropical keeps the best epsilon path only (k2): compare label scores
    ok, msg = languages_close(weighted_language(g, log, key, **nb), weighted_language(f, log, key, **nb))
    assert ok, msg
    if not log:   # every (labels, aux) pair of the result is one of the input's, with a score it reaches
        rf = weighted_language(f, False, "both", **nb)
        for k, v in weighted_language(g, False, "both", **nb).items():
            assert k in rf and v <= rf[k] + 1e-4, (k, v)


def test_remove_epsilon_batch_ragged():
    f = Fsa.from_str("0 1 0 5 1\n0 1 1 6 2\n1 2 0 7 3\n1 3 2 8 4\n2 3 3 9 5\n3 4 -1 -1 0\n4\n", acceptor=False)
    h = Fsa.from_str("0 1 2 4 1\n1 2 -1 -1 0\n2\n", acceptor=False)
    v = remove_epsilon(create_fsa_vec([f, h]))
    assert v.aux_labels.ndim == 3
    assert v[0].aux_labels.tolist() == [[6], [5, 8], [5, 7, 9], [8], [7, 9], []]
    assert v[1].aux_labels.tolist() == [[4], []]


# ------------------------------------------------------------------ determinize of transducers
def best_by_labels(f, **bounds):
    """label sequence -> (best score, set of aux sequences reaching it) over f's paths (tropical)."""
    out = {}
    for (x, y), s in weighted_language(f, False, "both", **bounds).items():
        b, ys = out.get(x, (-math.inf, set()))
        if s > b + 1e-5:
            out[x] = (s, {y})
        elif s > b - 1e-5:
            out[x] = (max(s, b), ys | {y})
    return out


@SETTINGS
@given(random_fsas(acyclic=True, epsilons=False, aux_labels=True, max_states=6, max_arcs=12, num_labels=2),
       st.booleans())
def test_determinize_transducer_keeps_best_path(f, ragged):
    if ragged:
        f = f.replace(aux_labels=Ragged.from_dense(f.aux_labels))
    d = determinize(f)
    check_fsa(d)
    assert isinstance(d.aux_labels, Ragged)
    assert is_deterministic(d) and get_properties(d) & ARC_SORTED
    ok, msg = languages_close(weighted_language(d, False), weighted_language(f, False))   # labels: tropical
    assert ok, msg
    exp = best_by_labels(f)
    got = weighted_language(d, False, "both")
    assert sorted(x for x, _ in got) == sorted(exp)   # one aux sequence per label sequence (deterministic)
    for (x, y), s in got.items():
        assert s == pytest.approx(exp[x][0], abs=1e-4) and y in exp[x][1], (x, y, s, exp[x])


@SETTINGS
@given(random_fsas(acyclic=False, epsilons=False, aux_labels=True, max_states=5, max_arcs=9, num_labels=3))
def test_determinize_functional_transducer_is_equivalent(f):
    # aux label = a function of the label: functional, so the whole weighted relation survives (tropical)
    aux = np.where(f.label == -1, -1, (f.label * 7) % 5).astype(np.int32)
    f = f.replace(aux_labels=aux)
    try:
        d = determinize(f, max_states=200)
    except ValueError as e:   # cyclic input need not be determinizable (twins property)
        assert "max_states" in str(e)
        return
    assert is_deterministic(d)
    nb = dict(max_labels=3, max_arcs=12)
    ok, msg = languages_close(weighted_language(d, False, "both", **nb), weighted_language(f, False, "both", **nb))
    assert ok, msg


@pytest.mark.parametrize("seed", [0, 1, 4])
def test_determinize_k2_random(seed):
    # k2's determinize_test.py test_random: random_fsa -> remove_epsilon -> connect -> arc_sort -> determinize is
    # rand-equivalent (tropical, delta 1e-3); here also as a transducer (aux_labels = arc number, ragged)
    f = random_fsa(max_symbol=20, min_num_arcs=50, max_num_arcs=500, seed=seed)
    f = f.replace(aux_labels=np.where(f.label == -1, -1, np.arange(1, len(f.label) + 1)).astype(np.int32))
    g = arc_sort(connect(remove_epsilon(f)))
    assert isinstance(g.aux_labels, Ragged) and not is_deterministic(g)
    for h in (g, g.replace(aux_labels=None)):
        d = determinize(h)
        assert is_deterministic(d) and is_rand_equivalent(g, d, False, delta=1e-3, seed=seed)
    # k2's test1 as a transducer
    arcs = np.array([(0, 4, 1), (0, 1, 1), (1, 2, 2), (1, 3, 3), (2, 7, 1), (3, 7, 1), (4, 6, 1), (4, 6, 1),
                     (4, 5, 1), (4, 8, -1), (5, 8, -1), (6, 8, -1), (7, 8, -1)])
    t = Fsa.from_arcs(arcs[:, 0], arcs[:, 1], arcs[:, 2], np.array([1, 1, 2, 3, 4, 5, 2, 3, 3, 2, 4, 3, 5], np.float32),
                      num_states=9, aux_labels=np.where(arcs[:, 2] == -1, -1, np.arange(10, 23)))
    d = determinize(t)
    assert is_rand_equivalent(t, d, False) and is_deterministic(d)
    exp = best_by_labels(t)
    for (x, y), sc in weighted_language(d, False, "both").items():
        assert sc == pytest.approx(exp[x][0]) and y in exp[x][1]


def test_determinize_transducer_examples_and_errors():
    # a 1-label choice with two outputs: the best (score 1.25 via aux 3) wins, emitted when the paths merge
    t = Fsa.from_str("0 1 1 2 0.5\n0 2 1 3 0.25\n1 3 2 0 0\n2 3 2 0 1\n3 4 -1 -1 0\n4\n", acceptor=False)
    d = determinize(t)
    assert d.labels.tolist() == [1, 2, -1] and d.aux_labels.tolist() == [[], [3], []]
    np.testing.assert_allclose(d.scores, [0, 1.25, 0])
    # homophones told apart by disambiguation symbols 7 / 8: the words come out on those arcs
    h = Fsa.from_str("0 1 1 10 0.5\n0 2 1 11 0.25\n1 3 2 0 0\n2 4 2 0 1\n3 5 7 0 0\n4 5 8 0 0\n5 6 -1 -1 0\n6\n",
                     acceptor=False)
    d = determinize(h)
    assert d.labels.tolist() == [1, 2, 7, 8, -1] and d.aux_labels.tolist() == [[], [], [10], [11], []]
    ok, msg = languages_close(weighted_language(d, False, "both"), weighted_language(h, False, "both"))
    assert ok, msg
    # a deterministic transducer keeps its arcs; aux_labels turn ragged (k2 would leave them 1-D)
    g = Fsa.from_str("0 1 1 5 0.5\n1 2 -1 -1 0\n2\n", acceptor=False)
    assert determinize(g).aux_labels.tolist() == [[5], []]
    # float attributes are summed along the arcs each output arc derives from
    tf = t.replace(w=np.array([1, 2, 4, 8, 16], np.float32))
    np.testing.assert_allclose(determinize(tf).attrs["w"], [0, 2 + 8, 16])
    af = tf.replace(aux_labels=None)   # an acceptor with a float attribute: the same arcs (k2 sums it too)
    da = determinize(af)
    assert da.labels.tolist() == [1, 2, -1] and "aux_labels" not in da.attrs
    np.testing.assert_allclose(da.attrs["w"], [0, 2 + 8, 16])
    assert "w" not in determinize(af, log_semiring=True).attrs   # (log semiring: the subset construction)
    with pytest.raises(ValueError, match="log_semiring=True needs an acceptor"):
        determinize(t, log_semiring=True)
    with pytest.raises(TypeError, match="log_semiring must be a bool"):
        determinize(t, "kLogWeightPushing")
    with pytest.raises(ValueError, match="epsilon"):
        determinize(Fsa.from_str("0 1 0 3 0\n1 2 -1 -1 0\n2\n", acceptor=False))
    # two never-merging loops on the same label: not determinizable
    loops = Fsa.from_str("0 1 1 1 0\n0 2 1 2 0\n1 1 1 1 -1\n2 2 1 2 -2\n1 3 -1 -1 0\n2 3 -1 -1 0\n3\n",
                         acceptor=False)
    with pytest.raises(ValueError, match="max_states=50"):
        determinize(loops, max_states=50)
    v = determinize(create_fsa_vec([t, h]))
    assert v[0].aux_labels.tolist() == [[], [3], []] and v[1].aux_labels.tolist() == [[], [], [10], [11], []]


# ------------------------------------------------------------------ intersect / compose / shortest_path
@SETTINGS
@given(random_fsas(acyclic=True, aux_labels="ragged", max_states=5, max_arcs=8, num_labels=2),
       random_fsas(acyclic=True, max_states=5, max_arcs=8, num_labels=2), st.booleans())
def test_intersect_carries_ragged(a, b, swap):
    a, b = arc_sort(a), arc_sort(b)
    x, y = (b, a) if swap else (a, b)
    c, ma, mb = intersect(x, y, ret_arc_maps=True)
    check_fsa(c)
    m = mb if swap else ma
    rows = a.aux_labels.tolist()
    assert c.aux_labels.tolist() == [rows[i] if i >= 0 else [] for i in m.tolist()]


@SETTINGS
@given(random_fsas(acyclic=True, aux_labels=True, max_states=5, max_arcs=8, num_labels=2),
       random_fsas(acyclic=True, aux_labels="ragged", max_states=5, max_arcs=8, num_labels=2, epsilons=False))
def test_compose_with_ragged_b(a, b):
    b = arc_sort(b)
    c = compose(a, b, inner_labels="inner")
    check_fsa(c)
    assert isinstance(c.aux_labels, Ragged) and isinstance(c.attrs["inner"], np.ndarray)
    # relation: a's labels -> b's aux sequence, through a's aux == b's labels (a has epsilons only: log exact)
    ra = weighted_language(a, True, "both")
    rb = weighted_language(b, True, "both")
    exp = {}
    for (x, y), s in ra.items():
        for (y2, z), t in rb.items():
            if y == y2:
                exp[(x, z)] = np.logaddexp(exp.get((x, z), -math.inf), s + t)
    ok, msg = languages_close(weighted_language(c, True, "both"), exp)
    assert ok, msg


def test_intersect_compose_ragged_errors():
    a = Fsa.from_str("0 1 1 2 0\n1 2 -1 -1 0\n2\n", acceptor=False)
    r = a.replace(aux_labels=Ragged.from_lists([[2, 3], [-1]]))
    with pytest.raises(ValueError, match="a_fsa must have aux_labels with one label per arc"):
        compose(r, a)
    with pytest.raises(ValueError, match="'aux_labels' is on both"):
        intersect(r, a)
    # a Ragged attribute of a_fsa (other than aux_labels) follows a's arcs through invert / arc_sort / intersect
    t = Fsa.from_str("0 1 7 1 0\n0 1 8 2 0\n1 2 -1 -1 0\n2\n", acceptor=False).replace(
        extra=Ragged.from_lists([[70], [80, 81], []]))
    c = compose(t, arc_sort(Fsa.from_str("0 1 2 0\n1 2 -1 0\n2\n")))
    assert c.labels.tolist() == [8, -1] and c.attrs["extra"].tolist() == [[80, 81], []]
    e = intersect(r, arc_sort(Fsa.from_str("0 1 5 0\n1 2 -1 0\n2\n")))   # no common path: empty, attrs kept
    assert int(e.num_states) == 0 and isinstance(e.aux_labels, Ragged) and len(e.aux_labels) == 0


def test_shortest_path_ragged():
    f = Fsa.from_str("0 1 1 0.5\n0 2 2 0.25\n1 3 3 1\n2 3 4 0\n3 4 -1 0\n4\n").replace(
        aux_labels=Ragged.from_lists([[5, 6], [], [7], [8, 9, 10], [-1]]))
    p = shortest_path(f, use_double_scores=False)
    assert p.labels.tolist() == [1, 3, -1]
    assert p.aux_labels.tolist() == [[5, 6], [7], [-1]]
    assert p.aux_labels.remove_values_leq(0).tolist() == [[5, 6], [7], []]
    g = Fsa.from_str("0 1 2 0\n1 2 -1 0\n2\n").replace(aux_labels=Ragged.from_lists([[4, 0, 4], [-1]]))
    v = shortest_path(create_fsa_vec([f, g]), use_double_scores=False)
    words = [sum(r, []) for r in v.aux_labels.remove_values_leq(0).tolist()]
    assert words == [[5, 6, 7], [4, 4]]
    j = jax.jit(lambda fs: shortest_path(fs, use_double_scores=False))(create_fsa_vec([f, g]).to_jax())
    assert isinstance(j.aux_labels, Ragged) and j.aux_labels.tolist() == v.aux_labels.tolist()


# ------------------------------------------------------------------ icefall's compile_LG and get_texts
# tokens 1..3, token disambig #0 = 4, #1 = 5, #2 = 6; words 1..5, word #0 = 6
LEXICON = {1: [([1], 0.0)], 2: [([2], 0.0)], 3: [([1, 2], 0.0)],
           4: [([3], -0.2), ([2, 3], -1.6)], 5: [([3], -0.9)]}
DISAMBIG = {(1, (1,)): 5, (2, (2,)): 5, (4, (3,)): 5, (5, (3,)): 6}   # prefixes of other prons; homophones
TOK_DISAMBIG, WORD_DISAMBIG = 4, 6
# G (labels = aux = words, #0 on backoff arcs; one history state per word as an ARPA G has, except 2 and 3)
G_TEXT = """0 1 1 1 -0.5
0 2 6 6 -1.0
1 2 6 6 -0.7
1 5 -1 -1 -0.2
2 1 1 1 -1.2
2 2 2 2 -1.1
2 2 3 3 -1.3
2 3 4 4 -1.7
2 4 5 5 -2.1
2 5 -1 -1 -0.3
3 2 6 6 -0.4
3 5 -1 -1 -0.6
4 2 6 6 -0.8
4 5 -1 -1 -0.1
5
"""


def lexicon_fst():
    """L with disambiguation symbols as icefall's lexicon_to_fst (tokens -> words) plus the #0:#0 loop."""
    arcs, nxt = [], 1
    for w, prons in LEXICON.items():
        for toks, score in prons:
            toks = list(toks) + ([DISAMBIG[(w, tuple(toks))]] if (w, tuple(toks)) in DISAMBIG else [])
            cur = 0
            for i, t in enumerate(toks):
                dst = 0 if i == len(toks) - 1 else nxt
                nxt += dst != 0
                arcs.append((cur, dst, t, w if i == 0 else 0, score if i == 0 else 0.0))
                cur = dst
    arcs.append((0, 0, TOK_DISAMBIG, WORD_DISAMBIG, 0.0))
    arcs.append((0, nxt, -1, -1, 0.0))
    text = "".join(f"{a} {b} {c} {d} {e}\n" for a, b, c, d, e in sorted(arcs, key=lambda x: x[0]))
    return Fsa.from_str(text + f"{nxt}\n", acceptor=False)


def test_determinize_lg_keeps_relation():
    # compose(L, G) with disambiguation symbols is functional: determinize keeps its whole weighted relation
    LG = connect(compose(arc_sort(lexicon_fst()), arc_sort(Fsa.from_str(G_TEXT, acceptor=False))))
    d = determinize(LG)
    assert is_deterministic(d) and isinstance(d.aux_labels, Ragged)
    assert len(d.labels) < len(LG.labels)
    nb = dict(max_labels=6)
    ok, msg = languages_close(weighted_language(d, False, "both", **nb), weighted_language(LG, False, "both", **nb))
    assert ok, msg
    ok, msg = languages_close(weighted_language(d, True, "both", **nb), weighted_language(LG, True, "both", **nb))
    assert ok, msg   # (one path per label sequence here, so the log semiring agrees too)


def compile_lg(log_semiring=False):
    """icefall's compile_LG (local/compile_hlg.py), step by step; `log_semiring` for its remove_epsilon."""
    L = arc_sort(lexicon_fst())
    G = arc_sort(Fsa.from_str(G_TEXT, acceptor=False))
    LG = connect(compose(L, G))
    LG = connect(determinize(LG))
    assert isinstance(LG.aux_labels, Ragged)
    labels = LG.labels
    labels[labels >= TOK_DISAMBIG] = 0
    LG.labels = labels
    LG.aux_labels.values[LG.aux_labels.values >= WORD_DISAMBIG] = 0
    LG = connect(remove_epsilon(LG, log_semiring=log_semiring))
    LG.aux_labels = LG.aux_labels.remove_values_eq(0)
    return arc_sort(LG)


def reference_lg(max_tokens, log=False):
    """(tokens, words) -> combined score over G's paths and the lexicon's pronunciations."""
    G = Fsa.from_str(G_TEXT, acceptor=False)
    out = {}
    for p in enumerate_paths(G, max_labels=2 * max_tokens + 1):   # (a #0 before and after each word)
        words = [w for w in p.labels if w > 0 and w != WORD_DISAMBIG]
        for prons in itertools.product(*[LEXICON[w] for w in words]):
            toks = tuple(t for toks, _ in prons for t in toks)
            if len(toks) <= max_tokens:
                s = p.score + sum(sc for _, sc in prons)
                k = (toks, tuple(words))
                out[k] = np.logaddexp(out.get(k, -math.inf), s) if log else max(out.get(k, -math.inf), s)
    return out


def test_compile_lg_matches_brute_force():
    LG = compile_lg()
    check_fsa(LG)
    assert not np.any(LG.labels == 0) and get_properties(LG) & ARC_SORTED
    assert not np.any(LG.labels >= TOK_DISAMBIG) and all(0 < w < WORD_DISAMBIG
                                                         for r in LG.aux_labels.tolist() for w in r if w != -1)
    got = weighted_language(LG, False, "both", max_labels=4)
    exp = reference_lg(4)
    # k2's remove_epsilon is tropical: per token sequence the best score and its words survive, and every
    # (tokens, words) pair left is a real one with its best score; a pair whose only paths differ from a
    # better pair's in epsilon arcs between the same two states is dropped (here "c a" read as words 5 1: the
    # word 5 -> backoff path loses to the word 4 -> backoff one)
    best = {}
    for (x, w), v in exp.items():
        if v > best.get(x, (-math.inf, None))[0]:
            best[x] = (v, w)
    got_best = {}
    for (x, w), v in got.items():
        assert v == pytest.approx(exp[(x, w)], abs=1e-4), (x, w)
        if v > got_best.get(x, (-math.inf, None))[0]:
            got_best[x] = (v, w)
    assert sorted(got_best) == sorted(best)
    for x, (v, w) in best.items():
        assert got_best[x][1] == w and got_best[x][0] == pytest.approx(v, abs=1e-4), x
    assert ((1, 2), (3,)) in got and ((1, 2), (1, 2)) in got and ((3,), (5,)) in got   # ambiguity kept apart
    assert ((3, 1), (5, 1)) not in got and ((3, 1), (5, 1)) in exp
    # removing epsilons in the log semiring keeps those paths apart: the whole weighted relation (log)
    ok, msg = languages_close(weighted_language(compile_lg(True), True, "both", max_labels=4), reference_lg(4, True))
    assert ok, msg


@pytest.mark.parametrize("seed, n_words", [(0, 1), (7, 2), (33, 3)])
def test_hlg_lattice_best_path_words(seed, n_words):
    """Decode with HLG = compose(ctc_topo, LG) as icefall's compile_HLG: the lattice (HLG intersected with a
    frame acceptor, every arc consuming one frame, blank included, as intersect_dense does) gives through its
    best path's ragged aux_labels (icefall's get_texts: remove_values_leq(0)) the brute-force best words."""
    LG = compile_lg()
    HLG = arc_sort(connect(compose(ctc_topo(3), LG, inner_labels="tokens")))
    assert isinstance(HLG.aux_labels, Ragged) and "tokens" in HLG.attrs
    rng = np.random.default_rng(seed)
    T = 4
    logp = np.log(rng.dirichlet(np.ones(4) * 0.5, size=T)).astype(np.float32)   # [T, blank + 3 tokens]
    arcs = [f"{t} {t + 1} {k} {logp[t, k]}\n" for t in range(T) for k in range(4)]
    frames = Fsa.from_str("".join(arcs) + f"{T} {T + 1} -1 0\n{T + 1}\n")
    lat = top_sort(connect(intersect(frames, HLG, treat_epsilons_specially=False)))
    best = shortest_path(create_fsa_vec([lat]), use_double_scores=False)
    words = [sum(r, []) for r in best.aux_labels.remove_values_leq(0).tolist()]
    # brute force: every frame labelling, CTC-collapsed to tokens, plus the best LG words for those tokens
    best_words = {}
    for (x, w), v in reference_lg(T).items():
        best_words[x] = max(best_words.get(x, (-math.inf, None)), (v, w))
    exp = (-math.inf, None)
    for seq in itertools.product(range(4), repeat=T):
        toks = tuple(k for i, k in enumerate(seq) if k != 0 and (i == 0 or seq[i - 1] != k))
        if toks in best_words:
            exp = max(exp, (float(sum(logp[t, k] for t, k in enumerate(seq))) + best_words[toks][0],
                            best_words[toks][1]))
    assert words == [list(exp[1])] and len(exp[1]) == n_words
    assert float(np.asarray(best.scores)[0, :int(best.num_arcs[0])].sum()) == pytest.approx(exp[0], abs=1e-4)
    # the same through icefall's decoding path: intersect_dense_pruned on a DenseFsaVec, then get_texts
    dense = DenseFsaVec(logp[None], np.array([[0, 0, T]], np.int32))
    lat = intersect_dense_pruned(HLG, dense, search_beam=20.0, output_beam=8.0, min_active_states=30,
                                 max_active_states=10000)
    exact = intersect_dense(HLG, dense, output_beam=8.0)                  # and the exact (unpruned) lattice
    for lat in (lat, exact):
        best = shortest_path(lat, use_double_scores=False)
        assert [sum(r, []) for r in best.aux_labels.remove_values_leq(0).tolist()] == [list(exp[1])]
        assert float(np.asarray(best.scores)[0, :int(best.num_arcs[0])].sum()) == pytest.approx(exp[0], abs=1e-4)
