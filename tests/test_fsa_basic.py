"""Fsa data structure, batching, text formats (k2 and OpenFst), validation errors."""
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings

sys.path.insert(0, os.path.dirname(__file__))
from fsa_oracle import random_fsas  # noqa: E402

from fsa_ops.fsa import Fsa, check_fsa, create_fsa_vec, to_str  # noqa: E402

SETTINGS = settings(max_examples=30, deadline=None)


def assert_fsa_equal(a, b):
    assert int(a.num_states) == int(b.num_states)
    for k in ("src", "dst", "label", "score"):
        np.testing.assert_array_equal(np.asarray(getattr(a, k)), np.asarray(getattr(b, k)), err_msg=k)
    assert sorted(a.attrs) == sorted(b.attrs)
    for k in a.attrs:
        np.testing.assert_array_equal(np.asarray(a.attrs[k]), np.asarray(b.attrs[k]), err_msg=k)


def test_from_str_acceptor_k2_example():
    # k2 docs (Fsa.from_str): an acceptor with 4 states
    s = """
        0 1 1 0.1
        0 2 2 0.2
        1 3 -1 0.3
        2 3 -1 0.4
        3
    """
    f = Fsa.from_str(s)
    assert not f.is_batch and f.shape == (4, None)
    assert f.src.tolist() == [0, 0, 1, 2] and f.dst.tolist() == [1, 2, 3, 3]
    assert f.labels.tolist() == [1, 2, -1, -1]
    np.testing.assert_allclose(f.scores, [0.1, 0.2, 0.3, 0.4], rtol=1e-6)
    assert f.score.dtype == np.float32 and f.label.dtype == np.int32
    assert to_str(f) == "0 1 1 0.1\n0 2 2 0.2\n1 3 -1 0.3\n2 3 -1 0.4\n3\n"
    assert f.attrs == {}
    with pytest.raises(AttributeError, match="aux_labels"):
        f.aux_labels
    # arcs view: k2's 4-column int32 with the score bits reinterpreted
    assert f.arcs.shape == (4, 4) and f.arcs.dtype == np.int32
    np.testing.assert_array_equal(f.arcs[:, 3].view(np.float32), f.score)


def test_from_str_transducer_and_multiple_aux():
    s = "0 1 2 22 -1.2\n0 2 10 100 -2.2\n1 3 -1 -1 -3.2\n2 3 -1 -1 -4.2\n3\n"
    t = Fsa.from_str(s, acceptor=False)
    assert t.aux_labels.tolist() == [22, 100, -1, -1]
    assert to_str(t) == s
    t2 = Fsa.from_str(s, num_aux_labels=1)
    assert_fsa_equal(t, t2)
    m = Fsa.from_str("0 1 1 2 3 0.5\n1 2 -1 -1 -1 0\n2\n", aux_label_names=["aux_labels", "phones"])
    assert m.attrs["phones"].tolist() == [3, -1]
    assert to_str(m) == "0 1 1 2 3 0.5\n1 2 -1 -1 -1 0\n2\n"
    m3 = Fsa.from_str("0 1 1 2 3 0.5\n1 2 -1 -1 -1 0\n2\n", num_aux_labels=2)
    assert sorted(m3.attrs) == ["aux_labels", "aux_labels2"]
    with pytest.raises(ValueError, match="at most one"):
        Fsa.from_str(s, acceptor=False, num_aux_labels=1)


def test_from_str_sorts_arcs_by_src_stably():
    f = Fsa.from_str("1 2 -1 0.5\n0 1 3 1\n0 1 4 2\n2\n")
    assert f.src.tolist() == [0, 0, 1] and f.label.tolist() == [3, 4, -1]


def test_openfst_k2_example():
    # k2 docs (Fsa.from_openfst): the final-state line carries a cost; scores are negated costs
    s = "0 1 1 0.1\n1 2 2 0.2\n2 3.5\n"
    f = Fsa.from_str(s, openfst=True)
    assert int(f.num_states) == 4
    assert f.src.tolist() == [0, 1, 2] and f.dst.tolist() == [1, 2, 3] and f.label.tolist() == [1, 2, -1]
    np.testing.assert_allclose(f.score, [-0.1, -0.2, -3.5], rtol=1e-6)
    assert to_str(f, openfst=True) == "0 1 1 0.1\n1 2 2 0.2\n2 3.5\n"
    assert_fsa_equal(f, Fsa.from_openfst(s))


