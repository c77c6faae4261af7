"""CTC loss forward+backward on CPU: jasr.ctc_loss vs optax.ctc_loss vs torch.nn.functional.ctc_loss.

    python bench/ctc.py [--reps 7] [--shapes 8,100,32,20 ...] [--out bench/results/ctc.md]

Every implementation computes sum(loss) and its gradient w.r.t. the logits [B, T, K] (float32), from
the same random logits, labels and padding (frame lengths 80-100% of T, label lengths 50-100% of N).
jasr/optax run as one jitted value_and_grad; torch runs log_softmax + ctc_loss + backward.
After two warm-up calls each, the implementations take turns in rounds (the order shuffled every
round, so that machine drift hits all alike). In its turn an implementation runs one *cold* call
(the first after another implementation's work) and then a short burst of *steady* calls (back to
back, about --burst-ms in all, at least one); every call is timed. The tables report the median of
the steady calls (the per-call cost of the computation) and, beside it, the median of the cold
calls: after a few ms of other work every JAX call pays a fixed wake-up cost (the `noop` column, a
jitted `x + 1` on the same logits, shows it: at the smallest shape ~0.05 ms back to back and
~0.1-0.15 ms as a cold call), which is no part of any CTC implementation but weighs most on the
fastest one. At least --reps rounds (more for fast shapes, --min-seconds). Peak memory: the rise
of the process's peak RSS (VmHWM, reset through /proc/self/clear_refs) during one call, and for the
JAX programs XLA's own buffer assignment (temporaries + outputs, from compiled.memory_analysis()).
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# torch's OpenMP workers otherwise busy-wait after each call and take the cores from the JAX call
# that follows (measured: up to 1.7x slower jasr/optax timings in the alternating loop).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
import torch  # noqa: E402

from fsa_ops.ctc import default_method  # noqa: E402
from jasr.losses import ctc_loss  # noqa: E402

LOAD_BEFORE = os.getloadavg()
SHAPES = [(8, 100, 32, 20), (32, 250, 32, 60), (16, 500, 500, 80), (8, 1000, 1000, 150), (4, 1500, 5000, 100)]


MAX_REPS = 301


def _time_once(run):
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def make_inputs(batch, frames, classes, max_labels, seed=0):
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(batch, frames, classes)).astype(np.float32)
    frame_lengths = rng.integers(int(0.8 * frames), frames + 1, size=batch)
    frame_lengths[0] = frames
    label_lengths = rng.integers(max(1, max_labels // 2), max_labels + 1, size=batch)
    label_lengths[0] = max_labels
    labels = rng.integers(1, classes, size=(batch, max_labels)).astype(np.int32)
    logit_paddings = (np.arange(frames)[None] >= frame_lengths[:, None]).astype(np.float32)
    label_paddings = (np.arange(max_labels)[None] >= label_lengths[:, None]).astype(np.float32)
    return logits, logit_paddings, labels, label_paddings, frame_lengths, label_lengths


def noop_runner(logits):
    """A jitted `x + 1` on the logits: what any JAX call costs besides its computation."""
    fn = jax.jit(lambda x: x + 1.0)
    x = jnp.asarray(logits)

    def run():
        return (jax.block_until_ready(fn(x)).sum(),)
    return run


def jax_runner(loss_fn, logits, logit_paddings, labels, label_paddings):
    fn = jax.jit(jax.value_and_grad(lambda x: jnp.sum(loss_fn(x, logit_paddings, labels, label_paddings))))
    x = jnp.asarray(logits)
    compiled = fn.lower(x).compile()
    mem = compiled.memory_analysis()
    xla_bytes = (mem.temp_size_in_bytes + mem.output_size_in_bytes) if mem is not None else float("nan")

    def run():
        return jax.block_until_ready(fn(x))
    return run, xla_bytes


def torch_runner(logits, labels, frame_lengths, label_lengths):
    x = torch.tensor(logits)
    targets = torch.tensor(labels, dtype=torch.long)
    in_lens = torch.tensor(frame_lengths, dtype=torch.long)
    tgt_lens = torch.tensor(label_lengths, dtype=torch.long)

    def run():
        xs = x.detach().requires_grad_(True)
        lp = torch.log_softmax(xs, dim=-1).transpose(0, 1)
        loss = torch.nn.functional.ctc_loss(lp, targets, in_lens, tgt_lens, blank=0, reduction="sum")
        loss.backward()
        return loss.item(), xs.grad
    return run


def peak_rss_rise(run):
    """Bytes by which the process's peak RSS rises during one call (VmHWM after a reset)."""
    def field(name):
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(name):
                    return int(line.split()[1]) * 1024
        return 0
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return float("nan")
    base = field("VmRSS")
    run()
    return field("VmHWM") - base


