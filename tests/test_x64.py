"""float64 scores (k2's use_double_scores) with jax_enable_x64 on from the start, in a subprocess.

The rest of the suite runs with x64 off (conftest.py). Turning it on inside the test process (`jax.enable_x64`, an
experimental context manager in JAX) once crashed XLA's compiler in a full-suite run (a segfault that ends every
remaining test), so the float64 checks run here, in one fresh interpreter started with JAX_ENABLE_X64=1.
"""
import os
import subprocess
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CHECKS = textwrap.dedent('''
    import sys
    import jax, jax.numpy as jnp, numpy as np
    sys.path.insert(0, "tests")
    import fsa_oracle as oracle
    from fsa_ops import (DenseFsaVec, Fsa, create_fsa_vec, ctc_graph, ctc_loss, dense_tot_scores,
                         get_tot_scores, intersect_dense_pruned, shortest_path)
    assert jax.config.jax_enable_x64

    # scores of an FSA: float64 totals equal the oracle; gradients keep the scores' dtype; best path
    f = create_fsa_vec([Fsa.from_str("0 1 1 1.0\\n0 1 2 2.0\\n0 2 3 0.3\\n1 2 4 0.5\\n2 3 -1 0.1\\n3")])
    ref = np.logaddexp(np.logaddexp(1.5, 2.5), 0.3) + 0.1
    fj = f.to_jax()
    tot = get_tot_scores(fj, use_double_scores=True)
    assert tot.dtype == jnp.float64 and abs(float(tot[0]) - ref) < 1e-6
    assert get_tot_scores(fj, use_double_scores=False).dtype == jnp.float32
    g = jax.grad(lambda s: jnp.sum(get_tot_scores(fj.replace(score=s))))(fj.score)
    assert g.dtype == fj.score.dtype
    np.testing.assert_allclose(np.asarray(g[0]), np.exp(oracle.arc_post(f[0])), atol=1e-6)
    p = shortest_path(fj)
    assert abs(float(np.sum(np.asarray(p.score)[0, :int(p.num_arcs[0])])) - 2.6) < 1e-6

    # dense intersection: float64 totals equal float32 ones; the loss's gradient keeps the log-probs' dtype
    rng = np.random.default_rng(7)
    lp = jax.nn.log_softmax(jnp.asarray(rng.normal(size=(2, 6, 4)), jnp.float32))
    graph = ctc_graph([[1, 2], [3, 3, 1]])
    segs = np.array([[0, 0, 6], [1, 0, 5]], np.int32)
    t32 = dense_tot_scores(graph, DenseFsaVec(lp, segs), use_double_scores=False)
    t64 = dense_tot_scores(graph, DenseFsaVec(lp, segs), use_double_scores=True)
    assert t32.dtype == jnp.float32 and t64.dtype == jnp.float64
    np.testing.assert_allclose(np.asarray(t64), np.asarray(t32, np.float64), atol=1e-5, rtol=1e-5)
    gr = jax.grad(lambda x: ctc_loss(graph, DenseFsaVec(x, segs)))(lp)
    assert gr.dtype == jnp.float32 and not np.any(np.isnan(np.asarray(gr)))
    lat = intersect_dense_pruned(graph, DenseFsaVec(lp, segs), 20, 8, 1, 10)
    np.testing.assert_allclose(np.asarray(get_tot_scores(lat, use_double_scores=True)), np.asarray(t64),
                               atol=1e-5, rtol=1e-5)
    print("x64 checks passed")
''')


def test_double_scores_with_x64():
    env = dict(os.environ, JAX_ENABLE_X64="1", JAX_PLATFORMS="cpu")
    run = subprocess.run([sys.executable, "-c", CHECKS], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0 and "x64 checks passed" in run.stdout, run.stdout[-3000:] + run.stderr[-3000:]
