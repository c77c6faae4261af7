"""Ragged attributes through Fsa, text formats, batching and the structure ops: ports of k2's fsa_test.py (ragged,
to_str_simple, OpenFst), expand_ragged_attributes_test.py, invert_test.py, cat_test.py and index_test.py, and
brute-force path checks on hypothesis-drawn FSAs with ragged aux_labels."""
import math
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

sys.path.insert(0, os.path.dirname(__file__))
from fsa_oracle import random_fsas  # noqa: E402

from fsa_ops.connect import connect  # noqa: E402
from fsa_ops.expand import expand_ragged_attributes  # noqa: E402
from fsa_ops.fsa import Fsa, check_fsa, create_fsa_vec, to_str, to_str_simple  # noqa: E402
from fsa_ops.fsa_vec import cat, index_fsa  # noqa: E402
from fsa_ops.host import from_arc_map, index_attr  # noqa: E402
from fsa_ops.ragged import Ragged  # noqa: E402
from fsa_ops.sort import arc_sort, top_sort  # noqa: E402
from fsa_ops.unary import (add_epsilon_self_loops, closure, invert, project,  # noqa: E402
                           remove_epsilon_self_loops, union)

SETTINGS = settings(max_examples=25, deadline=None)


def _lines(s):
    return "\n".join(ln.strip() for ln in s.split("\n") if ln.strip())


def R(rows):
    return Ragged.from_lists(rows)


# ------------------------------------------------------------------ k2 fsa_test.py
def test_k2_transducer2_ragged2_from_str():
    s = '''
        0 1  2  22  101 [] [] -1.2
        0 2  10 100 102 [] [] -2.2
        1 6 -1  16  103 [20 30] [40] -4.2
        1 3  3  33  104 [] [] -3.2
        2 6 -1  26  105 [] [] -5.2
        2 4  2  22  106 [] [] -6.2
        3 6 -1  36  107 [] [] -7.2
        5 0  1  50  108 [] [] -8.2
        6
    '''
    fsa = Fsa.from_str(s, aux_label_names=['aux_labels', 'aux_labels2'], ragged_label_names=['ragged1', 'ragged2'])
    assert isinstance(fsa.ragged1, Ragged) and isinstance(fsa.ragged2, Ragged)
    assert fsa.aux_labels.tolist() == [22, 100, 16, 33, 26, 22, 36, 50]
    assert fsa.aux_labels2.tolist() == [101, 102, 103, 104, 105, 106, 107, 108]
    np.testing.assert_allclose(fsa.scores, [-1.2, -2.2, -4.2, -3.2, -5.2, -6.2, -7.2, -8.2], rtol=1e-6)
    assert fsa.ragged1 == R([[], [], [20, 30], [], [], [], [], []])
    assert fsa.ragged2 == R([[], [], [40], [], [], [], [], []])
    expected = '''
        0 1 2 22 101 [ ] [ ] -1.2
        0 2 10 100 102 [ ] [ ] -2.2
        1 6 -1 16 103 [ 20 30 ] [ 40 ] -4.2
        1 3 3 33 104 [ ] [ ] -3.2
        2 6 -1 26 105 [ ] [ ] -5.2
        2 4 2 22 106 [ ] [ ] -6.2
        3 6 -1 36 107 [ ] [ ] -7.2
        5 0 1 50 108 [ ] [ ] -8.2
        6
    '''
    assert _lines(to_str(fsa)) == _lines(expected)
    assert _lines(fsa.to_str()) == _lines(expected)
    # only aux_labels in to_str_simple (k2 test_transducer2_from_str)
    assert _lines(to_str_simple(fsa)).split("\n")[2] == "1 6 -1 16 -4.2"
    back = Fsa.from_str(to_str(fsa), aux_label_names=['aux_labels', 'aux_labels2'],
                        ragged_label_names=['ragged1', 'ragged2'])
    assert back.ragged1 == fsa.ragged1 and back.ragged2 == fsa.ragged2 and to_str(back) == to_str(fsa)


