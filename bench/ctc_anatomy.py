"""Where the time of `jasr.ctc_loss` goes at small shapes on CPU: the log recursion with and without its
transcendentals, against the whole loss + gradient and optax, in one process.

    python bench/ctc_anatomy.py [--shapes 8,100,32,20 ...] [--dists normal,x10,...] [--out bench/results/ctc_anatomy.md]

Rows (each jitted; inputs and timing are bench/ctc.py's protocol: its `make_inputs` and its `measure`, interleaved
rounds in shuffled order after a compile and two warm calls, median of the steady calls):
- `loss + grad`: value_and_grad of the summed `fsa_ops.ctc.ctc_nll` (default method 'log'), what bench/ctc.py
  times;
- `recursion (log)`: the lattice, the log-normaliser and `fsa_ops.ctc_log.run_log` with its tables (the forward
  and backward frame loop, both directions in one loop) and no gradient;
- `recursion (tropical)`: the same loop in the tropical semiring (`semiring='tropical'`): the same kernels, the
  same loads and stores and the same per-frame shift, with a max where the log semiring has its log-add (two exps
  and a log per state and frame); the difference of the two rows is what that arithmetic costs;
- `optax`: value_and_grad of the summed optax.ctc_loss, the reference of the issue's 2x goal;
- `noop`: a jitted `x + 1` on the logits (the dispatch floor).
"""
from __future__ import annotations

import argparse
import datetime
import importlib.util
import os
import platform
import sys


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402

from fsa_ops.ctc import ctc_nll  # noqa: E402
from fsa_ops.ctc_lattice import CtcLattice, log_normaliser  # noqa: E402
from fsa_ops.ctc_log import run_log  # noqa: E402


def _bench_ctc():
    """bench/ctc.py as a module (its `make_inputs` is the protocol's input generator)."""
    spec = importlib.util.spec_from_file_location("bench_ctc", os.path.join(ROOT, "bench", "ctc.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def runners(logits, logit_paddings, labels, label_paddings):
    """{row: call} for one input (see the module docstring)."""
    x, fp, lab, lpad = (jnp.asarray(a) for a in (logits, logit_paddings, labels, label_paddings))

    def recursion(semiring):
        def run(x):
            lat = CtcLattice.build(x, fp, lab, lpad, 0)
            lat = lat.with_log_norm(*log_normaliser(x, False))
            return run_log(lat, rows=lat.loop_emissions(x), store=True, semiring=semiring)
        return jax.jit(run)

    fns = {"loss + grad": jax.jit(jax.value_and_grad(lambda x: jnp.sum(ctc_nll(x, fp, lab, lpad)))),
           "recursion (log)": recursion("log"),
           "recursion (tropical)": recursion("tropical"),
           "optax": jax.jit(jax.value_and_grad(lambda x: jnp.sum(optax.ctc_loss(x, fp, lab, lpad)))),
           "noop": jax.jit(lambda x: x + 1.0)}
    return {name: (lambda f=f: jax.block_until_ready(f(x))) for name, f in fns.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", nargs="*", default=["8,100,32,20", "32,250,32,60"], help="B,T,K,N entries")
    parser.add_argument("--dists", default="normal,x10,model", help="comma-separated: normal, x3, x10, model")
    parser.add_argument("--reps", type=int, default=9, help="minimum rounds per input (bench/ctc.py's protocol)")
    parser.add_argument("--min-seconds", type=float, default=1.0,
                        help="more rounds until each row ran about this long")
    parser.add_argument("--burst-ms", type=float, default=3.0, help="steady calls per turn: about this long, 1 to 8")
    parser.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "ctc_anatomy.md"))
    args = parser.parse_args()
    bench_ctc = _bench_ctc()
    load_before = bench_ctc.uptime()
    rows = []
    for shape_text in args.shapes:
        shape = tuple(int(v) for v in shape_text.split(","))
        for dist in args.dists.split(","):
            logits, fp, labels, lpad, _, _ = bench_ctc.make_inputs(shape, dist)
            ms, rounds = bench_ctc.measure(runners(logits, fp, labels, lpad), args.reps, args.min_seconds,
                                           args.burst_ms)
            rows.append((shape, dist, ms, rounds))
            print(shape, dist, {k: round(v, 3) for k, v in ms.items()}, flush=True)
    names = list(rows[0][2])
    lines = [
        "## CTC on CPU: where the time goes at small shapes",
        "",
        f"`python bench/ctc_anatomy.py` — {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; "
        f"{platform.machine()}, {os.cpu_count()} CPU cores; jax {jax.__version__}, optax {optax.__version__}.",
        "",
        f"Load: `{load_before}` before, `{bench_ctc.uptime()}` after (shared machine: absolute times are noisy; the "
        f"rows of one input are interleaved in the same rounds). ms = median of the steady calls (bench/ctc.py's "
        f"protocol: at least {args.reps} rounds, more until each row ran ~{args.min_seconds:g} s).",
        "",
        "Rows: see the script's docstring. `log-add arithmetic` = recursion (log) - recursion (tropical): the "
        "exps and logs of the log semiring, the only difference of the two loops. `optax / (loss + grad - "
        "log-add)`: the speed-up over optax that a free log-add would give.",
        "",
        "| B, T, K, N | inputs | " + " | ".join(names) + " | log-add arithmetic | optax / loss+grad | "
        "optax / (loss + grad - log-add) | rounds |",
        "| --- | --- | " + " | ".join("---:" for _ in names) + " | ---: | ---: | ---: | ---: |",
    ]
    for shape, dist, ms, rounds in rows:
        logadd = ms["recursion (log)"] - ms["recursion (tropical)"]
        lines.append(f"| {', '.join(map(str, shape))} | {dist} | " + " | ".join(f"{ms[n]:.3f}" for n in names)
                     + f" | {logadd:.3f} | {ms['optax'] / ms['loss + grad']:.2f} | "
                     f"{ms['optax'] / max(ms['loss + grad'] - logadd, 1e-9):.2f} | {rounds} |")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {args.out}")
    spec = importlib.util.spec_from_file_location("collect_results", os.path.join(ROOT, "bench", "collect_results.py"))
    collect = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(collect)
    collect.refresh_after(args.out)


if __name__ == "__main__":
    main()
