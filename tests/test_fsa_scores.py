"""fsa_ops.scores and fsa_ops.shortest_path against brute-force path enumeration (tests/fsa_oracle.py)."""
import math
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, HealthCheck
from hypothesis import strategies as st

import fsa_oracle as oracle
from fsa_ops.fsa import Fsa, create_fsa_vec
from fsa_ops import scores as scores_mod
from fsa_ops.scores import (Float32ScoresWarning, get_arc_post, get_backward_scores, get_forward_scores,
                            get_tot_scores, safe_logsumexp)
from fsa_ops.shortest_path import shortest_path

B, A_PAD, S_PAD = 3, 12, 6
SETTINGS = settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _pad(fsas):
    return create_fsa_vec(list(fsas), pad_arcs_to=A_PAD, max_states=S_PAD)


batches = st.lists(oracle.random_fsas(min_states=0, max_states=5, max_arcs=10, aux_labels=True,
                                      ensure_path=True), min_size=B, max_size=B).map(_pad)
batches_nopath = st.lists(oracle.random_fsas(min_states=2, max_states=5, max_arcs=6, ensure_path=False),
                          min_size=B, max_size=B).map(_pad)


def _ref_forward(f, log):
    """Plain-loop forward/backward DP over states (reference for per-state scores)."""
    ns = int(f.num_states)
    red = (lambda a, b: np.logaddexp(a, b)) if log else max
    fwd = np.full(S_PAD, -np.inf)
    bwd = np.full(S_PAD, -np.inf)
    if ns == 0:
        return fwd, bwd
    fwd[0] = 0.0
    for s in range(1, ns):
        for i in range(len(f.src)):
            if f.dst[i] == s:
                fwd[s] = red(fwd[s], fwd[f.src[i]] + f.score[i])
    bwd[ns - 1] = 0.0
    for s in range(ns - 2, -1, -1):
        for i in range(len(f.src)):
            if f.src[i] == s:
                bwd[s] = red(bwd[s], bwd[f.dst[i]] + f.score[i])
    return fwd, bwd


def _check_path(f, arcs, score):
    """`arcs` (in order) form a path from the start to the final state with total `score`."""
    f = f.to_numpy()
    arcs = list(arcs)
    states = [0] + [int(f.dst[a]) for a in arcs]
    assert all(int(f.src[a]) == s for a, s in zip(arcs, states[:-1])), (arcs, states)
    assert states[-1] == int(f.num_states) - 1
    assert abs(float(np.sum(f.score[arcs])) - score) < 1e-4


def _unique_best(f):
    paths = sorted((p.score for p in oracle.enumerate_paths(f)), reverse=True)
    return len(paths) < 2 or paths[0] - paths[1] > 1e-4


def _close(a, b, tol=1e-4):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert a.shape == b.shape, (a.shape, b.shape)
    both_inf = np.isneginf(a) & np.isneginf(b)
    np.testing.assert_allclose(np.where(both_inf, 0, a), np.where(both_inf, 0, b), atol=tol, rtol=tol)


@SETTINGS
@given(batches, st.booleans())
def test_scores_match_enumeration(fv, log):
    tot = get_tot_scores(fv, use_double_scores=False, log_semiring=log)
    post = get_arc_post(fv, use_double_scores=False, log_semiring=log)
    fwd = get_forward_scores(fv, log_semiring=log)
    bwd = get_backward_scores(fv, log_semiring=log)
    assert tot.shape == (B,) and post.shape == (B, A_PAD) and fwd.shape == (B, S_PAD)
    for b in range(B):
        f = fv[b]
        na = int(f.num_arcs)
        _close(tot[b], oracle.total_score(f, log_semiring=log))
        _close(post[b, :na], oracle.arc_post(f, log_semiring=log))
        assert np.all(np.isneginf(np.asarray(post[b, na:])))
        rf, rb = _ref_forward(f.to_numpy(), log)
        _close(fwd[b], rf)
        _close(bwd[b], rb)


@SETTINGS
@given(batches)
def test_tot_score_gradients(fv):
    fj = fv.to_jax()

    def total(score, log):
        return jnp.sum(get_tot_scores(fj.replace(score=score), log_semiring=log))

    g_log = np.asarray(jax.grad(total)(fj.score, True))
    g_trop = np.asarray(jax.grad(total)(fj.score, False))
    assert np.all(np.isfinite(g_log)) and np.all(np.isfinite(g_trop))
    for b in range(B):
        f = fv[b]
        na = int(f.num_arcs)
        np.testing.assert_allclose(g_log[b, :na], np.exp(oracle.arc_post(f)), atol=1e-4)
        best = oracle.best_path(f)
        if best is None:
            assert np.all(g_trop[b] == 0)
        else:
            arcs = np.flatnonzero(g_trop[b, :na] > 0.5)
            np.testing.assert_allclose(g_trop[b, arcs], 1.0)
            _check_path(f, arcs, best.score)
        assert np.all(g_log[b, na:] == 0) and np.all(g_trop[b, na:] == 0)