def test_k2_acceptor_from_openfst_ragged1():
    s = '''
        0 1  2 [] -1.2
        0 2  10 [10] -2.2
        1 6  1 [] -3.2
        1 3  3 [11 12] -4.2
        2 6  2 [] -5.2
        2 4  2 [] -6.2
        3 6  3 [] -7.2
        5 0  1 [13]  -8.2
        7
        6 -9.2
    '''
    expected = '''
        0 1 2 [ ] -1.2
        0 2 10 [ 10 ] -2.2
        1 6 1 [ ] -3.2
        1 3 3 [ 11 12 ] -4.2
        2 6 2 [ ] -5.2
        2 4 2 [ ] -6.2
        3 6 3 [ ] -7.2
        5 0 1 [ 13 ] -8.2
        6 -9.2
        7 0
    '''
    a = Fsa.from_openfst(s, num_aux_labels=0, ragged_label_names=['ragged'])
    b = Fsa.from_str(to_str(a, openfst=True), num_aux_labels=0, ragged_label_names=['ragged'], openfst=True)
    for fsa in (a, b):
        assert _lines(to_str(fsa, openfst=True)) == _lines(expected)


def test_k2_acceptor_from_openfst_and_to_str_simple():
    s = '''
        0 1  2 -1.2
        0 2  10 -2.2
        1 6  1  -3.2
        1 3  3  -4.2
        2 6  2  -5.2
        2 4  2  -6.2
        3 6  3  -7.2
        5 0  1  -8.2
        7
        6 -9.2
    '''
    expected = '''
        0 1 2 -1.2
        0 2 10 -2.2
        1 6 1 -3.2
        1 3 3 -4.2
        2 6 2 -5.2
        2 4 2 -6.2
        3 6 3 -7.2
        5 0 1 -8.2
        6 -9.2
        7 0
    '''
    fsas = [Fsa.from_openfst(s), Fsa.from_openfst(s, acceptor=True), Fsa.from_openfst(s, num_aux_labels=0),
            Fsa.from_openfst(s, aux_label_names=[])]
    fsas.append(Fsa.from_str(to_str(fsas[0], openfst=True), acceptor=True, openfst=True))
    for fsa in fsas:
        assert _lines(to_str_simple(fsa, openfst=True)) == _lines(expected)
        assert fsa.label.shape == (10,)
        np.testing.assert_allclose(fsa.scores, [1.2, 2.2, 3.2, 4.2, 5.2, 6.2, 7.2, 8.2, 9.2, 0], rtol=1e-6)


def test_k2_acceptor_wo_arcs_from_openfst_inf_is_not_final():
    assert to_str_simple(Fsa.from_openfst("\n")) == ""
    fsa2 = Fsa.from_openfst("0 Inf\n1 0.1\n")
    assert _lines(to_str_simple(fsa2)) == "1 2 -1 -0.1\n2"
    assert np.stack([fsa2.src, fsa2.dst, fsa2.label], 1).tolist() == [[1, 2, -1]]
    fsa3 = Fsa.from_openfst("0 Inf\n1 0.1\n2 0.2\n")
    assert int(fsa3.num_states) == 4
    assert _lines(to_str_simple(fsa3)) == "1 3 -1 -0.1\n2 3 -1 -0.2\n3"
    only_inf = Fsa.from_openfst("0 1 3 0.5\n1 inf\n")   # no final arc at all: an FSA without accepting paths
    assert int(only_inf.num_states) == 3 and only_inf.label.tolist() == [3]


def test_openfst_start_state_is_the_first_one_mentioned():
    f = Fsa.from_openfst("2 1 5 0.5\n1 0 6 0.25\n0\n")   # k2 swaps the start state 2 with 0
    assert np.stack([f.src, f.dst, f.label], 1).tolist() == [[0, 1, 5], [1, 2, 6], [2, 3, -1]]


@pytest.mark.parametrize("openfst", [False, True])
def test_k2_transducer_from_openfst(openfst):
    s = '''
        0 1 2 22  -1.2
        0 2  10 100 -2.2
        1 6  1  16  -4.2
        1 3  3  33  -3.2
        2 6  2  26  -5.2
        2 4  2  22  -6.2
        3 6  3  36  -7.2
        5 0  1  50  -8.2
        7 -9.2
        6
    '''
    fsa = Fsa.from_openfst(s, acceptor=False)
    if openfst:
        fsa = Fsa.from_str(to_str(fsa, openfst=True), acceptor=False, openfst=True)
    assert fsa.aux_labels.tolist() == [22, 100, 16, 33, 26, 22, 36, 50, -1, -1]
    np.testing.assert_allclose(fsa.scores, [1.2, 2.2, 4.2, 3.2, 5.2, 6.2, 7.2, 8.2, 0, 9.2], rtol=1e-6)
    assert _lines(to_str_simple(fsa, openfst=True)).split("\n")[-2:] == ["6 0", "7 -9.2"]


