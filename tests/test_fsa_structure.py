"""Host-side structure ops: each preserves (or transforms as specified) the weighted language computed by the
brute-force oracle on hypothesis-drawn FSAs; k2's documented examples give k2's outputs."""
import math
import os
import sys

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

sys.path.insert(0, os.path.dirname(__file__))
from fsa_oracle import (_is_acyclic, assert_same_language, lang, languages_close, random_fsas,  # noqa: E402
                        weighted_language)

from fsa_ops.connect import accessible_states, coaccessible_states, connect  # noqa: E402
from fsa_ops.fsa import Fsa, check_fsa, create_fsa_vec, to_str  # noqa: E402
from fsa_ops.intersect import compose, intersect  # noqa: E402
from fsa_ops.properties import (ARC_SORTED, EPSILON_FREE, TOPSORTED, get_properties, is_acyclic,  # noqa: E402
                                is_connected, is_deterministic, properties_to_str)
from fsa_ops.determinize import determinize  # noqa: E402
from fsa_ops.ragged import Ragged  # noqa: E402
from fsa_ops.remove_epsilon import remove_epsilon  # noqa: E402
from fsa_ops.sort import arc_sort, top_sort  # noqa: E402
from fsa_ops.unary import (add_epsilon_self_loops, closure, invert, project,  # noqa: E402
                           remove_epsilon_self_loops, union)

SETTINGS = settings(max_examples=30, deadline=None)


def permute_states(f, perm_seed):
    """Relabel the middle states of f with a random permutation (start and final stay)."""
    ns = int(f.num_states)
    rng = np.random.default_rng(perm_seed)
    mid = rng.permutation(np.arange(1, ns - 1)) if ns > 2 else np.zeros(0, int)
    new = np.concatenate([[0], mid, [ns - 1]]) if ns > 1 else np.array([0])
    return Fsa.from_arcs(new[f.src], new[f.dst], f.label, f.score, num_states=ns, attrs=f.attrs)


# ------------------------------------------------------------------ arc_sort / top_sort / connect
@SETTINGS
@given(random_fsas(acyclic=False, aux_labels=True, max_states=5, max_arcs=10))
def test_arc_sort(f):
    g, amap = arc_sort(f, ret_arc_map=True)
    check_fsa(g)
    assert get_properties(g) & ARC_SORTED
    np.testing.assert_array_equal(g.label, f.label[amap])
    np.testing.assert_array_equal(g.aux_labels, f.aux_labels[amap])
    np.testing.assert_array_equal(g.src, f.src[amap])
    for s in range(int(g.num_states)):  # within a state: by unsigned label then dst
        lab = g.label[g.src == s].astype(np.int64) & 0xFFFFFFFF
        key = list(zip(lab.tolist(), g.dst[g.src == s].tolist()))
        assert key == sorted(key)
    assert_same_language(f, g, key="both")
    # batch
    v = arc_sort(create_fsa_vec([f, f]))
    assert to_str(v[1]) == to_str(g)


def test_top_sort_k2_example():
    # k2/csrc/top_sort_test.cu: expected arc_map {0, 1, 3, 4, 2}
    f = Fsa.from_str("0 1 1 1\n0 2 2 2\n1 3 -1 13\n2 1 1 21\n2 3 -1 23\n3\n")
    g, amap = top_sort(f, ret_arc_map=True)
    assert to_str(g) == "0 2 1 1\n0 1 2 2\n1 2 1 21\n1 3 -1 23\n2 3 -1 13\n3\n"
    assert amap.tolist() == [0, 1, 3, 4, 2]
    with pytest.raises(ValueError, match="cycles"):
        top_sort(Fsa.from_str("0 1 1 0\n1 2 2 0\n2 1 3 0\n2 3 -1 0\n3\n"))
    # self-loops are fine
    h = top_sort(Fsa.from_str("0 2 1 0\n1 1 5 0\n1 3 -1 0\n2 1 2 0\n2 2 3 0\n3\n"))
    assert get_properties(h) & TOPSORTED