def test_openfst_multiple_finals_costs_optional_transducer():
    s = "0 1 1 11\n0 2 2 22 1.5\n1 0.25\n2\n"
    f = Fsa.from_str(s, acceptor=False, openfst=True)
    assert int(f.num_states) == 4
    assert f.src.tolist() == [0, 0, 1, 2] and f.dst.tolist() == [1, 2, 3, 3]
    assert f.label.tolist() == [1, 2, -1, -1] and f.aux_labels.tolist() == [11, 22, -1, -1]
    np.testing.assert_allclose(f.score, [0, -1.5, -0.25, 0], atol=1e-7)
    g = Fsa.from_str(to_str(f, openfst=True), acceptor=False, openfst=True)
    assert_fsa_equal(f, g)


@SETTINGS
@given(random_fsas(acyclic=False, aux_labels=True, min_states=1, max_states=6, max_arcs=12))
def test_text_round_trip(f):
    g = Fsa.from_str(to_str(f), acceptor=False)
    assert_fsa_equal(f, g)


@SETTINGS
@given(random_fsas(acyclic=False, aux_labels=False, max_states=6, max_arcs=12))
def test_openfst_round_trip(f):
    g = Fsa.from_str(to_str(f, openfst=True), openfst=True)
    # OpenFst text has no explicit final state: the new one is numbered after the last state mentioned
    used = np.concatenate([f.src, f.dst[f.label != -1], [0]])
    assert int(g.num_states) == int(used.max()) + 2
    fin_f, fin_g = int(f.num_states) - 1, int(g.num_states) - 1
    remap = lambda d, fin, new: np.where(d == fin, new, d)  # noqa: E731
    # arcs per state are the same (final-weight arcs may move behind a state's other arcs)
    arcs = lambda h, fin, new: sorted(zip(h.src.tolist(), remap(h.dst, fin, -7).tolist(),  # noqa: E731
                                          h.label.tolist(), h.score.tolist()))
    assert arcs(g, fin_g, -7) == arcs(f, fin_f, -7)


def test_empty_fsa():
    e = Fsa.from_str("")
    assert int(e.num_states) == 0 and e.label.shape == (0,)
    assert to_str(e) == ""
    check_fsa(e)
    e2 = Fsa.from_arcs(np.zeros((0, 4)), num_states=0)
    assert_fsa_equal(e, e2)
    v = create_fsa_vec([e, Fsa.from_str("0 1 -1 0\n1\n")])
    assert v.num_states.tolist() == [0, 2] and v.num_arcs.tolist() == [0, 1]
    assert_fsa_equal(v[0], e)


@pytest.mark.parametrize("text, line, problem", [
    ("0 1 1\n1\n", 1, "expected 4 fields"),
    ("0 1 1 0.5\n1 2 x 0\n2\n", 2, "non-numeric"),
    ("0 1 1 abc\n1\n", 1, "non-numeric"),
    ("0 1 -1 0\n1 2 3 0\n1\n", 2, "state out of range"),
    ("0 1 -1 0\n1 1 3 0\n1\n", 2, "leaves the final state"),
    ("0 1 -1 0\n1 2 -1 0\n2\n", 1, "label -1"),
    ("0 1 5 0\n1\n", 1, "into the final state"),
    ("0 1 1 0\n1 2 -1 0\n", 3, "missing the final-state line"),
    ("0 5 1 0\n5 6 -1 0\n3\n", 1, "state out of range"),
    ("0 1 -1 0\n1\n0 1 2 0\n", 3, "after the final-state line"),
    ("0 -1 2 0\n1\n", 1, "state out of range"),
])
def test_malformed_text_names_line(text, line, problem):
    with pytest.raises(ValueError, match=f"line {line}: .*{problem}"):
        Fsa.from_str(text)