def test_k2_transducer3_from_openfst():
    s = '''
        0 1  2  22  33  44  -1.2
        0 2  10 100 101 102 -2.2
        1 6  1  16  17  18  -4.2
        1 3  3  33  34  35  -3.2
        2 6  2  26  27  28  -5.2
        2 4  2  22  23  24  -6.2
        3 6  3  36  37  38  -7.2
        5 0  1  50  51  52  -8.2
        7 -9.2
        6
    '''
    a = Fsa.from_openfst(s, num_aux_labels=3)
    b = Fsa.from_str(to_str(a, openfst=True), num_aux_labels=3, openfst=True)
    c = Fsa.from_openfst(s, aux_label_names=['aux_labels', 'aux_labels2', 'aux_labels3'])
    for fsa in (a, b, c):
        assert fsa.aux_labels2.tolist() == [33, 101, 17, 34, 27, 23, 37, 51, -1, -1]
        assert fsa.aux_labels3.tolist() == [44, 102, 18, 35, 28, 24, 38, 52, -1, -1]
        assert _lines(to_str_simple(fsa, openfst=True)).split("\n")[0] == "0 1 2 22 -1.2"


def test_k2_labels_setter_fixes_final_labels():
    s = '0 1 2 -1.2\n0 2 10 -2.2\n1 6 -1 -3.2\n1 3 3 -4.2\n2 6 -1 -5.2\n2 4 2 -6.2\n3 6 -1 -7.2\n5 0 1 -8.2\n6\n'
    fsa = Fsa.from_str(s)
    fsa.labels = np.array([-1, 10, 0, 1, -1, 1, 0, 2], np.int32)
    assert fsa.labels.tolist() == [0, 10, -1, 1, -1, 1, -1, 2]
    check_fsa(fsa)
    with pytest.raises(ValueError, match="labels"):
        fsa.labels = np.array([1, 10, 5, 1, -1, 1, 0, 2], np.int32)   # 5 on an arc into the final state
    with pytest.raises(ValueError, match="labels"):
        fsa.labels = np.zeros(3, np.int32)
    v = create_fsa_vec([Fsa.from_str("0 1 1 0\n1 2 -1 0\n2\n"), Fsa.from_str("0 1 -1 0\n1\n")])
    v.labels = np.array([[0, 0], [-1, 0]], np.int32)
    assert v.labels.tolist() == [[0, -1], [-1, 0]]     # the padding arc keeps 0


def test_k2_create_fsa_vec_ragged_and_as_dict():
    fsa1 = Fsa.from_str("0 1 1 0.1\n1 2 -1 0.2\n2\n")
    fsa1.aux_labels = R([[1, 0, 2], [3, 5]])
    fsa2 = Fsa.from_str("0 1 -1 10\n1\n")
    fsa2.aux_labels = R([[5, 8, 9]])
    for vec in (create_fsa_vec([fsa1, fsa2]), Fsa.from_fsas([fsa1, fsa2])):
        check_fsa(vec)
        assert vec.aux_labels.lengths.tolist() == [[3, 2], [3, 0]]        # padding arc: empty row
        assert [vec[i].aux_labels.tolist() for i in range(2)] == [[[1, 0, 2], [3, 5]], [[5, 8, 9]]]
        back = Fsa.from_dict(vec.as_dict())
        assert back.aux_labels == vec.aux_labels
    with pytest.raises(ValueError, match="per arc"):
        fsa1.aux_labels = R([[1]])
    h = create_fsa_vec([Fsa.from_str('0 1 3 0.0\n1 2 -1 0.0\n2'), Fsa.from_str('0 1 3 0.0\n1 2 -1 0.0\n2')])
    h.aux_labels = Ragged(np.array([[[3, 4], [5, 0]], [[6, 7], [8, 0]]]), np.array([[2, 1], [2, 1]]))
    assert len(h[0].aux_labels) == h[0].labels.shape[0]
    with pytest.raises(ValueError, match="Ragged"):
        check_fsa(Fsa.from_str("0 1 -1 0\n1\n").replace(aux_labels=Ragged(np.zeros((1, 1)), np.array([2]))))


