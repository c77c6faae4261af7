"""reverse: k2's reverse_test.py (structure, scores and the gradient through the arc map) and the brute-force
oracle (the reversed FSA's weighted language is the input's with each sequence reversed)."""
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings

sys.path.insert(0, os.path.dirname(__file__))
from fsa_oracle import languages_close, random_fsa_vecs, random_fsas, weighted_language  # noqa: E402

from fsa_ops.fsa import Fsa, check_fsa, create_fsa_vec, to_str  # noqa: E402
from fsa_ops.reverse import reverse  # noqa: E402

BOUND = dict(max_labels=3)   # exact up to 3 labels (no epsilon cycles); an arc bound would differ: reverse adds one


def test_k2_reverse():
    """k2's reverse_test.py: the reversed arcs, and d(sum of output scores)/d(input scores) = 1 per arc."""
    fsa = Fsa.from_str("0 1 1 1\n0 2 2 2\n1 3 -1 3\n2 1 3 4\n3")
    out, arc_map = reverse(fsa, ret_arc_map=True)
    assert to_str(out).strip() == "\n".join(["0 1 0 3", "1 3 1 1", "1 2 3 4", "2 3 2 2", "3 4 -1 0", "4"])
    np.testing.assert_array_equal(arc_map, [2, 0, 3, 1, -1])

    def loss(scores):
        return jnp.sum(jnp.where(arc_map >= 0, scores[jnp.maximum(arc_map, 0)], 0.0))

    np.testing.assert_allclose(jax.grad(loss)(jnp.asarray(fsa.score)), [1, 1, 1, 1])


def test_reverse_attributes_batch_and_edges():
    f = Fsa.from_str("0 1 1 10 0.5\n0 2 2 20 1\n1 2 3 30 2\n2 3 -1 -1 3\n3", acceptor=False)
    r = reverse(f)
    check_fsa(r)
    assert to_str(r) == "0 2 0 -1 3\n1 3 1 10 0.5\n2 3 2 20 1\n2 1 3 30 2\n3 4 -1 0 0\n4\n"
    empty = Fsa.from_str("", acceptor=False)
    v, amap = reverse(create_fsa_vec([f, empty, f]), ret_arc_map=True)
    check_fsa(v)
    assert to_str(v[0]) == to_str(r) and int(v.num_states[1]) == 0 and len(v[1].label) == 0
    np.testing.assert_array_equal(amap[1], -1)
    np.testing.assert_array_equal(amap[0], reverse(f, ret_arc_map=True)[1])
    assert int(reverse(empty).num_states) == 0
    one = Fsa.from_arcs(np.zeros(0, np.int32), np.zeros(0, np.int32), np.zeros(0, np.int32), num_states=1)
    with pytest.raises(ValueError, match=r"fsa\[1\]: has a single state"):
        reverse(create_fsa_vec([Fsa.from_str("0 1 -1 0\n1"), one]))
    with pytest.raises(TypeError, match="expected an Fsa"):
        reverse("0 1 -1 0\n1")


def _reversed_language(f, log, key):
    out = {}
    for seq, score in weighted_language(f, log_semiring=log, key=key, **BOUND).items():
        out[(tuple(reversed(seq[0])), tuple(reversed(seq[1]))) if key == "both" else tuple(reversed(seq))] = score
    return out


@settings(max_examples=30, deadline=None)
@given(random_fsas(acyclic=False, aux_labels=True, max_states=5, max_arcs=9))
def test_reverse_matches_oracle(f):
    r = reverse(f)
    check_fsa(r)
    for log in (True, False):
        for key in ("labels", "both"):
            ok, msg = languages_close(weighted_language(r, log_semiring=log, key=key, **BOUND),
                                      _reversed_language(f, log, key))
            assert ok, msg
    ok, msg = languages_close(weighted_language(reverse(r), **BOUND), weighted_language(f, **BOUND))
    assert ok, msg


@settings(max_examples=10, deadline=None)
@given(random_fsa_vecs(max_size=3, max_states=4, max_arcs=6))
def test_reverse_batch_matches_single(v):
    out, amap = reverse(v, ret_arc_map=True)
    for i, f in enumerate(v):
        one, m = reverse(f, ret_arc_map=True)
        assert to_str(out[i]) == to_str(one)
        np.testing.assert_array_equal(amap[i, :len(m)], m)


@settings(max_examples=15, deadline=None)
@given(random_fsas(acyclic=False, aux_labels="ragged", max_states=5, max_arcs=8))
def test_reverse_ragged_attributes(f):
    """Ragged aux_labels rows follow their arcs (the new final arc gets an empty row); labels as the oracle says."""
    r, amap = reverse(f, ret_arc_map=True)
    check_fsa(r)
    rows, out_rows = f.aux_labels.tolist(), r.aux_labels.tolist()
    assert out_rows == [rows[i] if i >= 0 else [] for i in amap.tolist()]
    ok, msg = languages_close(weighted_language(r, **BOUND), _reversed_language(f, True, "labels"))
    assert ok, msg
