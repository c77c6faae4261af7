"""intersect and compose: the result's weighted language is the product / relational composition of the operands'
(brute-force oracle on hypothesis-drawn FSAs), attributes follow their arcs, and k2's ctc_topo example holds."""
import math
import os
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

sys.path.insert(0, os.path.dirname(__file__))
from fsa_oracle import enumerate_paths, lang, languages_close, random_fsas, weighted_language  # noqa: E402

from fsa_ops.connect import connect  # noqa: E402
from fsa_ops.fsa import Fsa, check_fsa, create_fsa_vec, to_str  # noqa: E402
from fsa_ops.graphs import ctc_graph, ctc_topo, linear_fsa  # noqa: E402
from fsa_ops.intersect import compose, intersect  # noqa: E402
from fsa_ops.sort import arc_sort  # noqa: E402
from fsa_ops.unary import project  # noqa: E402

SETTINGS = settings(max_examples=30, deadline=None)


def raw_language(f, log=True, max_arcs=10):
    out = {}
    for p in enumerate_paths(f, max_arcs=max_arcs):
        k = tuple(x for x in p.labels if x != -1)
        out[k] = np.logaddexp(out.get(k, -math.inf), p.score) if log else max(out.get(k, -math.inf), p.score)
    return out


def product(la, lb):
    return {k: la[k] + lb[k] for k in set(la) & set(lb)}


@SETTINGS
@given(random_fsas(acyclic=False, max_states=4, max_arcs=6, num_labels=2),
       random_fsas(acyclic=False, max_states=4, max_arcs=6, num_labels=2, epsilons=False), st.booleans())
def test_intersect_log_one_side_epsilons(a, b, swap):
    if swap:
        a, b = b, a
    a, b = arc_sort(a), arc_sort(b)
    c = intersect(a, b)
    check_fsa(c)
    ok, msg = languages_close(lang(c), product(lang(a), lang(b)))
    assert ok, msg


@SETTINGS
@given(random_fsas(acyclic=True, max_states=5, max_arcs=8, num_labels=2),
       random_fsas(acyclic=True, max_states=5, max_arcs=8, num_labels=2))
def test_intersect_tropical_and_epsilon_as_symbol(a, b):
    a, b = arc_sort(a), arc_sort(b)
    c = intersect(a, b)
    ok, msg = languages_close(lang(c, log=False), product(lang(a, log=False), lang(b, log=False)))
    assert ok, msg
    d, ma, mb = intersect(a, b, treat_epsilons_specially=False, ret_arc_maps=True)
    ok, msg = languages_close(raw_language(d), product(raw_language(a), raw_language(b)))
    assert ok, msg
    if len(d.label):
        np.testing.assert_allclose(d.score, a.score[ma] + b.score[mb], rtol=1e-6)


def test_intersect_attributes_and_errors():
    a = Fsa.from_str("0 1 2 0.5\n1 2 -1 0\n2\n").replace(w=np.array([1.0, 2.0], np.float32),
                                                        ia=np.array([7, 8], np.int32))
    b = Fsa.from_str("0 0 0 0.25\n0 1 2 1\n1 2 -1 0\n2\n").replace(w=np.array([10., 20., 30.], np.float32),
                                                                  ia=np.array([1, 2, 3], np.int32),
                                                                  ib=np.array([4, 5, 6], np.int32))
    with pytest.raises(ValueError, match="'ia' is on both a_fsa and b_fsa"):  # k2 raises for non-float ones
        intersect(a, b)
    b = b.replace(ia=None)
    c, ma, mb = intersect(a, b, ret_arc_maps=True)
    assert to_str(c.replace(ia=None, ib=None)) == "0 1 2 1.5\n0 0 0 0.25\n1 2 -1 0\n2\n"
    assert ma.tolist() == [0, -1, 1] and mb.tolist() == [1, 0, 2]
    np.testing.assert_allclose(c.attrs["w"], [21.0, 10.0, 32.0])  # float on both sides: summed
    assert c.attrs["ia"].tolist() == [7, 0, 8]  # one side only: via the arc map, 0 where a has no arc
    assert c.attrs["ib"].tolist() == [5, 4, 6]
    with pytest.raises(ValueError, match="not arc-sorted"):
        intersect(Fsa.from_str("0 1 2 0\n0 1 1 0\n1 2 -1 0\n2\n"), b)
    e = intersect(a, arc_sort(linear_fsa([3])))
    assert int(e.num_states) == 0
    v = intersect(create_fsa_vec([a, a]), b)
    assert len(v) == 2 and to_str(v[1].replace(ia=None, ib=None)) == to_str(c.replace(ia=None, ib=None))


def relation(f, log=True, **kw):
    return weighted_language(f, log_semiring=log, key="both", **kw)


def compose_relation(ra, rb, log=True):
    out = {}
    for (x, y), s in ra.items():
        for (y2, z), t in rb.items():
            if y == y2:
                v = s + t
                out[(x, z)] = np.logaddexp(out.get((x, z), -math.inf), v) if log else max(out.get((x, z),
                                                                                               -math.inf), v)
    return out


@SETTINGS
@given(random_fsas(acyclic=True, aux_labels=True, max_states=5, max_arcs=8, num_labels=2),
       random_fsas(acyclic=True, aux_labels=True, max_states=5, max_arcs=8, num_labels=2, epsilons=False),
       random_fsas(acyclic=True, aux_labels=True, max_states=5, max_arcs=8, num_labels=2))
def test_compose(a, b_noeps, b_eps):
    b = arc_sort(b_noeps)
    c = compose(a, b)
    check_fsa(c)
    ok, msg = languages_close(relation(c), compose_relation(relation(a), relation(b)))
    assert ok, msg
    b2 = arc_sort(b_eps)  # epsilons on both sides: equivalent in the tropical semiring (as k2)
    c2 = compose(a, b2, inner_labels="inner")
    ok, msg = languages_close(relation(c2, False), compose_relation(relation(a, False), relation(b2, False),
                                                                    False))
    assert ok, msg
    assert "inner" in c2.attrs
    # acceptor b: output labels are the matched labels
    c3 = compose(a, arc_sort(project(b_noeps)))
    ra = relation(a)
    lb = lang(project(b_noeps))
    exp = {}
    for (x, y), s in ra.items():
        if y in lb:
            exp[(x, y)] = np.logaddexp(exp.get((x, y), -math.inf), s + lb[y])
    ok, msg = languages_close(relation(c3), exp)
    assert ok, msg


@pytest.mark.parametrize("sym, modified", [([1, 2, 2], False), ([1, 2, 2], True), ([2, 1], False)])
def test_compose_ctc_topo_with_transcript_is_ctc_graph(sym, modified):
    # k2 (ctc_topo_test.py): compose(ctc_topo, linear_fsa(transcript)) is the CTC graph of the transcript
    g = connect(compose(ctc_topo(2, modified=modified), arc_sort(linear_fsa(sym))))
    ref = ctc_graph(sym, modified=modified)

    def rel(f):
        out = {}
        for p in enumerate_paths(f, max_arcs=7):
            k = (p.labels[:-1], tuple(x for x in p.attrs["aux_labels"] if x not in (0, -1)))
            out[k] = out.get(k, 0) + 1
        return out

    assert rel(g) == rel(ref)


# ------------------------------------------------------------------ properties
