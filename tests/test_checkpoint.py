"""orbax checkpoints: last K + best by dev WER (also after a restart), atomic writes, exact restore."""
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jasr.checkpoint import Checkpointer, CheckpointError


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


# ------------------------------------------------------------------------------------------------ faults (issue 21)

def _big_state(seed):
    """An array past orbax's inline limit (1 KiB), so that its bytes sit in the step folder's data files; random
    bits, so that zstd stores them as they are."""
    k = jax.random.PRNGKey(seed)
    return {"w": jax.random.bits(k, (64, 64), jnp.uint32), "b": jnp.arange(3.0) + seed, "step": jnp.int32(seed)}


def _data_files(step_dir):
    return sorted((p for p in step_dir.glob("state/**/d/*") if p.is_file()), key=lambda p: p.stat().st_size)


def _three_steps(d, **kw):
    with Checkpointer(str(d), async_save=False, **kw) as c:
        for s in (1, 2, 3):
            c.save(s, _big_state(s), {"pos": s}, metrics={"dev_wer": {1: 0.3, 2: 0.1, 3: 0.2}[s]})


def test_overwritten_array_bytes_are_caught_and_restore_falls_back(tmp_path):
    """One changed byte inside an array's data passes orbax's own checks (it restores a different array); the
    checksums saved with the state catch it."""
    _three_steps(tmp_path)
    raw = np.asarray(_big_state(3)["w"]).tobytes()
    for f in _data_files(tmp_path / "3"):
        data = bytearray(f.read_bytes())
        at = data.find(raw[4096:4112])
        if at >= 0:
            data[at + 5] ^= 0x10
            f.write_bytes(bytes(data))
            break
    else:
        pytest.fail("the array's bytes were not found in the data files")
    target = jax.eval_shape(lambda: _big_state(0))
    with Checkpointer(str(tmp_path), async_save=False) as c:
        with pytest.raises(CheckpointError, match=r"checkpoint step 3 in .* does not read back whole: array "
                                                  r"\['w'\] differs from the checksum"):
            c.restore(3, target)
        step, state, extra, skipped = c.restore_intact(target)
        assert step == 2 and extra == {"pos": 2} and [s for s, _ in skipped] == [3]
        assert "['w'] differs from the checksum" in skipped[0][1]
        np.testing.assert_array_equal(np.asarray(state["w"]), np.asarray(_big_state(2)["w"]))


def test_truncated_data_file_and_edited_iterator_state_fall_back(tmp_path):
    _three_steps(tmp_path)
    f = _data_files(tmp_path / "3")[-1]
    f.write_bytes(f.read_bytes()[:f.stat().st_size // 2])
    # an edit that still parses as JSON: the data-iterator position of step 2
    meta = tmp_path / "2" / "extra" / "metadata"
    meta.write_text(meta.read_text().replace('"pos": 2', '"pos": 7'))
    target = jax.eval_shape(lambda: _big_state(0))
    with Checkpointer(str(tmp_path), async_save=False) as c:
        step, _, extra, skipped = c.restore_intact(target)
        assert step == 1 and extra == {"pos": 1} and [s for s, _ in skipped] == [3, 2]
        assert "extra JSON" in skipped[1][1]
        # "best" tries the steps by dev WER first (2: 0.1, 3: 0.2, 1: 0.3)
        step, _, _, skipped = c.restore_intact(target, prefer="best")
        assert step == 1 and [s for s, _ in skipped] == [2, 3]
        for s in (3, 2):
            c.set_aside(s)
        assert c.all_steps() == [1] and (tmp_path / "3.corrupt").is_dir()
        c.save(2, _big_state(2), {"pos": 2})      # a step set aside can be written again
        assert c.restore_intact(target)[0] == 2


def test_no_intact_checkpoint_names_each(tmp_path):
    _three_steps(tmp_path)
    for s in (1, 2, 3):
        (tmp_path / str(s) / "extra" / "metadata").write_bytes(b"\x00garbage")
    target = jax.eval_shape(lambda: _big_state(0))
    with Checkpointer(str(tmp_path), async_save=False) as c, \
            pytest.raises(CheckpointError, match=r"reads back whole: step 3: .*; step 2: .*; step 1: "):
        c.restore_intact(target)


def test_damaged_metrics_file_does_not_stop_the_folder_from_opening(tmp_path):
    _three_steps(tmp_path)
    (tmp_path / "2" / "metrics" / "metrics").write_text('{"dev_wer": 0.')
    with Checkpointer(str(tmp_path), async_save=False) as c:
        assert c.all_steps() == [1, 2, 3] and c.best_step() == 3, "step 2 no longer has a dev metric"
        assert len(c.repaired) == 1 and "metrics.corrupt" in c.repaired[0]
        assert c.restore_intact(jax.eval_shape(lambda: _big_state(0)))[0] == 3


@pytest.mark.parametrize("async_save", [False, True])
def test_full_disk_is_one_clear_error_and_keeps_the_previous_checkpoint(tmp_path, monkeypatch, async_save):
    """A writer that fails with ENOSPC (as a full disk does) while step 2 is written."""
    import errno

    from orbax.checkpoint._src.handlers import json_checkpoint_handler as jch
    real = jch.JsonCheckpointHandler._save_fn

    async def full_disk(self, x, directory):
        if "/2.orbax-checkpoint-tmp" in str(directory):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(directory / "metadata"))
        return await real(self, x, directory)

    monkeypatch.setattr(jch.JsonCheckpointHandler, "_save_fn", full_disk)
    d = tmp_path / "ck"
    c = Checkpointer(str(d), async_save=async_save, keep_last=1)
    c.save(1, _big_state(1), {"pos": 1})
    with pytest.raises(CheckpointError) as info:
        c.save(2, _big_state(2), {"pos": 2})
        c.save(3, _big_state(3), {"pos": 3})     # an asynchronous save's error comes at the next save (or wait)
    msg = str(info.value)
    assert msg.startswith(f"no space left on device while writing checkpoint step 2 to {d}"), msg
    assert msg.endswith("the checkpoints before it are kept (latest: step 1)"), msg
    c.close()
    monkeypatch.undo()
    with Checkpointer(str(d), async_save=False) as c:
        assert c.all_steps() == [1], "step 1 is kept (keep_last=1), the failed step 2 is no checkpoint"
        state, extra = c.restore(None, jax.eval_shape(lambda: _big_state(0)))
        assert extra == {"pos": 1} and int(state["step"]) == 1