def test_malformed_transducer_and_openfst_text():
    with pytest.raises(ValueError, match="line 1: expected 5 fields"):
        Fsa.from_str("0 1 1 0.5\n1\n", acceptor=False)
    with pytest.raises(ValueError, match="line 2: .*label -1 is reserved"):
        Fsa.from_str("0 1 1 0.5\n1 2 -1 0\n2\n", openfst=True)
    with pytest.raises(ValueError, match="line 1: expected 4 or 3 fields"):
        Fsa.from_str("0 1 1 2 3\n1\n", openfst=True)


def test_check_fsa_and_from_arcs_errors():
    with pytest.raises(ValueError, match="label -1"):
        Fsa.from_arcs([0, 0], [1, 2], [-1, -1], [0, 0])
    with pytest.raises(ValueError, match="state out of range"):
        Fsa.from_arcs([0], [3], [-1], [0], num_states=2)
    with pytest.raises(ValueError, match="shape"):
        Fsa.from_arcs([0, 0], [1], [-1], [0])
    with pytest.raises(ValueError, match="attrs\\['aux_labels'\\]"):
        Fsa.from_arcs([0], [1], [-1], [0], aux_labels=[1, 2])
    f = Fsa.from_str("0 1 2 0\n1 2 -1 0\n2\n")
    with pytest.raises(ValueError, match="not sorted by src"):
        check_fsa(f.replace(src=np.array([1, 0], np.int32), dst=np.array([2, 1], np.int32),
                            label=np.array([-1, 2], np.int32)))
    # [A, 4] arcs array like k2's Fsa(tensor)
    g = Fsa.from_arcs(np.array([[0, 1, 2, 0], [1, 2, -1, 0]]))
    assert_fsa_equal(f, g)


@SETTINGS
@given(st_list=__import__("hypothesis").strategies.lists(random_fsas(aux_labels=True, min_states=0), min_size=0,
                                                        max_size=4))
def test_create_fsa_vec_and_index(st_list):
    v = create_fsa_vec(st_list)
    assert v.is_batch and len(v) == len(st_list)
    check_fsa(v)
    A = v.label.shape[1]
    for b, f in enumerate(st_list):
        assert_fsa_equal(v[b], f)
        n = int(f.num_arcs)
        # padding layout
        assert np.all(v.src[b, n:] == 0) and np.all(v.dst[b, n:] == 0) and np.all(v.label[b, n:] == 0)
        assert np.all(v.score[b, n:] == -np.inf) and np.all(v.aux_labels[b, n:] == 0)
        assert v.num_arcs[b] == n and v.num_states[b] == int(f.num_states)
    assert A == max([int(f.num_arcs) for f in st_list], default=0)
    assert v.max_states == max([int(f.num_states) for f in st_list], default=0)
    if st_list:
        assert_fsa_equal(v[-1], st_list[-1])
        w = v[::-1]
        for b in range(len(st_list)):
            assert_fsa_equal(w[b], st_list[-1 - b])
        # nested batches flatten
        vv = create_fsa_vec([v, st_list[0]])
        assert len(vv) == len(st_list) + 1
        assert_fsa_equal(vv[len(st_list)], st_list[0])


def test_create_fsa_vec_padding_options_and_errors():
    a = Fsa.from_str("0 1 1 0.5\n1 2 -1 0\n2\n")
    b = Fsa.from_str("0 1 -1 0\n1\n")
    v = create_fsa_vec([a, b], pad_arcs_to=8, max_states=5)
    assert v.label.shape == (2, 8) and v.max_states == 5
    check_fsa(v)
    with pytest.raises(ValueError, match="pad_arcs_to"):
        create_fsa_vec([a, b], pad_arcs_to=1)
    with pytest.raises(ValueError, match="attributes"):
        create_fsa_vec([a, a.replace(aux_labels=np.array([3, -1], np.int32))])
    with pytest.raises(TypeError, match="fsas\\[1\\]"):
        create_fsa_vec([a, "x"])
    with pytest.raises(IndexError):
        v[2]
    with pytest.raises(TypeError):
        len(a)