def test_gradients_finite_differences():
    f = create_fsa_vec([Fsa.from_str("0 1 1 0.5\n0 1 2 -0.3\n0 2 3 0.1\n1 2 1 0.2\n1 3 -1 0.7\n"
                                     "2 3 -1 -0.4\n3")]).to_jax()

    def loss(score):
        g = f.replace(score=score)
        fwd = get_forward_scores(g)
        post = get_arc_post(g)
        return (get_tot_scores(g)[0] + 0.3 * jnp.sum(jnp.where(jnp.isfinite(fwd), fwd, 0) ** 2)
                + 0.2 * jnp.sum(jnp.exp(post) * jnp.arange(post.shape[1])))

    x = np.asarray(f.score, np.float64)
    g = np.asarray(jax.grad(loss)(f.score))
    eps = 1e-3
    for i in range(x.shape[1]):
        d = np.zeros_like(x)
        d[0, i] = eps
        fd = (loss(jnp.asarray(x + d, jnp.float32)) - loss(jnp.asarray(x - d, jnp.float32))) / (2 * eps)
        assert abs(float(fd) - g[0, i]) < 2e-2, (i, float(fd), g[0, i])


@SETTINGS
@given(batches_nopath)
def test_no_path_gives_neg_inf_without_nan(fv):
    fj = fv.to_jax()
    for log in (True, False):
        tot = get_tot_scores(fj, log_semiring=log)
        g = jax.grad(lambda s: jnp.sum(jnp.where(jnp.isfinite(tot), get_tot_scores(
            fj.replace(score=s), log_semiring=log), 0.0)))(fj.score)
        assert not np.any(np.isnan(np.asarray(g)))
        post = get_arc_post(fj, log_semiring=log)
        assert not np.any(np.isnan(np.asarray(post)))
        for b in range(B):
            _close(tot[b], oracle.total_score(fv[b], log_semiring=log))


def _on_accepting_path(f, arc):
    return any(arc in p.arcs for p in oracle.enumerate_paths(f))


@SETTINGS
@given(batches, st.data(), st.sampled_from([np.nan, np.inf]))
def test_nonfinite_arc_score_makes_its_fsa_nan(fv, data, bad):
    """A NaN or +inf score on any real arc of an FSA (on an accepting path or not): all its scores
    and gradients are NaN (never a finite value computed around the bad arc, nor -inf), its
    gradient 0 when it is masked out of the sum; the other FSAs of the batch still match the
    enumeration. Where the arc lies on an accepting path the
    enumeration agrees (NaN, or +inf totals for +inf)."""
    num_arcs = np.asarray(fv.num_arcs)
    assume_rows = np.flatnonzero(num_arcs > 0)
    if assume_rows.size == 0:
        return
    b = data.draw(st.sampled_from(assume_rows.tolist()))
    arc = data.draw(st.integers(0, int(num_arcs[b]) - 1))
    score = np.array(fv.score, np.float32)
    score[b, arc] = bad
    fj = fv.replace(score=jnp.asarray(score))
    ns, na = int(fv.num_states[b]), int(num_arcs[b])
    for log in (True, False):
        tot = np.asarray(get_tot_scores(fj, use_double_scores=False, log_semiring=log))
        post = np.asarray(get_arc_post(fj, use_double_scores=False, log_semiring=log))
        fwd = np.asarray(get_forward_scores(fj, use_double_scores=False, log_semiring=log))
        bwd = np.asarray(get_backward_scores(fj, use_double_scores=False, log_semiring=log))
        grad = np.asarray(jax.grad(lambda s: jnp.sum(get_tot_scores(
            fj.replace(score=s), use_double_scores=False, log_semiring=log)))(fj.score))
        masked = np.asarray(jax.grad(lambda s: jnp.sum(jnp.where(jnp.arange(B) == b, 0.0, get_tot_scores(
            fj.replace(score=s), use_double_scores=False, log_semiring=log))))(fj.score))
        assert np.all(masked[b] == 0) and np.all(masked[np.arange(B) != b] == grad[np.arange(B) != b])
        assert np.isnan(tot[b]) and np.all(np.isnan(post[b, :na])) and np.all(np.isnan(grad[b, :na]))
        assert np.all(np.isnan(fwd[b, :ns])) and np.all(np.isnan(bwd[b, :ns]))
        assert np.all(np.isneginf(post[b, na:])) and np.all(grad[b, na:] == 0)
        if _on_accepting_path(fv[b], arc):
            assert not np.isfinite(oracle.total_score(fv[b].replace(score=score[b, :na]), log_semiring=log))
        for o in range(B):
            if o == b:
                continue
            f = fv[o]
            _close(tot[o], oracle.total_score(f, log_semiring=log))
            _close(post[o, :int(f.num_arcs)], oracle.arc_post(f, log_semiring=log))
            rf, rb = _ref_forward(f.to_numpy(), log)
            _close(fwd[o], rf)
            _close(bwd[o], rb)
            assert np.all(np.isfinite(grad[o]))