@SETTINGS
@given(random_fsas(acyclic=True, aux_labels=True, max_states=6, max_arcs=10), st.integers(0, 1000))
def test_top_sort_language(f, seed):
    p = permute_states(f, seed)
    g, amap = top_sort(p, ret_arc_map=True)
    check_fsa(g)
    assert np.all(g.dst > g.src)
    np.testing.assert_array_equal(g.label, p.label[amap])
    np.testing.assert_array_equal(g.score, p.score[amap])
    assert_same_language(f, g, key="both")


def test_connect_k2_example():
    # k2/csrc/connect_test.cu input: states 2, 3 lead to 1 -> final; 4 and 5 are dead/unreachable
    f = Fsa.from_str("0 2 1 1\n0 3 3 3\n1 4 5 5\n1 6 -1 0\n2 1 2 2\n3 1 4 4\n5 3 6 6\n6\n")
    g, amap = connect(f, ret_arc_map=True)
    assert to_str(g) == "0 2 1 1\n0 3 3 3\n1 4 -1 0\n2 1 2 2\n3 1 4 4\n4\n"
    assert amap.tolist() == [0, 1, 3, 4, 5]
    e = connect(Fsa.from_str("0 1 1 0\n2 3 -1 0\n3\n"))
    assert int(e.num_states) == 0 and len(e.label) == 0


@SETTINGS
@given(random_fsas(acyclic=False, aux_labels=True, max_states=6, max_arcs=10, ensure_path=False))
def test_connect_language(f):
    g = connect(f)
    check_fsa(g)
    ns = int(f.num_states)
    # brute-force accessibility
    acc = {0}
    changed = True
    while changed:
        changed = False
        for a, d in zip(f.src.tolist(), f.dst.tolist()):
            if a in acc and d not in acc:
                acc.add(d)
                changed = True
    coacc = {ns - 1}
    changed = True
    while changed:
        changed = False
        for a, d in zip(f.src.tolist(), f.dst.tolist()):
            if d in coacc and a not in coacc:
                coacc.add(a)
                changed = True
    keep = acc & coacc
    expected_states = len(keep) if (0 in keep and ns - 1 in keep) else 0
    assert int(g.num_states) == expected_states
    if expected_states:
        assert is_connected(g)
        assert accessible_states(g).all() and coaccessible_states(g).all()
    assert_same_language(f, g, key="both")


# ------------------------------------------------------------------ unary
@SETTINGS
@given(random_fsas(acyclic=False, aux_labels=True, max_states=5, max_arcs=6))
def test_invert_and_project(f):
    g = invert(f)
    check_fsa(g)
    # same paths arc for arc: bound both by f's input labels (g's aux_labels)
    lf = weighted_language(f, key="both", max_labels=3, max_arcs=12)
    lg = weighted_language(g, key="both", max_labels=3, max_arcs=12, count_attr="aux_labels")
    ok, msg = languages_close({(k[1], k[0]): v for k, v in lf.items()}, lg)
    assert ok, msg
    np.testing.assert_array_equal(invert(g).label, f.label)
    pi = project(f, project_input=True)
    assert "aux_labels" not in pi.attrs
    ok, msg = languages_close(lang(pi), lang(f))
    assert ok, msg
    po = project(f, project_input=False)
    check_fsa(po)
    ok, msg = languages_close(weighted_language(po, max_arcs=6), weighted_language(f, key="aux_labels",
                                                                                      max_arcs=6))
    assert ok, msg
    la = lf
    assert la  # f has at least one path (ensure_path)
    with pytest.raises(ValueError, match="aux_labels"):
        invert(pi)