def test_k2_invert_str():
    fsa0 = Fsa.from_str("0 1 1 4 0.1\n1 2 2 5 0.2\n2 3 -1 -1 0.3\n3\n", num_aux_labels=1)
    fsa1 = Fsa.from_str("0 1 4 1 0.1\n1 2 5 2 0.2\n2 3 -1 -1 0.3\n3\n", num_aux_labels=1)
    assert str(fsa0.invert()) == str(fsa1) and str(fsa0) != str(fsa1)
    assert str(fsa0.invert().invert()) == str(fsa0)


def test_k2_index_fsa():
    fsa1 = Fsa.from_str("0 1 1 0.1\n1 2 -1 0.2\n2\n")
    fsa1.tensor_attr = np.array([10, 20], np.int32)
    fsa1.ragged_attr = R([[11, 12], [21, 22, 23]])
    fsa2 = Fsa.from_str("0 1 -1 1.0\n1\n")
    fsa2.tensor_attr = np.array([100], np.int32)
    fsa2.ragged_attr = R([[111]])
    vec = create_fsa_vec([fsa1, fsa2])
    single1 = index_fsa(vec, np.array([0], np.int32))
    assert len(single1) == 1 and single1[0].tensor_attr.tolist() == [10, 20]
    assert single1[0].ragged_attr == fsa1.ragged_attr
    multiples = index_fsa(vec, np.array([0, 1, 0, 1, 1], np.int32))
    assert multiples.shape == (5, None, None)
    assert [m.tensor_attr.tolist() for m in multiples] == [[10, 20], [100], [10, 20], [100], [100]]
    assert [m.ragged_attr.tolist() for m in multiples] == [fsa1.ragged_attr.tolist(), [[111]]] * 2 + [[[111]]]
    with pytest.raises(ValueError, match="indexes"):
        index_fsa(vec, np.array([2]))
    with pytest.raises(ValueError, match="FsaVec"):
        index_fsa(fsa1, np.array([0]))


def test_k2_index_test_arcs_and_gradient():
    s0 = "0 1 1 0.1\n0 2 2 0.2\n1 2 3 0.3\n2 3 -1 0.4\n3\n"
    s1 = "0 1 -1 0.5\n1\n"
    s2 = "0 2 1 0.6\n0 1 2 0.7\n1 3 -1 0.8\n2 1 3 0.9\n3\n"
    vec = create_fsa_vec([Fsa.from_str(x) for x in (s0, s1, s2)]).to_jax()
    new21 = index_fsa(vec, jnp.array([2, 1]))
    arcs = [tuple(a) for f in new21 for a in np.stack([f.src, f.dst, f.label], 1).tolist()]
    assert arcs == [(0, 2, 1), (0, 1, 2), (1, 3, -1), (2, 1, 3), (0, 1, -1)]

    def weighted(scores, idx):
        sel = index_fsa(vec.replace(score=scores), idx)
        real = jnp.arange(sel.score.shape[1]) < sel.num_arcs[:, None]
        flat_pos = jnp.cumsum(real.reshape(-1)) - 1          # k2's flat arc numbering of the selection
        return jnp.sum(jnp.where(real.reshape(-1), sel.score.reshape(-1) * flat_pos, 0.0))
    g = jax.jit(jax.grad(weighted))(vec.score, jnp.array([2, 1]))
    assert np.asarray(g)[0].tolist() == [0, 0, 0, 0] and np.asarray(g)[1, 0] == 4
    assert np.asarray(g)[2].tolist() == [0, 1, 2, 3]
    g0 = jax.grad(weighted)(vec.score, jnp.array([0]))
    assert np.asarray(g0)[0].tolist() == [0, 1, 2, 3] and not np.asarray(g0)[1:].any()


