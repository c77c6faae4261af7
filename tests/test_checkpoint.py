"""orbax checkpoints: last K + best by dev WER (also after a restart), atomic writes, exact restore."""
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jasr.checkpoint import Checkpointer


def _state(seed=0):
    k = jax.random.PRNGKey(seed)
    params = {"w": jax.random.normal(k, (4, 3)), "b": jnp.zeros(3)}
    tx = optax.adamw(1e-2)
    opt = tx.init(params)
    grads = jax.tree.map(jnp.ones_like, params)
    _, opt = tx.update(grads, opt, params)      # non-trivial moments
    return {"params": params, "opt": opt, "rng": jax.random.PRNGKey(7), "step": jnp.int32(5)}


def test_keep_last_and_best_survives_restart(tmp_path):
    d = str(tmp_path / "ck")
    st = _state()
    with Checkpointer(d, keep_last=2, keep_best=1, async_save=False) as c:
        for step, wer in [(1, 0.5), (2, 0.2), (3, None), (4, 0.4), (5, None)]:
            c.save(step, st, {"pos": step}, metrics=None if wer is None else {"dev_wer": wer})
        assert c.all_steps() == [2, 4, 5] and c.best_step() == 2
    with Checkpointer(d, keep_last=2, keep_best=1, async_save=False) as c:   # a new process
        assert c.best_step() == 2
        for step in (6, 7):
            c.save(step, st, {"pos": step})
        assert c.all_steps() == [2, 6, 7], "the best (step 2) is kept after a restart"
        assert c.latest_step() == 7


def test_exact_restore_of_optimizer_rng_and_extra(tmp_path):
    st = _state(3)
    extra = {"data_state": b"\x00\xffgrain-state", "nested": {"epoch": 2, "arr": np.arange(3)}}
    with Checkpointer(str(tmp_path), async_save=True) as c:
        c.save(10, st, extra)
        c.wait()
        target = jax.eval_shape(lambda: _state(0))
        back, ex = c.restore(None, target)
    for a, b in zip(jax.tree.leaves(st), jax.tree.leaves(back)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert jax.tree.structure(st) == jax.tree.structure(back)
    assert ex["data_state"] == extra["data_state"] and ex["nested"] == {"epoch": 2, "arr": [0, 1, 2]}


def test_partial_write_is_never_a_checkpoint(tmp_path):
    d = tmp_path / "ck"
    with Checkpointer(str(d), async_save=False) as c:
        c.save(3, _state(), {"pos": 3})
    # what a process killed mid-save leaves: orbax's temporary folder, never the final name
    junk = d / "6.orbax-checkpoint-tmp-1234567"
    (junk / "state").mkdir(parents=True)
    (junk / "state" / "half_written").write_bytes(b"\x00" * 10)
    with Checkpointer(str(d), async_save=False) as c:
        assert c.latest_step() == 3 and c.all_steps() == [3]
        _, ex = c.restore(None, jax.eval_shape(_state))
        assert ex == {"pos": 3}
    assert not junk.exists(), "temporary folders are cleaned up when the manager opens"


def test_errors(tmp_path):
    with Checkpointer(str(tmp_path), async_save=False) as c:
        with pytest.raises(FileNotFoundError, match="no checkpoint"):
            c.restore(None, _state())
        c.save(1, _state())
        with pytest.raises(FileNotFoundError, match="no checkpoint for step 9"):
            c.restore(9, _state())
        assert c.save(1, _state()) is False, "an existing step is not overwritten"
    with pytest.raises(ValueError, match="keep_last"):
        Checkpointer(str(tmp_path / "x"), keep_last=0)