@SETTINGS
@given(random_fsas(acyclic=True, aux_labels=True, max_states=5, max_arcs=8))
def test_epsilon_self_loops(f):
    g = add_epsilon_self_loops(f)
    check_fsa(g)
    ns = int(f.num_states)
    for s in range(ns - 1):
        first = np.nonzero(g.src == s)[0][0]
        assert g.label[first] == 0 and g.dst[first] == s and g.score[first] == 0 and g.aux_labels[first] == 0
    assert len(g.label) == len(f.label) + ns - 1
    # tropical language unchanged (score-0 loops), with a bound on arcs because of the loops
    ok, msg = languages_close(weighted_language(f, False, key="both"),
                              weighted_language(g, False, key="both", max_arcs=2 * ns + 2))
    assert ok, msg
    h = remove_epsilon_self_loops(g)
    no_eps_loops = ~((f.label == 0) & (f.src == f.dst))
    np.testing.assert_array_equal(h.label, f.label[no_eps_loops])
    np.testing.assert_array_equal(h.aux_labels, f.aux_labels[no_eps_loops])


@SETTINGS
@given(st.lists(random_fsas(acyclic=False, aux_labels=True, max_states=4, max_arcs=6), min_size=1, max_size=3))
def test_union(fs):
    u = union(create_fsa_vec(fs))
    check_fsa(u)
    expected = {}
    for f in fs:
        for k, v in lang(f, key="both").items():
            expected[k] = np.logaddexp(expected.get(k, -math.inf), v)
    ok, msg = languages_close(lang(u, key="both", max_labels=3, max_arcs=13), expected)
    assert ok, msg


def test_closure_k2_examples():
    # k2/python/tests/closure_test.py
    f = Fsa.from_str("0 1 1 0.1\n1 2 2 0.2\n2 3 -1 0.3\n3\n").replace(aux_labels=np.array([10, 20, -1], np.int32))
    c = closure(f)
    assert np.stack([c.src, c.dst, c.label], 1).tolist() == [[0, 1, 1], [0, 3, -1], [1, 2, 2], [2, 0, 0]]
    np.testing.assert_allclose(c.score, [0.1, 0.0, 0.2, 0.3], rtol=1e-6)
    assert c.aux_labels.tolist() == [10, -1, 20, 0]
    g = Fsa.from_str("0 1 1 0.0\n0 2 2 0.1\n0 3 -1 0.2\n1 0 0 0.3\n1 2 2 0.4\n1 3 -1 0.5\n2 0 0 0.6\n2 1 1 0.7\n"
                     "2 2 2 0.8\n2 3 -1 0.9\n3\n").replace(
        aux_labels=np.array([0, 1, -1, 2, 3, -1, 4, 5, 6, -1], np.int32))
    c = closure(g)
    assert np.stack([c.src, c.dst, c.label], 1).tolist() == [
        [0, 1, 1], [0, 2, 2], [0, 0, 0], [0, 3, -1], [1, 0, 0], [1, 2, 2], [1, 0, 0], [2, 0, 0], [2, 1, 1],
        [2, 2, 2], [2, 0, 0]]
    np.testing.assert_allclose(c.score, [0., 0.1, 0.2, 0, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9], rtol=1e-6)
    assert c.aux_labels.tolist() == [0, 1, 0, -1, 2, 3, 0, 4, 5, 6, 0]


def test_union_k2_example():
    # k2 union: new start state with epsilon arcs to each FSA, one shared final state
    a = Fsa.from_str("0 1 1 0.1\n1 2 -1 0.2\n2\n")
    b = Fsa.from_str("0 1 2 0.3\n1 2 3 0.4\n2 3 -1 0.5\n3\n")
    u = union(create_fsa_vec([a, b]))
    assert to_str(u) == ("0 1 0 0\n0 3 0 0\n1 2 1 0.1\n2 6 -1 0.2\n3 4 2 0.3\n4 5 3 0.4\n5 6 -1 0.5\n6\n")