# ------------------------------------------------------------------ k2 cat_test.py
def test_k2_cat():
    s = "0 1 1 0.1\n0 1 2 0.2\n1 2 -1 0.3\n2\n"
    fsa1 = Fsa.from_str(s)
    fsa1.tensor_attr1 = np.array([1, 2, 3])
    fsa1.tensor_attr2 = np.array([4, 5, 6])
    fsa1.ragged_tensor_attr1 = R([[1, 2], [], [3, 4, 5]])
    fsa1.ragged_tensor_attr2 = R([[1, 20], [30], [5]])
    fsa2 = Fsa.from_str(s)
    fsa2.tensor_attr1 = np.array([10, 20, 30])
    fsa2.tensor_attr3 = np.array([40, 50, 60])
    fsa2.ragged_tensor_attr1 = R([[3], [4, 5], [6, 7]])
    fsa2.ragged_tensor_attr3 = R([[1, 0], [0], [-1]])
    vec = cat([create_fsa_vec([fsa1]), create_fsa_vec([fsa2])])
    assert str(vec[0]) == str(Fsa.from_str(s).replace(tensor_attr1=fsa1.tensor_attr1,
                                                        ragged_tensor_attr1=fsa1.ragged_tensor_attr1))
    assert sorted(vec.attrs) == ["ragged_tensor_attr1", "tensor_attr1"]
    assert not hasattr(vec, "tensor_attr2") and not hasattr(vec, "ragged_tensor_attr3")
    assert vec.tensor_attr1.reshape(-1).tolist() == [1, 2, 3, 10, 20, 30]
    assert [r for f in vec for r in f.ragged_tensor_attr1.tolist()] == [[1, 2], [], [3, 4, 5], [3], [4, 5], [6, 7]]
    check_fsa(vec)
    # different widths and arc counts; jax inputs give a jax result under jit
    short = create_fsa_vec([Fsa.from_str("0 1 -1 0\n1\n").replace(ragged_tensor_attr1=R([[9]]),
                                                                   tensor_attr1=np.array([7]))])
    mixed = jax.jit(cat)([vec.to_jax(), short.to_jax()])
    assert len(mixed) == 3 and mixed[2].ragged_tensor_attr1.tolist() == [[9]]
    check_fsa(mixed)
    with pytest.raises(ValueError, match="FsaVec"):
        cat([fsa1])


# ------------------------------------------------------------------ k2 expand_ragged_attributes_test.py
@pytest.mark.parametrize("final_row, n_out", [([], 6), ([1], 7)])
def test_k2_expand_ragged_attributes(final_row, n_out):
    src = Fsa.from_str("0 1 2 10\n0 1 1 20\n1 2 -1 30\n2\n")
    src.float_attr = np.array([0.1, 0.2, 0.3], np.float32)
    src.int_attr = np.array([1, 2, 3], np.int32)
    src.ragged_attr = R([[1, 2, 3], [5, 6], final_row])
    dest, arc_map = expand_ragged_attributes(src, ret_arc_map=True)
    assert str(expand_ragged_attributes(src)) == str(dest)
    tail = [0.0] if final_row else []
    np.testing.assert_allclose(dest.float_attr, [0.1, 0.2, 0, 0, 0, 0.3] + tail)
    assert dest.scores.tolist() == [10, 20, 0, 0, 0, 30] + tail
    assert dest.int_attr.tolist() == [1, 2, 0, 0, 0, 3] + [0] * len(tail)
    assert dest.ragged_attr.tolist() == ([1, 5, 2, 3, 6, -1] if not final_row else [1, 5, 2, 3, 6, 1, -1])
    assert len(arc_map) == n_out
    # k2's autograd: d(sum(dest.scores * scale))/d(src.scores) = scale summed over each input arc's map
    scale = np.array([10, 20, 10, 10, 10, 30] + ([10] if final_row else []), np.float32)
    grad = np.zeros(3, np.float32)
    np.add.at(grad, arc_map[arc_map >= 0], scale[arc_map >= 0])
    assert grad.tolist() == [10, 20, 30]
    check_fsa(dest)


def test_expand_batch_names_and_no_ragged():
    f = Fsa.from_str("0 1 2 10\n1 2 -1 30\n2\n")
    f.a = R([[1, 2], []])
    f.b = R([[7], [8, -1]])
    vec = create_fsa_vec([f, Fsa.from_str("0 1 -1 1\n1\n").replace(a=R([[]]), b=R([[]]))])
    out, amap = expand_ragged_attributes(vec, ret_arc_map=True, ragged_attribute_names=["a"])
    assert out[0].a.tolist() == [1, 2, -1] and out[0].b.tolist() == [[7], [], [8, -1]]
    assert amap.tolist() == [[0, -1, 1], [0, -1, -1]]
    both = expand_ragged_attributes(vec)
    assert both[0].a.tolist() == [1, 2, 0, -1] and both[0].b.tolist() == [7, 0, 8, -1]
    plain = Fsa.from_str("0 1 -1 1\n1\n")
    assert expand_ragged_attributes(plain) is not None
    assert expand_ragged_attributes(plain, ret_arc_map=True)[1].tolist() == [0]
    with pytest.raises(ValueError, match="ragged_attribute_names"):
        expand_ragged_attributes(vec, ragged_attribute_names=["score"])
    bad = Fsa.from_str("0 1 -1 1\n1\n").replace(a=R([[3, 4]]), b=R([[5]]))
    out = expand_ragged_attributes(bad)     # [3 4] on a final arc: a third arc carries the -1
    assert out.a.tolist() == [3, 4, -1] and out.b.tolist() == [5, 0, -1] and out.label.tolist() == [0, 0, -1]


