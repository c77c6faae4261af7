"""prune_on_arc_post: k2's prune_on_arc_post_test.py and the brute-force oracle (arc posteriors from path
enumeration decide which arcs stay; the result accepts what the kept arcs accept)."""
import math
import os
import sys

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

sys.path.insert(0, os.path.dirname(__file__))
from fsa_oracle import arc_post, languages_close, random_fsas, weighted_language  # noqa: E402

from fsa_ops.connect import connect  # noqa: E402
from fsa_ops.fsa import Fsa, check_fsa, create_fsa_vec, to_str  # noqa: E402
from fsa_ops.prune import prune_on_arc_post  # noqa: E402
from fsa_ops.ragged import Ragged  # noqa: E402

PAD = dict(pad_arcs_to=12, max_states=6)   # one padded shape: the jitted arc posteriors compile once


@pytest.mark.filterwarnings("ignore::fsa_ops.scores.Float32ScoresWarning")
def test_k2_prune_on_arc_post():
    """k2's prune_on_arc_post_test.py."""
    fsa = Fsa.from_str("""
        0 1 1 0.2
        0 1 2 0.1
        1 2 2 0.1
        1 2 3 0.2
        2 3 -1 0
        3
    """)
    ans = prune_on_arc_post(create_fsa_vec([fsa], **PAD), 0.5, use_double_scores=True)   # (padded: one compile)
    expected = Fsa.from_str("""
        0 1 1 0.2
        1 2 3 0.2
        2 3 -1 0
        3
    """)
    assert str(ans[0]) == str(expected)


def test_attributes_connect_and_batch():
    # path probabilities 3/7, 3/7 (through state 1) and 1/7 (through state 2): at 0.3 both arcs of the lower
    # path go, and connect drops state 2, which k2 would keep without arcs
    f = Fsa.from_str("""
        0 1 1 11 0
        0 2 2 22 0
        1 3 3 33 0
        1 3 4 44 0
        2 3 5 55 -1.0986123
        3 4 -1 -1 0
        4
    """, acceptor=False)
    out, amap = prune_on_arc_post(create_fsa_vec([f], **PAD), 0.3, use_double_scores=False, ret_arc_map=True)
    out, amap = out[0], amap[0, :int(out.num_arcs[0])]
    check_fsa(out)
    assert to_str(out) == "0 1 1 11 0\n1 2 3 33 0\n1 2 4 44 0\n2 3 -1 -1 0\n3\n"
    np.testing.assert_array_equal(amap, [0, 2, 3, 5])
    no_path = Fsa.from_str("0 1 1 0\n2 3 -1 0\n3")
    v, vmap = prune_on_arc_post(create_fsa_vec([f, f.replace(aux_labels=f.aux_labels * 0 + 7)], **PAD), 0.3,
                                use_double_scores=False, ret_arc_map=True)
    assert to_str(v[0]) == to_str(out) and list(v[1].aux_labels) == [7, 7, 7, 7]
    np.testing.assert_array_equal(vmap[0, :4], amap)
    assert int(prune_on_arc_post(create_fsa_vec([no_path], **PAD), 0.1, use_double_scores=False).num_states[0]) == 0
    single = prune_on_arc_post(f, 0.3, use_double_scores=False)   # a single Fsa in, a single Fsa out
    assert not single.is_batch and to_str(single) == to_str(out)


@pytest.mark.parametrize("bad", [0, 1, 1.5, -0.1, float("nan"), "0.5", True])
def test_bad_threshold(bad):
    f = Fsa.from_str("0 1 -1 0\n1")
    with pytest.raises(ValueError, match="threshold_prob"):
        prune_on_arc_post(f, bad)


def test_not_top_sorted():
    f = Fsa.from_str("0 2 1 0\n2 1 2 0\n1 3 -1 0\n3")
    with pytest.raises(ValueError, match="top-sorted"):
        prune_on_arc_post(f, 0.5, use_double_scores=False)


@settings(max_examples=25, deadline=None)
@given(st.sampled_from([True, "ragged"]).flatmap(
    lambda aux: random_fsas(max_states=6, max_arcs=10, num_labels=3, aux_labels=aux)),
       st.sampled_from([0.05, 0.2, 0.4, 0.6]))
def test_matches_oracle(f, threshold):
    post = arc_post(f)
    log_thr = math.log(threshold)
    assume(np.all(np.abs(post[np.isfinite(post)] - log_thr) > 1e-4))   # no float32 tie at the threshold
    keep = post >= log_thr
    v = create_fsa_vec([f], **PAD)
    out, amap = prune_on_arc_post(v, threshold, use_double_scores=False, ret_arc_map=True)
    check_fsa(out)
    m = amap[0, :int(out.num_arcs[0])]
    idx = np.nonzero(keep)[0]
    kept, kmap = connect(Fsa.from_arcs(f.src[idx], f.dst[idx], f.label[idx], f.score[idx],
                                       num_states=int(f.num_states), attrs={"aux_labels": _rows(f.aux_labels, idx)}),
                         ret_arc_map=True)
    # exactly the oracle's arcs that still lie on an accepting path stay ...
    assert sorted(m.tolist()) == sorted(idx[kmap].tolist())
    assert _as_list(out[0].aux_labels) == _as_list(_rows(f.aux_labels, m))   # ... with their attributes
    for key in ("labels", "both"):
        ok, msg = languages_close(weighted_language(out[0], key=key), weighted_language(kept, key=key))
        assert ok, msg


def _rows(attr, idx):
    return attr.take(idx) if isinstance(attr, Ragged) else attr[idx]


def _as_list(attr):
    return attr.tolist()