@SETTINGS
@given(random_fsas(acyclic=False, epsilons=False, aux_labels=True, max_states=4, max_arcs=6))
def test_closure(f):
    L = lang(f, max_labels=3, max_arcs=20)
    assume(() not in L)  # the empty word would make an epsilon cycle in the closure
    if np.any(f.dst == 0):  # k2's construction is the Kleene closure only without arcs into the start state
        f = Fsa.from_arcs(f.src, np.where(f.dst == 0, 1, f.dst), np.where(f.dst == 0, 1, f.label), f.score,
                          num_states=int(f.num_states), attrs=f.attrs) if int(f.num_states) > 2 else f
        assume(not np.any(f.dst == 0))
        L = lang(f, max_labels=3, max_arcs=20)
        assume(() not in L)
    c = closure(f)
    check_fsa(c)
    # expected: C(()) = 0; C(w) = logsum over factorizations into non-empty words of L
    n = 3
    C = {(): 0.0}
    frontier = {(): 0.0}
    for _ in range(n):
        nxt = {}
        for w, s in frontier.items():
            for u, t in L.items():
                if len(w) + len(u) <= n:
                    nxt[w + u] = np.logaddexp(nxt.get(w + u, -math.inf), s + t)
        for w, s in nxt.items():
            C[w] = np.logaddexp(C.get(w, -math.inf), s)
        frontier = nxt
    got = weighted_language(c, max_labels=n, max_arcs=30)
    ok, msg = languages_close(got, C)
    assert ok, msg + "\n" + to_str(f) + "\n" + to_str(c)
    fin = int(c.num_states) - 1
    assert np.all(c.aux_labels[c.dst == fin] == -1) and np.all(c.aux_labels[c.dst != fin] != -1)


# ------------------------------------------------------------------ intersect / compose
def test_properties_str():
    f = Fsa.from_str("0 1 1 1\n0 2 2 2\n1 3 -1 13\n2 1 1 21\n2 3 -1 23\n3\n")
    assert f.properties_str == ("Valid|Nonempty|ArcSorted|ArcSortedAndDeterministic|EpsilonFree|"
                                "MaybeAccessible|MaybeCoaccessible")
    g = top_sort(f)
    assert "TopSortedAndAcyclic" in properties_to_str(get_properties(g))
    h = Fsa.from_str("0 1 2 0\n0 1 0 0\n0 2 -1 0\n1 2 -1 0\n2\n")
    assert properties_to_str(get_properties(h)).split("|") == ["Valid", "Nonempty", "TopSorted",
                                                               "TopSortedAndAcyclic", "MaybeAccessible",
                                                               "MaybeCoaccessible"]


@SETTINGS
@given(random_fsas(acyclic=False, max_states=5, max_arcs=8, ensure_path=False))
def test_properties_vs_brute_force(f):
    p = get_properties(f)
    ns = int(f.num_states)
    assert is_acyclic(f) == (_is_acyclic(ns, f.src.tolist(), f.dst.tolist()) and not np.any(f.src == f.dst))
    pairs = list(zip(f.src.tolist(), f.label.tolist()))
    assert is_deterministic(f) == (len(set(pairs)) == len(pairs))
    assert bool(p & TOPSORTED) == all(d >= s for s, d in zip(f.src.tolist(), f.dst.tolist()))
    assert bool(arc_sort(f).properties & ARC_SORTED)


# ------------------------------------------------------------------ remove_epsilon / determinize
@SETTINGS
@given(random_fsas(acyclic=False, aux_labels=True, max_states=5, max_arcs=9, num_labels=3))
def test_remove_epsilon(f):
    g = remove_epsilon(f)
    check_fsa(g)
    assert not np.any(g.label == 0)
    # no arc bound: removing epsilons shortens paths (no epsilon cycles here, so labels bound the paths)
    nb = dict(max_labels=3, max_arcs=40)
    ok, msg = languages_close(lang(g, log=False, **nb), lang(f, log=False, **nb))  # tropical, by labels (k2)
    assert ok, msg
    h = remove_epsilon(f, log_semiring=True)
    check_fsa(h)
    assert not np.any(h.label == 0)
    ok, msg = languages_close(lang(h, key="both", **nb), lang(f, key="both", **nb))  # log: whole relation
    assert ok, msg
    for out in (g, h):  # k2: aux_labels become ragged; 0 and the final arcs' -1 are removed
        assert isinstance(out.aux_labels, Ragged)
        assert all(0 not in r and -1 not in r for r in out.aux_labels.tolist())


