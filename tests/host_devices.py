"""Running test code in a fresh interpreter with N host CPU devices: the flag
``XLA_FLAGS=--xla_force_host_platform_device_count`` must be set before JAX starts, and the test process has one
device, so sharded checks run as a subprocess."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_with_host_devices(code: str, *args: str, devices: int = 8, xla_flags: str = "",
                          timeout: int = 900) -> subprocess.CompletedProcess:
    """``python -c code *args`` in the repository root on `devices` host CPU devices (plus `xla_flags`); the
    environment is the test's (so the compilation cache is shared), with tests/ on the path."""
    flags = f"--xla_force_host_platform_device_count={devices} {xla_flags}".strip()
    tests = os.path.dirname(os.path.abspath(__file__))     # the tests' helper modules importable there too
    path = os.pathsep.join(p for p in (tests, os.environ.get("PYTHONPATH", "")) if p)
    env = dict(os.environ, XLA_FLAGS=flags, JAX_PLATFORMS="cpu", PYTHONPATH=path)
    return subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)


def assert_printed_ok(r: subprocess.CompletedProcess) -> None:
    """The subprocess exited 0 and its last line is ``OK`` (else its output's tails)."""
    assert r.returncode == 0 and r.stdout.strip().endswith("OK"), r.stdout[-3000:] + r.stderr[-6000:]