def test_empty_and_single_and_jit():
    f = Fsa.from_str("0 1 1 1.0\n0 1 2 2.0\n0 2 3 0.3\n1 2 4 0.5\n2 3 -1 0.1\n3")
    ref = np.logaddexp(np.logaddexp(1.5, 2.5), 0.3) + 0.1
    assert abs(float(get_tot_scores(f)) - ref) < 1e-5
    assert abs(float(get_tot_scores(f, log_semiring=False)) - 2.6) < 1e-6
    # traced inside jit (degree tables built in jnp with a conservative bound)
    fv = create_fsa_vec([f, Fsa.from_str("")]).to_jax()
    tot = jax.jit(lambda x: get_tot_scores(x))(fv)
    assert abs(float(tot[0]) - ref) < 1e-5 and np.isneginf(float(tot[1]))
    post = jax.jit(lambda x: get_arc_post(x, log_semiring=False))(fv)
    _close(post[0, :5], oracle.arc_post(f, log_semiring=False))
    assert get_tot_scores(fv, use_double_scores=True).dtype == (
        jnp.float64 if jax.config.jax_enable_x64 else jnp.float32)


def test_not_top_sorted_is_an_error():
    f = Fsa.from_str("0 2 1 1.0\n2 1 2 1.0\n1 3 -1 0\n3")
    with pytest.raises(ValueError, match="top-sorted"):
        get_tot_scores(f)


def test_safe_logsumexp():
    x = jnp.array([[-jnp.inf, -jnp.inf], [0.0, -jnp.inf], [1.0, 2.0]])
    v, g = jax.value_and_grad(lambda x: jnp.sum(jnp.where(jnp.isfinite(safe_logsumexp(x)),
                                                          safe_logsumexp(x), 0.0)))(x)
    assert np.isneginf(float(safe_logsumexp(x)[0]))
    assert not np.any(np.isnan(np.asarray(g)))
    np.testing.assert_allclose(np.asarray(g[0]), 0.0)
    np.testing.assert_allclose(float(safe_logsumexp(x)[2]), np.logaddexp(1.0, 2.0), rtol=1e-6)


# ------------------------------------------------------------------ shortest_path
@SETTINGS
@given(batches)
def test_shortest_path_matches_enumeration(fv):
    paths = shortest_path(fv, use_double_scores=True).to_numpy()
    assert len(paths) == B
    for b in range(B):
        f = fv[b]
        best = oracle.best_path(f)
        p = paths[b]
        if best is None:
            assert int(p.num_states) == 0
            continue
        assert abs(float(np.sum(p.score)) - best.score) < 1e-4
        if not _unique_best(f):
            continue
        assert int(p.num_states) == len(best.arcs) + 1
        np.testing.assert_array_equal(np.asarray(p.label), np.asarray(best.labels))
        np.testing.assert_array_equal(np.asarray(p.src), np.arange(len(best.arcs)))
        np.testing.assert_array_equal(np.asarray(p.dst), np.arange(1, len(best.arcs) + 1))
        np.testing.assert_array_equal(np.asarray(p.attrs["aux_labels"]), np.asarray(best.attrs["aux_labels"]))
        assert abs(float(np.sum(p.score)) - best.score) < 1e-4
        assert abs(float(get_tot_scores(p)) - best.score) < 1e-4


def test_double_scores_without_x64_warn_once(monkeypatch):
    """use_double_scores=True (the default, as in k2) without x64: float32, and one warning per
    process that says so and how to turn x64 on; no warning for use_double_scores=False or with
    x64 on (float64 then)."""
    f = create_fsa_vec([Fsa.from_str("0 1 1 1.0\n0 1 2 2.0\n0 2 3 0.3\n1 2 4 0.5\n2 3 -1 0.1\n3")])
    monkeypatch.setattr(scores_mod, "_warned_float32", False)
    with pytest.warns(Float32ScoresWarning, match=r"jax_enable_x64 is off.*float32.*"
                                                  r"jax\.config\.update\('jax_enable_x64', True\)") as record:
        tot = get_tot_scores(f)
    assert tot.dtype == jnp.float32 and len(record) == 1
    assert record[0].filename == __file__        # points at the caller's line
    with warnings.catch_warnings():
        warnings.simplefilter("error", Float32ScoresWarning)
        get_tot_scores(f)                          # once per process
        get_forward_scores(f)
        shortest_path(f)
        monkeypatch.setattr(scores_mod, "_warned_float32", False)
        for fn in (get_tot_scores, get_forward_scores, get_backward_scores, get_arc_post, shortest_path):
            assert fn(f, use_double_scores=False) is not None
    for fn in (get_forward_scores, get_backward_scores, get_arc_post, shortest_path):
        monkeypatch.setattr(scores_mod, "_warned_float32", False)
        with pytest.warns(Float32ScoresWarning):
            fn(f)