def test_remove_epsilon_examples_and_errors():
    f = Fsa.from_str("0 1 0 5 1\n0 1 1 6 2\n1 2 0 7 3\n1 3 2 8 4\n2 3 3 9 5\n3 4 -1 -1 0\n4\n", acceptor=False)
    g = remove_epsilon(f)
    assert g.label.tolist() == [1, 2, 3, 2, 3, -1]
    np.testing.assert_allclose(g.score, [2, 5, 9, 4, 8, 0])
    # aux_labels concatenated along the epsilon paths (k2's ragged aux_labels), the final arc's -1 removed
    assert g.aux_labels.tolist() == [[6], [5, 8], [5, 7, 9], [8], [7, 9], []]
    assert remove_epsilon(f, log_semiring=True).aux_labels.tolist() == g.aux_labels.tolist()
    with pytest.raises(ValueError, match="positive score"):
        remove_epsilon(Fsa.from_str("0 1 0 1\n1 0 0 1\n1 2 -1 0\n2\n"))
    # epsilon cycle with score <= 0 is fine in the tropical semiring
    c = remove_epsilon(Fsa.from_str("0 1 0 -1\n1 0 0 -1\n1 2 3 0\n2 3 -1 0\n3\n"))
    ok, msg = languages_close(weighted_language(c, False), {(3,): -1.0})
    assert ok, msg
    with pytest.raises(ValueError, match="epsilon cycles"):
        remove_epsilon(Fsa.from_str("0 1 0 -1\n1 0 0 -1\n1 2 3 0\n2 3 -1 0\n3\n"), log_semiring=True)
    v = remove_epsilon(create_fsa_vec([f, f]))
    assert isinstance(v.aux_labels, Ragged) and v.aux_labels.ndim == 3 and len(v.aux_labels) == 2
    assert v[1].aux_labels.tolist() == g.aux_labels.tolist()


@SETTINGS
@given(random_fsas(acyclic=True, epsilons=False, max_states=6, max_arcs=12, num_labels=2), st.booleans())
def test_determinize_acyclic(f, log):
    d = determinize(f, log_semiring=log)
    check_fsa(d)
    assert is_deterministic(d) and get_properties(d) & ARC_SORTED
    ok, msg = languages_close(lang(d, log=log), lang(f, log=log))
    assert ok, msg


@SETTINGS
@given(random_fsas(acyclic=False, epsilons=False, max_states=5, max_arcs=10, num_labels=2,
                   score_range=(0.0, 0.0)))
def test_determinize_cyclic_tropical(f):
    d = determinize(f)
    assert is_deterministic(d)
    ok, msg = languages_close(lang(d, log=False, max_labels=4, max_arcs=20),
                              lang(f, log=False, max_labels=4, max_arcs=20))
    assert ok, msg


def test_determinize_errors():
    with pytest.raises(ValueError, match="epsilon"):
        determinize(Fsa.from_str("0 1 0 0\n1 2 -1 0\n2\n"))
    with pytest.raises(ValueError, match="log_semiring=True needs an acceptor"):
        determinize(Fsa.from_str("0 1 1 2 0\n0 1 1 3 0\n1 2 -1 -1 0\n2\n", acceptor=False), log_semiring=True)
    # project, remove epsilons, determinize: the usual pipeline
    t = Fsa.from_str("0 1 1 2 0.5\n0 2 1 3 0.25\n1 3 2 0 0\n2 3 2 0 1\n3 4 -1 -1 0\n4\n", acceptor=False)
    d = determinize(project(t))
    assert to_str(d) == "0 1 1 0.5\n1 2 2 0.75\n2 3 -1 0\n3\n"