def mib(n):
    return "n/a" if n != n else f"{n / 2**20:.1f}"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=7, help="minimum rounds per shape (each: a cold call and a steady burst per implementation)")
    parser.add_argument("--min-seconds", type=float, default=1.0,
                        help="more rounds (up to %d) until each implementation ran about this long" % MAX_REPS)
    parser.add_argument("--burst-ms", type=float, default=3.0,
                        help="steady (back-to-back) calls per implementation and round: about this long, 1 to 8")
    parser.add_argument("--shapes", nargs="*", default=None, help="B,T,K,N entries")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "ctc.md"))
    parser.add_argument("--note", default="", help="extra line for the report (e.g. 'machine shared')")
    args = parser.parse_args()
    shapes = [tuple(int(v) for v in s.split(",")) for s in args.shapes] if args.shapes else SHAPES

    impls = ["jasr", "jasr log", "jasr auto", "optax", "torch", "noop"]
    rows = []
    for shape in shapes:
        batch, frames, classes, max_labels = shape
        print(f"[ctc bench] shape B,T,K,N = {shape}: compiling / warming up", flush=True)
        logits, fp, labels, lpad, frame_lengths, label_lengths = make_inputs(*shape)
        runners, xla_mem = {}, {}
        runners["jasr"], xla_mem["jasr"] = jax_runner(ctc_loss, logits, fp, labels, lpad)
        runners["jasr log"], xla_mem["jasr log"] = jax_runner(
            lambda *a: ctc_loss(*a, method="log"), logits, fp, labels, lpad)
        runners["jasr auto"], xla_mem["jasr auto"] = jax_runner(
            lambda *a: ctc_loss(*a, method="auto"), logits, fp, labels, lpad)
        runners["optax"], xla_mem["optax"] = jax_runner(optax.ctc_loss, logits, fp, labels, lpad)
        runners["torch"] = torch_runner(logits, labels, frame_lengths, label_lengths)
        runners["noop"] = noop_runner(logits)
        xla_mem["torch"] = xla_mem["noop"] = float("nan")
        losses = {}
        for name in impls:   # warm-up (and a cross-check of the summed losses)
            out = runners[name]()
            runners[name]()
            losses[name] = float(out[0])
        losses.pop("noop")
        rss = {name: peak_rss_rise(runners[name]) for name in impls}
        steady = {name: [] for name in impls}
        cold = {name: [] for name in impls}
        # Small shapes take ~1 ms a call and the machine's noise is 10-40%: run at least
        # --min-seconds per implementation. The order is shuffled every round, so that no
        # implementation always runs right after torch.
        once = {name: _time_once(runners[name]) for name in impls}
        burst = {name: int(np.clip(args.burst_ms * 1e-3 / max(once[name], 1e-6), 1, 8)) for name in impls}
        per_round = max(once[name] * (1 + burst[name]) for name in impls if name != "noop")
        reps = max(args.reps, min(MAX_REPS, int(args.min_seconds / max(per_round, 1e-6))))
        shuffle = np.random.default_rng(0)
        for rep in range(reps):
            order = [impls[i] for i in shuffle.permutation(len(impls))]
            for name in order:
                for call in range(1 + burst[name]):
                    start = time.perf_counter()
                    runners[name]()
                    (steady if call else cold)[name].append(time.perf_counter() - start)
            if rep < 3 or (rep + 1) % max(1, reps // 5) == 0:
                print(f"  round {rep + 1}/{reps} (steady, cold): "
                      + "  ".join(f"{n} {steady[n][-1] * 1e3:.2f}/{cold[n][-1] * 1e3:.2f}ms" for n in impls),
                      flush=True)
        med = {name: statistics.median(steady[name]) * 1e3 for name in impls}
        med_cold = {name: statistics.median(cold[name]) * 1e3 for name in impls}
        rows.append(dict(shape=shape, med=med, cold=med_cold, rss=rss, xla=xla_mem, losses=losses, reps=reps))
        print("  median ms (steady): " + "  ".join(f"{n} {med[n]:.2f}" for n in impls)
              + "\n  median ms (cold):   " + "  ".join(f"{n} {med_cold[n]:.2f}" for n in impls)
              + "\n  sum-loss " + "  ".join(f"{n} {losses[n]:.3f}" for n in losses), flush=True)

    lines = [
        "# CTC loss benchmark (CPU, forward + backward)",
        "",
        f"`python bench/ctc.py` — {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPU cores; jax {jax.__version__}, "
        f"optax {optax.__version__}, torch {torch.__version__} ({torch.get_num_threads()} threads).",
        "",
        "sum(loss) and d/d(logits) of float32 logits [B, T, K]; frame lengths 80-100% of T, label lengths "
        "50-100% of N. Implementations take turns in rounds (order shuffled every round; at least "
        f"{args.reps} rounds, more for fast shapes: rounds column); in its turn each runs one cold call "
        "(right after another implementation's work) and then a burst of steady calls (back to back, "
        f"~{args.burst_ms:g} ms, 1-8 calls). ms columns: median wall-clock of the steady calls; `cold` "
        "columns: median of the cold calls; `noop` = a jitted `x + 1` on the same logits, steady / cold, "
        "the fixed cost of any JAX call (its cold excess is no part of CTC). `jasr` = `jasr.ctc_loss` with its default method "
        "(shown in brackets: 'auto' for K <= 128, else 'log'); `log` = exact log-semiring recursion; "
        "`auto` = rescaled probabilities, recomputed with 'log' when the alpha/beta totals disagree "
        "(see fsa_ops/ctc.py). Ratios > 1 mean jasr (default) is faster. "
        "`rel. diff` = max over implementations of |sum-loss - torch| / torch (float32 everywhere).",
        "",
        "| B, T, K, N | jasr ms | log ms | auto ms | optax ms | torch ms | optax / jasr | torch / jasr "
        "| cold: jasr / optax ms | cold: optax / jasr | noop ms (steady / cold) "
        "| rel. diff | rounds | peak RSS rise MiB (jasr / optax / torch) | XLA temp+out MiB (jasr / optax) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |",
    ]
    for r in rows:
        m, c, rss, xla, losses = r["med"], r["cold"], r["rss"], r["xla"], r["losses"]
        rel = max(abs(losses[n] - losses["torch"]) / abs(losses["torch"]) for n in losses)
        lines.append(
            f"| {', '.join(map(str, r['shape']))} | {m['jasr']:.2f} ({default_method(r['shape'][2])}) "
            f"| {m['jasr log']:.2f} | {m['jasr auto']:.2f} | {m['optax']:.2f} "
            f"| {m['torch']:.2f} | {m['optax'] / m['jasr']:.2f} | {m['torch'] / m['jasr']:.2f} "
            f"| {c['jasr']:.2f} / {c['optax']:.2f} | {c['optax'] / c['jasr']:.2f} | {m['noop']:.2f} / {c['noop']:.2f} "
            f"| {rel:.1e} | {r['reps']} "
            f"| {mib(rss['jasr'])} / {mib(rss['optax'])} / {mib(rss['torch'])} "
            f"| {mib(xla['jasr'])} / {mib(xla['optax'])} |")
    lines += [
        "",
        "Peak RSS rise: growth of the process's peak resident set during one call (VmHWM reset via "
        "/proc/self/clear_refs just before); memory that an allocator reuses without returning it to "
        "the OS is not counted, so treat it as a lower bound. XLA temp+out: the compiled program's "
        "temporary and output buffers (excluding the logits argument).",
        "",
        f"Run with OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')} (torch's idle OpenMP workers do not "
        "busy-wait through the other implementations' calls); load average before the run: "
        f"{LOAD_BEFORE[0]:.2f}.",
    ]
    if args.note:
        lines += ["", args.note]
    lines += ["", f"![CTC forward+backward times]({os.path.splitext(os.path.basename(args.out))[0]}.png)"]
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))

    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(9, 4.5))
        width = 0.16
        xs = np.arange(len(rows))
        for i, name in enumerate(impls[:5]):
            ax.bar(xs + (i - 2) * width, [r["med"][name] for r in rows], width, label=name)
        ax.set_xticks(xs, ["B,T,K,N=\n" + ",".join(map(str, r["shape"])) for r in rows], fontsize=8)
        ax.set_yscale("log")
        ax.set_ylabel("forward+backward, ms (median of steady calls, log scale)")
        ax.set_title("CTC loss on CPU: jasr vs optax vs torch")
        ax.legend()
        fig.tight_layout()
        png = os.path.splitext(args.out)[0] + ".png"
        fig.savefig(png, dpi=110)
        print(f"[ctc bench] wrote {args.out} and {png}")
    except ImportError:
        print(f"[ctc bench] wrote {args.out} (matplotlib missing: no plot)")

    import collect_results  # noqa: E402
    collect_results.refresh_after(args.out)


if __name__ == "__main__":
    main()