# ------------------------------------------------------------------ k2 invert_test.py
def test_k2_invert_aux_ragged():
    fsa = Fsa.from_str("0 1 1 0.1\n0 2 2 0.2\n1 3 3 0.3\n2 3 4 0.6\n3 4 -1 0.7\n4\n")
    fsa.aux_labels = R([[2, 3], [3, 4], [], [5], [-1]])
    fsa.tensor_attr1 = np.array([1, 2, 3, 4, 5])
    ans, arc_map = invert(fsa, ret_arc_map=True)
    assert ans.tensor_attr1.tolist() == [1, 2, 0, 0, 3, 4, 5]
    assert ans.aux_labels.tolist() == [1, 2, 0, 0, 3, 4, -1]
    assert ans.labels.tolist() == [2, 3, 3, 4, 0, 5, -1]
    assert arc_map.tolist() == [0, 1, -1, -1, 2, 3, 4]
    assert str(fsa.invert()) == str(ans)


def test_k2_invert_aux_as_ragged_and_tensor():
    s = "0 1 1 0\n0 1 0 0\n0 3 2 0\n1 2 3 0\n1 3 4 0\n2 1 5 0\n2 5 -1 0\n3 1 6 0\n4 5 -1 0\n5\n"
    fsa = Fsa.from_str(s)
    fsa.aux_labels = Ragged.from_row_splits([0, 2, 3, 3, 6, 6, 7, 8, 10, 11], [1, 2, 3, 5, 6, 7, 8, -1, 9, 10, -1])
    dest = invert(fsa)
    check_fsa(dest)
    # cyclic: compare the (input, output) languages up to 12 labels on both sides
    lang = _language(fsa, "aux_labels", max_labels=12)
    assert len(lang) > 5 and _same(_language(dest, "aux_labels", swap=True, max_labels=12), lang)
    t = Fsa.from_str("0 1 1 1 0\n0 1 0 2 0\n0 3 2 3 0\n1 2 3 4 0\n1 3 4 5 0\n2 1 5 6 0\n2 5 -1 -1 0\n"
                     "3 1 6 7 0\n4 5 -1 -1 0\n5\n", num_aux_labels=1)
    ti = invert(t)
    assert ti.labels.tolist() == t.aux_labels.tolist() and ti.aux_labels.tolist() == t.labels.tolist()


# ------------------------------------------------------------------ brute force on drawn FSAs
def _rows(v, i):
    return v.tolist()[i] if isinstance(v, Ragged) else [int(np.asarray(v)[i])]


def _language(f, attr="aux_labels", swap=False, max_labels=None):
    """{(labels, attr values) without 0 / -1: logsumexp score}, by depth-first path enumeration (paths stop
    once they carry more than `max_labels` labels on both sides together: exact for keys up to that many)."""
    ns = int(f.num_states)
    out = {}
    if ns == 0:
        return out
    src, dst, lab, sc = (np.asarray(x).tolist() for x in (f.src, f.dst, f.label, f.score))
    att = f.attrs[attr]
    stack = [(0, (), (), 0.0, 0)]
    while stack:
        s, ls, xs, score, n = stack.pop()
        if s == ns - 1:
            key = (xs, ls) if swap else (ls, xs)
            old = out.get(key, -math.inf)
            m = max(old, score)
            out[key] = m + math.log(math.exp(old - m) + math.exp(score - m))
            continue
        for i in range(len(src)):
            if src[i] == s:
                new_ls, new_xs = tuple(x for x in [lab[i]] if x > 0), tuple(x for x in _rows(att, i) if x > 0)
                m = n + len(new_ls) + len(new_xs)
                if max_labels is None or m <= max_labels:
                    stack.append((dst[i], ls + new_ls, xs + new_xs, score + sc[i], m))
    return out


def _same(a, b):
    """Same keys and scores within float32 rounding."""
    return a.keys() == b.keys() and all(abs(a[k] - b[k]) < 1e-4 * (1 + abs(b[k])) for k in a)