@settings(max_examples=10, deadline=None)
@given(st.lists(random_fsas(acyclic=True, aux_labels=True, max_states=5, max_arcs=8), min_size=1, max_size=3))
def test_batch_ops_match_single(fs):
    v = create_fsa_vec(fs).to_jax()  # host ops accept jax arrays too
    for op in (arc_sort, connect, top_sort, invert, project, add_epsilon_self_loops, remove_epsilon,
               remove_epsilon_self_loops):
        out = op(v)
        assert out.is_batch and len(out) == len(fs)
        for i, f in enumerate(fs):
            single = op(f)
            assert to_str(out[i].replace(aux_labels=None)) == to_str(single.replace(aux_labels=None)), op
            for k in single.attrs:  # per-arc values (a batch may hold a ragged attribute as 2-D)
                rows = lambda x: [tuple(int(y) for y in np.atleast_1d(r) if y not in (0, -1))  # noqa: E731
                                  for r in (x.tolist() if isinstance(x, Ragged) else np.asarray(x))]
                assert rows(out[i].attrs[k]) == rows(single.attrs[k]), (op, k)
    b = arc_sort(fs[0])
    c, ma, mb = intersect(arc_sort(project(create_fsa_vec(fs))), project(b), ret_arc_maps=True)
    for i, f in enumerate(fs):
        ci, mai, mbi = intersect(arc_sort(project(f)), project(b), ret_arc_maps=True)
        assert to_str(c[i]) == to_str(ci)
        n = len(ci.label)
        assert ma[i, :n].tolist() == mai.tolist() and mb[i, :n].tolist() == mbi.tolist()
    d = determinize(remove_epsilon(project(create_fsa_vec(fs))))
    for i, f in enumerate(fs):
        assert to_str(d[i]) == to_str(determinize(remove_epsilon(project(f))))


def test_ops_reject_invalid_input_naming_it():
    good = Fsa.from_str("0 1 2 0\n1 2 -1 0\n2\n")
    bad = good.replace(label=np.array([2, 5], np.int32))  # arc into the final state without label -1
    for op in (arc_sort, connect, top_sort, closure, remove_epsilon, determinize, project):
        with pytest.raises(ValueError, match="fsa: arc into the final state"):
            op(bad)
    with pytest.raises(ValueError, match="b_fsa: arc into the final state"):
        intersect(good, bad)
    with pytest.raises(TypeError, match="a_fsa: expected an Fsa"):
        intersect("0 1 2 0", good)


def test_intersect_k2_examples():
    # k2/python/tests/intersect_test.py
    a = Fsa.from_str("0 1 0 0.1\n0 1 1 0.2\n1 1 2 0.3\n1 2 -1 0.4\n2\n")
    b = Fsa.from_str("0 1 1 1\n0 1 2 2\n1 2 -1 3\n2\n")
    c, ma, mb = intersect(a, b, treat_epsilons_specially=False, ret_arc_maps=True)
    assert to_str(c).strip() == "0 1 1 1.2\n1 2 -1 3.4\n2"
    assert ma.tolist() == [1, 3] and mb.tolist() == [0, 2]  # k2: arcs 1, 3 of a and 0, 2 of b kept
    assert intersect(create_fsa_vec([a]), b, treat_epsilons_specially=False).is_batch
    a2 = Fsa.from_str("0 1 3 0.0\n0 1 1 0.2\n0 1 0 0.1\n1 1 2 0.3\n1 2 -1 0.4\n2\n")
    b2 = Fsa.from_str("0 1 5 0\n0 1 1 1\n0 1 2 2\n1 2 -1 3\n2\n")
    sa, amap = arc_sort(a2, ret_arc_map=True)
    sb, bmap = arc_sort(b2, ret_arc_map=True)
    c2, ma2, mb2 = intersect(sa, sb, ret_arc_maps=True)
    assert to_str(c2).strip() == "0 1 0 0.1\n0 2 1 1.2\n1 2 2 2.3\n2 3 -1 3.4\n3"
    assert sorted(set(amap[ma2[ma2 >= 0]].tolist())) == [1, 2, 3, 4]
    assert sorted(set(bmap[mb2[mb2 >= 0]].tolist())) == [1, 2, 3]