def test_pytree_and_jit():
    a = Fsa.from_str("0 1 1 2 0.5\n0 1 3 4 1.5\n1 2 -1 -1 0\n2\n", acceptor=False)
    v = create_fsa_vec([a, a]).to_jax()
    leaves, treedef = jax.tree_util.tree_flatten(v)
    assert len(leaves) == 7  # src dst label score num_states num_arcs aux_labels
    assert isinstance(v.label, jax.Array)

    @jax.jit
    def f(g):
        return g.replace(score=g.score * 2.0, aux_labels=g.aux_labels + 1)

    out = f(v)
    assert isinstance(out, Fsa) and out.max_states == 3 and out.is_batch
    np.testing.assert_allclose(np.asarray(out.score[0]), [1.0, 3.0, 0.0])
    np.testing.assert_array_equal(np.asarray(out.aux_labels[1]), [3, 5, 0])
    # vmap over the batch axis sees single FSAs
    tot = jax.vmap(lambda g: jnp.sum(jnp.where(jnp.arange(g.label.shape[0]) < g.num_arcs, g.score, 0.0)))(v)
    np.testing.assert_allclose(np.asarray(tot), [2.0, 2.0])
    # jax-array batches index on the host too
    assert_fsa_equal(out[0].to_numpy(), a.replace(score=a.score * 2, aux_labels=a.aux_labels + 1))
    # replace never mutates
    b = a.replace(score=np.zeros(3, np.float32))
    assert a.score[1] == np.float32(1.5) and b.score[1] == 0
    assert a.replace(aux_labels=None).attrs == {}


def test_to_dot_and_draw(tmp_path):
    import re
    import shutil

    f = Fsa.from_str("0 1 1 2 0.5\n0 1 0 3 1\n1 2 -1 -1 0\n2\n", acceptor=False)
    dot = f.to_dot(title="t", symbols={1: "a"})
    assert dot.startswith("digraph") and dot.rstrip().endswith("}")
    edges = re.findall(r'(\d+) -> (\d+) \[label = "([^"]*)"\]', dot)
    assert edges == [("0", "1", "a:2/0.5"), ("0", "1", "<eps>:3/1"), ("1", "2", "-1:-1/0")]
    assert '2 [label = "2", shape = doublecircle' in dot
    out = tmp_path / "f.svg"
    if shutil.which("dot") is None:
        with pytest.raises(RuntimeError, match="dot"):
            f.draw(str(out))
    else:
        f.draw(str(out))
        assert out.read_text().lstrip().startswith("<")
    with pytest.raises(ValueError, match="suffix"):
        f.draw(str(tmp_path / "noext"))


@SETTINGS
@given(random_fsas(acyclic=False, aux_labels=True, min_states=1, max_states=6, max_arcs=12))
def test_fast_and_line_parsers_agree(f):
    from fsa_ops.fsa import _parse, _parse_fast
    for openfst in (False, True):
        text = to_str(f, openfst=openfst)
        fast = _parse_fast(text, 1, ["aux_labels"], openfst)
        slow = _parse(text, 1, ["aux_labels"], openfst)
        if fast is not None:  # None: left to the line parser (e.g. no final-weight line)
            assert_fsa_equal(fast, slow)
    assert _parse_fast("0 1 1.5 0\n1\n", 0, [], False) is None  # the line parser reports it


def test_as_dict_round_trip(tmp_path):
    a = Fsa.from_str("0 1 1 2 0.5\n0 1 3 4 -inf\n1 2 -1 -1 0\n2\n", acceptor=False)
    v = create_fsa_vec([a, Fsa.from_str("0 1 -1 -1 0.25\n1\n", acceptor=False)], pad_arcs_to=4)
    for f in (a, v):
        np.savez(tmp_path / "f.npz", **f.as_dict())
        g = Fsa.from_dict(np.load(tmp_path / "f.npz"))
        assert g.is_batch == f.is_batch and g.max_states == f.max_states
        for k in ("src", "dst", "label", "score", "num_states", "num_arcs"):
            np.testing.assert_array_equal(getattr(g, k), getattr(f, k))
        np.testing.assert_array_equal(g.aux_labels, f.aux_labels)