def _marginal(lang, side):
    """{one side of the keys: logsumexp over the other side}."""
    out = {}
    for key, score in lang.items():
        out[key[side]] = float(np.logaddexp(out.get(key[side], -np.inf), score))
    return out


@st.composite
def ragged_fsas(draw, **kw):
    f = draw(random_fsas(max_states=5, max_arcs=8, **kw))
    rows = [draw(st.lists(st.integers(1, 4), max_size=3)) for _ in range(len(f.label))]
    rows = [r + [-1] if lab == -1 and draw(st.booleans()) else r for r, lab in zip(rows, f.label.tolist())]
    return f.replace(aux_labels=R(rows), other=np.arange(len(f.label), dtype=np.int32))


@SETTINGS
@given(ragged_fsas())
def test_ops_keep_the_ragged_language(f):
    lang = _language(f)
    out, amap = expand_ragged_attributes(f, ret_arc_map=True)
    check_fsa(out)
    assert _same(_language(out), lang)
    real = amap >= 0
    assert out.other[real].tolist() == f.other[amap[real]].tolist() and not out.other[~real].any()
    assert _same(_language(invert(f), swap=True), lang)
    outputs = _marginal(lang, 1)
    projected = _marginal(_language(project(f, project_input=False), "other"), 0)
    assert projected.keys() == outputs.keys()
    np.testing.assert_allclose([projected[k] for k in outputs], list(outputs.values()), atol=2e-3)
    loops = add_epsilon_self_loops(f)
    assert all(r == [] for r, a, b in zip(loops.aux_labels.tolist(), loops.src, loops.dst) if a == b)
    for g in (arc_sort(f), top_sort(f), connect(f), remove_epsilon_self_loops(loops)):
        check_fsa(g)
        assert _same(_language(g), lang)
    text = to_str(f)
    back = Fsa.from_str(text, aux_label_names=["other"], ragged_label_names=["aux_labels"])
    assert back.aux_labels == f.aux_labels and to_str(back) == text
    vec = create_fsa_vec([f, f])
    assert vec[1].aux_labels == f.aux_labels and index_fsa(vec, [1])[0].aux_labels == f.aux_labels
    assert _same(_language(union(vec)), {k: v + math.log(2) for k, v in lang.items()})   # each path twice


def test_closure_with_ragged_aux_labels():
    f = Fsa.from_str("0 1 1 0.5\n1 2 -1 0.25\n2\n").replace(aux_labels=R([[3, 4], [5, -1]]))
    c = closure(f)
    assert np.stack([c.src, c.dst, c.label], 1).tolist() == [[0, 1, 1], [0, 2, -1], [1, 0, 0]]
    assert c.aux_labels.tolist() == [[3, 4], [], [5]]
    assert c.score.tolist() == [0.5, 0, 0.25]


def test_host_helpers_move_ragged_rows():
    v = R([[1, 2], [], [3]])
    assert index_attr(v, np.array([2, -1, 0])).tolist() == [[3], [], [1, 2]]
    f = Fsa.from_str("0 1 1 0\n1 2 -1 0\n2\n").replace(aux_labels=R([[5, 6], [-1]]))
    g = from_arc_map(f, np.array([-1, 0, 1]), [0, 0, 1], [0, 1, 2], [0, 1, -1], [0, 0, 0], 3)
    assert g.aux_labels.tolist() == [[], [5, 6], [-1]]
    assert isinstance(f.to_jax().aux_labels.values, jax.Array) and f.to_jax().to_numpy().aux_labels == f.aux_labels


def test_to_dot_ragged_aux_labels():
    f = Fsa.from_str("0 1 1 0.5\n1 2 -1 0\n2\n").replace(aux_labels=R([[3, 4], []]))
    dot = f.to_dot()
    assert '"1:3 4/0.5"' in dot and '"-1:<eps>/0"' in dot


def test_k2_convert_attr_to_ragged():
    fsa = Fsa.from_str("0 1 1 0.1\n1 2 2 0.2\n2 3 -1 0.3\n3\n")
    fsa.tensor_attr1 = np.array([1, 2, 3, 4, 0, 6], np.int32)[::2]
    assert fsa.convert_attr_to_ragged_(name='tensor_attr1', remove_eps=False) is fsa
    assert fsa.tensor_attr1 == R([[1], [3], [0]])
    fsa.tensor_attr2 = np.array([1, 0, -1], np.int32)
    fsa.convert_attr_to_ragged_(name='tensor_attr2', remove_eps=True)
    assert fsa.tensor_attr2 == R([[1], [], [-1]])
    with pytest.raises(ValueError, match="integer attribute"):
        fsa.convert_attr_to_ragged_("tensor_attr2")
    del fsa.tensor_attr2
    assert "tensor_attr2" not in fsa.attrs and not hasattr(fsa, "tensor_attr2")