def test_compose_k2_examples():
    # k2/python/tests/compose_test.py
    from fsa_oracle import total_score
    a = Fsa.from_str("0 1 11 1 1.0\n0 2 12 2 2.5\n1 3 -1 -1 0\n2 3 -1 -1 2.5\n3\n", num_aux_labels=1)
    b = Fsa.from_str("0 1 1 1 1.0\n0 2 2 3 3.0\n1 2 3 2 2.5\n2 3 -1 -1 2.0\n3\n", num_aux_labels=1)
    ans = connect(compose(a, b, inner_labels="inner"))
    assert total_score(ans) == pytest.approx(10.0)
    f1 = Fsa.from_str("0 1 1 2 0.1\n0 2 0 2 0.2\n1 3 3 5 0.3\n2 3 5 4 0.4\n3 4 3 3 0.5\n3 5 2 2 0.6\n"
                      "4 6 -1 -1 0.7\n5 6 -1 -1 0.8\n6\n", num_aux_labels=1)
    f2 = Fsa.from_str("0 0 2 1 1\n0 1 4 3 2\n0 1 6 2 2\n0 2 -1 -1 0\n1 1 2 5 3\n1 2 -1 -1 4\n2\n",
                      num_aux_labels=1)
    ans = connect(compose(f1, arc_sort(f2), inner_labels="phones"))
    assert ans.labels.tolist() == [0, 5, 2, -1]
    assert ans.attrs["phones"].tolist() == [2, 4, 2, -1]
    assert ans.aux_labels.tolist() == [1, 3, 5, -1]


def test_union_k2_examples():
    # k2/python/tests/union_test.py
    from fsa_oracle import arc_post, total_score
    f0 = Fsa.from_str("0 1 1 0.1\n0 2 2 0.2\n1 2 3 0.3\n1 3 -1 0.4\n2 3 -1 0.5\n2 1 5 0.55\n3\n")
    f1 = Fsa.from_str("0 1 -1 0.6\n1\n")
    f2 = Fsa.from_str("0 1 6 0.7\n1 0 7 0.8\n1 0 8 0.9\n1 2 -1 1.0\n2\n")
    u = union(create_fsa_vec([f0, f1, f2]))
    assert np.stack([u.src, u.dst, u.label], 1).tolist() == [
        [0, 1, 0], [0, 4, 0], [0, 5, 0], [1, 2, 1], [1, 3, 2], [2, 3, 3], [2, 7, -1], [3, 7, -1], [3, 2, 5],
        [4, 7, -1], [5, 6, 6], [6, 5, 7], [6, 5, 8], [6, 7, -1]]
    np.testing.assert_allclose(u.score, [0, 0, 0, .1, .2, .3, .4, .5, .55, .6, .7, .8, .9, 1.], rtol=1e-6)
    g0 = Fsa.from_str("0 1 1 0.1\n0 2 2 0.2\n1 3 -1 0.3\n1 2 2 0.4\n2 3 -1 0.5\n3\n")
    g1 = Fsa.from_str("0 2 -1 0.6\n0 1 1 0.7\n1 2 -1 0.8\n2\n")
    g2 = Fsa.from_str("0 1 1 1.1\n1 2 -1 1.2\n2\n")
    u = union(create_fsa_vec([g0, g1, g2]))
    assert total_score(u) == pytest.approx(3.1136, abs=1e-4)  # k2 (computed with gtn)
    post = np.exp(arc_post(u))[3:]  # the union's arcs after the 3 new epsilon arcs, in input order
    np.testing.assert_allclose(post, [0.18710044, 0.08949275, 0.06629787, 0.12080258, 0.21029533,
                                      0.08097639, 0.19916977, 0.19916977, 0.44326058, 0.44326058], atol=1e-6)


