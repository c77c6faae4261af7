"""Test set-up: float64 available for references, and JAX's persistent compilation cache."""
import os

import jax

jax.config.update("jax_enable_x64", False)
_cache = os.environ.get("JAX_COMPILATION_CACHE_DIR") or os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".cache", "jax")
jax.config.update("jax_compilation_cache_dir", _cache)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
