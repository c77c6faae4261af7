"""Test set-up: float64 available for references, JAX's persistent compilation cache, and a fresh set of in-memory
compiled programs for each test module.

The suite compiles thousands of XLA programs in one process; from a cold cache, two full runs segfaulted inside
XLA's CPU compiler at the same point (~60 % through, in tests/test_fsa_scores.py, whose tests pass alone and after
either half of the suite). Dropping each module's compiled programs when it ends (`jax.clear_caches`) keeps what
the process holds bounded; programs still load from the persistent cache when another module needs them.
"""
import gc
import os

import jax
import pytest

jax.config.update("jax_enable_x64", False)
_cache = os.environ.get("JAX_COMPILATION_CACHE_DIR") or os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".cache", "jax")
jax.config.update("jax_compilation_cache_dir", _cache)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)


@pytest.fixture(autouse=True, scope="module")
def _fresh_compiled_programs_per_module():
    yield
    jax.clear_caches()
    gc.collect()