@pytest.mark.parametrize("log", [False, True])
def test_determinize_k2_example(log):
    # k2/python/tests/determinize_test.py: 9 states, 13 weighted arcs -> 7 states, 9 arcs (max and log-sum)
    arcs = np.array([(0, 4, 1), (0, 1, 1), (1, 2, 2), (1, 3, 3), (2, 7, 1), (3, 7, 1), (4, 6, 1), (4, 6, 1),
                     (4, 5, 1), (4, 8, -1), (5, 8, -1), (6, 8, -1), (7, 8, -1)])
    w = np.array([1, 1, 2, 3, 4, 5, 2, 3, 3, 2, 4, 3, 5], np.float32)
    f = Fsa.from_arcs(arcs[:, 0], arcs[:, 1], arcs[:, 2], w, num_states=9)
    d = determinize(f, log_semiring=log)
    assert int(d.num_states) == 7 and len(d.label) == 9 and is_deterministic(d)
    ok, msg = languages_close(weighted_language(d, log), weighted_language(f, log))
    assert ok, msg


def test_remove_epsilon_k2_examples():
    # k2/python/tests/remove_epsilon_test.py (host version): arc map [[1] [0 2] [2]]
    f = Fsa.from_str("0 1 0 0.1\n0 1 1 0.2\n1 2 -1 0.3\n2\n")
    assert to_str(remove_epsilon(f)) == "0 1 1 0.2\n0 2 -1 0.4\n1 2 -1 0.3\n2\n"
    g = Fsa.from_str("0 4 1 1\n0 1 1 1\n1 2 0 2\n1 3 0 3\n1 4 0 2\n2 7 0 4\n3 7 0 5\n4 6 1 2\n4 6 0 3\n"
                     "4 8 1 3\n4 9 -1 2\n5 9 -1 4\n6 9 -1 3\n7 9 -1 5\n8 9 -1 6\n9\n")
    assert not g.properties & EPSILON_FREE
    d = remove_epsilon(g)
    assert d.properties & EPSILON_FREE
    ok, msg = languages_close(weighted_language(d, False), weighted_language(g, False))
    assert ok, msg
    t = Fsa.from_str("0 1 0 1 1\n1 2 0 2 1\n2 3 0 3 1\n3 4 4 4 1\n3 5 -1 5 1\n4 5 -1 6 1\n5\n", num_aux_labels=1)
    for log in (False, True):
        d = remove_epsilon(t, log_semiring=log)
        assert d.properties & EPSILON_FREE
        ok, msg = languages_close(weighted_language(d, log, key="both"), weighted_language(t, log, key="both"))
        assert ok, msg
    # aux_labels 1 2 3 collected along the epsilon path (k2: ragged [1 2 3 4] / [1 2 3 5] ...)
    assert sorted(d.aux_labels.tolist()) == [[1, 2, 3, 4], [1, 2, 3, 5], [6]]


def test_remove_epsilon_and_add_self_loops():
    from fsa_ops.remove_epsilon import remove_epsilon_and_add_self_loops
    f = Fsa.from_str("0 1 0 0.1\n0 1 1 0.2\n1 2 -1 0.3\n2\n")
    g = remove_epsilon_and_add_self_loops(f)
    assert to_str(g) == "0 0 0 0\n0 1 1 0.2\n0 2 -1 0.4\n1 1 0 0\n1 2 -1 0.3\n2\n"