def test_fsa_score_methods_match_fsa_ops_scores():
    from fsa_ops.scores import get_arc_post, get_backward_scores, get_forward_scores, get_tot_scores
    fsa = Fsa.from_str("0 1 1 0.5\n0 2 2 -0.25\n1 2 3 1.0\n2 3 -1 0.125\n3\n")
    vec = create_fsa_vec([fsa, fsa]).to_jax()
    for f in (fsa, vec):
        for log in (True, False):
            for fn, method in ((get_tot_scores, f.get_tot_scores), (get_forward_scores, f.get_forward_scores),
                               (get_backward_scores, f.get_backward_scores), (get_arc_post, f.get_arc_post)):
                np.testing.assert_array_equal(np.asarray(method(False, log)), np.asarray(fn(f, False, log)))
    # the one path weights: 0.5 + 1 + 0.125 vs -0.25 + 0.125 (tropical: the max)
    assert float(fsa.get_tot_scores(use_double_scores=False, log_semiring=False)) == 1.625
    np.testing.assert_allclose(float(fsa.get_tot_scores(False, True)), np.logaddexp(1.625, -0.125), rtol=1e-6)


@SETTINGS
@given(ragged_fsas(acyclic=False), st.sampled_from(["", "compact", "tabs"]))
def test_fast_ragged_parser_agrees_with_line_parser(f, style):
    from fsa_ops.fsa_text import _parse, _parse_fast_ragged, text_lines
    text = to_str(f)
    if style == "compact":
        text = text.replace("[ ", "[").replace(" ]", "]")
    elif style == "tabs":
        text = text.replace(" ", "\t")
    lines = text_lines(text)
    fast = _parse_fast_ragged(lines, 1, ["other"], ["aux_labels"])
    slow = _parse(lines, 1, ["other"], False, ["aux_labels"])
    assert fast is not None
    a, b = Fsa.from_arcs(**fast), Fsa.from_arcs(**slow)
    assert to_str(a) == to_str(b) == to_str(f) and a.aux_labels == f.aux_labels


@pytest.mark.parametrize("text, problem", [
    ("0 1 1 [2 3 0.5\n1\n", "line 1: ragged label 1 is not closed"),
    ("0 1 1 2 3] 0.5\n1\n", "line 1: expected '\\[' opening"),
    ("0 1 1 [2] [3] 0.5\n1\n", "line 1: more bracketed lists"),
    ("0 1 1 [2.5] 0.5\n1\n", "line 1: non-numeric field '2.5'"),
    ("0 1 -1 [] 0.5\n1 2 -1 [1] x\n2\n", "line 2: non-numeric field 'x'"),
    ("0 1 [1] -1 0.5\n1\n", "line 1: expected 3 plain fields"),
    ("0 1 -1 [] 0.5 7\n1\n", "line 1: expected 4 fields"),
])
def test_ragged_text_errors_name_the_line(text, problem):
    with pytest.raises(ValueError, match=problem):
        Fsa.from_str(text, ragged_label_names=["r"])


@settings(max_examples=10, deadline=None)
@given(st.lists(ragged_fsas(), min_size=1, max_size=3))
def test_batch_ops_carry_ragged_rows_per_fsa(fs):
    vec = create_fsa_vec(fs)
    jitted = jax.jit(lambda v: v)(vec.to_jax())
    assert jitted.aux_labels == vec.aux_labels and isinstance(jitted.aux_labels.values, jax.Array)
    for op in (arc_sort, top_sort, connect):
        out = op(vec)
        check_fsa(out)
        for b, f in enumerate(fs):
            assert _same(_language(out[b]), _language(f))
    for op, swap in ((expand_ragged_attributes, False), (invert, True)):
        out, amap = op(vec, ret_arc_map=True)
        check_fsa(out)
        for b, f in enumerate(fs):
            single, single_map = op(f, ret_arc_map=True)
            assert to_str(out[b]) == to_str(single) and _same(_language(out[b], swap=swap), _language(f))
            assert amap[b, :len(single_map)].tolist() == single_map.tolist()
            assert not (amap[b, len(single_map):] + 1).any()
