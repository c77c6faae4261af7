"""CTC loss forward+backward: jasr's CTC (fsa_ops.ctc.ctc_nll, what jasr.ctc_loss wraps) vs optax.ctc_loss vs
torch.nn.functional.ctc_loss, on four input distributions.

    python bench/ctc.py [--shapes 8,100,32,20 ...] [--dists normal,x3,x10,model] [--out bench/results/ctc.md]
    python bench/ctc.py --gpu          # GPU: the Pallas and XLA paths vs optax and torch (cuDNN and native)

Protocol (fixed; change it only with a new results file):
  * Inputs, per shape (B, T, K, N) and distribution, from a fixed seed: frame lengths uniform in
    [0.6 T, T] (row 0: T), label lengths uniform in [0, N] (row 0: N), labels uniform in [1, K) with a
    25 % chance of repeating the previous label (repeats need a blank frame between them).
    Distributions: `normal` = N(0, 1) logits, `x3` / `x10` = the same times 3 / 10 (more peaked, the
    range a network passes through in training), `model` = the log-probs of a trained network:
    bench/data/fsdd_ctc_logprobs.npz (configs/fsdd.py's Conformer-CTC on its held-out speaker, blank +
    16 characters; bench/data/make_ctc_logprobs.py regenerates it from a run). Each `model` row
    concatenates whole dev utterances (from a random start) while the next fits both the row's drawn
    frame length and N labels; its labels are their transcripts (so its lengths follow the data).
    The 17 model classes are put into the bench's K classes by a random injective map per row (blank
    stays 0); every other class c copies the frame's log-prob of character 1 + c mod 16, lowered by
    log(max(1, (K - 17) / 16)); the result is used as logits (the loss normalises them).
  * Every implementation computes sum(loss) and its gradient w.r.t. the float32 logits [B, T, K]:
    jax ones as one jitted value_and_grad, torch as log_softmax + ctc_loss + backward.
  * After two warm-up calls each, the implementations take turns in rounds (order shuffled every
    round); in its turn each runs one cold call and then a burst of steady calls (about --burst-ms,
    1-8 calls). The tables give the median of the steady calls; at least --reps rounds (more for
    fast shapes, --min-seconds per implementation). Ratios are from the same run.
  * `noop` is a jitted `x + 1` on the same logits: what any JAX call costs besides its computation.
The report gives every (shape, distribution) row, the least favourable and the best ratio, the date and
the machine's load (`uptime` before and after).
"""
from __future__ import annotations

import argparse
import os
import platform
import re
import statistics
import subprocess
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

from fsa_ops.ctc import ctc_nll, default_method  # noqa: E402

try:
    import torch  # noqa: E402
except ImportError:          # a bare GPU image may lack it: its columns are then n/a
    torch = None

HERE = os.path.dirname(os.path.abspath(__file__))
SHAPES = [(8, 100, 32, 20), (32, 250, 32, 60), (16, 500, 500, 80), (8, 1000, 1000, 150), (4, 1500, 5000, 100)]
GPU_SHAPES = [(32, 1000, 5000, 200), (64, 500, 500, 100)]
DISTS = ("normal", "x3", "x10", "model")
MODEL_DATA = os.path.join(HERE, "data", "fsdd_ctc_logprobs.npz")
MAX_REPS = 301


def uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "load average: " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


def _lengths(rng, batch, frames, max_labels):
    frame_lengths = rng.integers(int(0.6 * frames), frames + 1, size=batch)
    frame_lengths[0] = frames
    label_lengths = rng.integers(0, max_labels + 1, size=batch)
    label_lengths[0] = max_labels
    return frame_lengths, label_lengths


def _labels(rng, batch, classes, max_labels):
    labels = rng.integers(1, classes, size=(batch, max_labels))
    repeat = rng.uniform(size=(batch, max_labels)) < 0.25
    for n in range(1, max_labels):
        labels[:, n] = np.where(repeat[:, n], labels[:, n - 1], labels[:, n])
    return labels.astype(np.int32)


def _model_rows(rng, batch, frames, classes, max_labels, frame_lengths):
    """Logits, frame lengths, labels and label lengths from the trained model's log-probs (see the docstring)."""
    data = np.load(MODEL_DATA)
    lp_all = data["logprobs"].astype(np.float32)
    starts = np.concatenate([[0], np.cumsum(data["frame_lengths"])])
    lab_starts = np.concatenate([[0], np.cumsum(data["label_lengths"])])
    count = len(data["frame_lengths"])
    model_k = lp_all.shape[1]
    logits = np.zeros((batch, frames, classes), np.float32)
    labels = np.zeros((batch, max_labels), np.int32)
    out_frames, out_labels = np.zeros(batch, np.int64), np.zeros(batch, np.int64)
    lower = np.log(max(1.0, (classes - model_k) / (model_k - 1)))
    for b in range(batch):
        u = int(rng.integers(count))
        rows, labs = [], []
        while True:
            seg, lab = lp_all[starts[u]:starts[u + 1]], data["labels"][lab_starts[u]:lab_starts[u + 1]]
            if rows and (sum(map(len, rows)) + len(seg) > frame_lengths[b]
                         or sum(map(len, labs)) + len(lab) > max_labels):
                break
            if not rows and (len(seg) > frame_lengths[b] or len(lab) > max_labels):
                break                                 # (an empty row: no utterance fits)
            rows.append(seg)
            labs.append(lab)
            u = (u + 1) % count
        lp = np.concatenate(rows) if rows else np.zeros((0, model_k), np.float32)
        ids = np.concatenate(labs).astype(np.int64) if labs else np.zeros(0, np.int64)
        to_bench = np.zeros(model_k, np.int64)
        to_bench[1:] = rng.choice(np.arange(1, classes), size=model_k - 1, replace=False)
        extra = 1 + np.arange(classes) % (model_k - 1)
        row = lp[:, extra] - lower
        row[:, 0] = lp[:, 0] if len(lp) else 0.0
        row[:, to_bench[1:]] = lp[:, 1:]
        logits[b, :len(lp)] = row
        labels[b, :len(ids)] = to_bench[ids]
        out_frames[b], out_labels[b] = len(lp), len(ids)
    return logits, out_frames, labels, out_labels


def make_inputs(shape, dist, seed=0):
    """(logits [B, T, K] float32, logit_paddings, labels [B, N] int32, label_paddings, frame_lengths,
    label_lengths) of one (shape, distribution) cell of the protocol."""
    batch, frames, classes, max_labels = shape
    rng = np.random.default_rng(seed)
    frame_lengths, label_lengths = _lengths(rng, batch, frames, max_labels)
    if dist == "model":
        logits, frame_lengths, labels, label_lengths = _model_rows(rng, batch, frames, classes, max_labels,
                                                                   frame_lengths)
    else:
        scale = {"normal": 1.0, "x3": 3.0, "x10": 10.0}[dist]
        logits = (rng.normal(size=(batch, frames, classes)) * scale).astype(np.float32)
        labels = _labels(rng, batch, classes, max_labels)
    logit_paddings = (np.arange(frames)[None] >= frame_lengths[:, None]).astype(np.float32)
    label_paddings = (np.arange(max_labels)[None] >= label_lengths[:, None]).astype(np.float32)
    labels = np.where(label_paddings > 0, 0, labels).astype(np.int32)
    return logits, logit_paddings, labels, label_paddings, frame_lengths, label_lengths


def jax_runner(loss_fn, logits, logit_paddings, labels, label_paddings, device=None):
    fp, lab, lpad = (jax.device_put(jnp.asarray(a), device) for a in (logit_paddings, labels, label_paddings))
    fn = jax.jit(jax.value_and_grad(lambda x: jnp.sum(loss_fn(x, fp, lab, lpad))))
    x = jax.device_put(jnp.asarray(logits), device)

    def run():
        return jax.block_until_ready(fn(x))
    return run


def noop_runner(logits, device=None):
    fn = jax.jit(lambda x: x + 1.0)
    x = jax.device_put(jnp.asarray(logits), device)

    def run():
        return (jax.block_until_ready(fn(x)).sum(),)
    return run


def torch_runner(logits, labels, frame_lengths, label_lengths, device="cpu", cudnn=False):
    """log_softmax + ctc_loss + backward. cudnn=True: targets concatenated int32 on the CPU (the form torch
    hands to cuDNN where its conditions hold); else padded int64 targets on `device` (torch's own kernel)."""
    x = torch.tensor(logits, device=device)
    if cudnn:
        targets = torch.tensor(np.concatenate([labels[b, :n] for b, n in enumerate(label_lengths)]), dtype=torch.int32)
        in_lens = torch.tensor(frame_lengths, dtype=torch.int32)
        tgt_lens = torch.tensor(label_lengths, dtype=torch.int32)
    else:
        targets = torch.tensor(labels, dtype=torch.long, device=device)
        in_lens = torch.tensor(frame_lengths, dtype=torch.long, device=device)
        tgt_lens = torch.tensor(label_lengths, dtype=torch.long, device=device)
    sync = torch.cuda.synchronize if device != "cpu" else (lambda: None)

    def run():
        xs = x.detach().requires_grad_(True)
        with torch.backends.cudnn.flags(enabled=cudnn):
            lp = torch.log_softmax(xs, dim=-1).transpose(0, 1)
            loss = torch.nn.functional.ctc_loss(lp, targets, in_lens, tgt_lens, blank=0, reduction="sum",
                                                zero_infinity=False)
            loss.backward()
        sync()
        return loss.item(), xs.grad
    return run


def measure(runners, reps, min_seconds, burst_ms):
    """Median steady-call ms per implementation, and the number of rounds (see the protocol)."""
    names = list(runners)
    once = {}
    for name in names:
        runners[name]()
        runners[name]()
        start = time.perf_counter()
        runners[name]()
        once[name] = time.perf_counter() - start
    burst = {n: int(np.clip(burst_ms * 1e-3 / max(once[n], 1e-6), 1, 8)) for n in names}
    per_round = max(once[n] * (1 + burst[n]) for n in names if n != "noop")
    rounds = max(reps, min(MAX_REPS, int(min_seconds / max(per_round, 1e-6))))
    steady = {n: [] for n in names}
    shuffle = np.random.default_rng(0)
    for _ in range(rounds):
        for name in [names[i] for i in shuffle.permutation(len(names))]:
            for call in range(1 + burst[name]):
                start = time.perf_counter()
                runners[name]()
                if call:
                    steady[name].append(time.perf_counter() - start)
    return {n: statistics.median(steady[n]) * 1e3 for n in names}, rounds


def fmt_ratio(ratios, key):
    """'x.xx (shape, dist)' of the row with the smallest (key=min) or largest ratio."""
    row = key(ratios, key=lambda r: r[0])
    return f"{row[0]:.2f} ({row[1]}, {row[2]})"


def run_cpu(args):
    impls = ["jasr", "jasr auto", "optax"] + (["torch"] if torch is not None else []) + ["noop"]
    rows = []
    for shape in args.shapes:
        for dist in args.dists:
            logits, fp, labels, lpad, frame_lengths, label_lengths = make_inputs(shape, dist)
            print(f"[ctc bench] {shape} {dist}: frames {frame_lengths.min()}-{frame_lengths.max()}, labels "
                  f"{label_lengths.min()}-{label_lengths.max()}", flush=True)
            runners = {
                "jasr": jax_runner(lambda *a: ctc_nll(*a, implementation="xla"), logits, fp, labels, lpad),
                "jasr auto": jax_runner(lambda *a: ctc_nll(*a, method="auto", implementation="xla"),
                                        logits, fp, labels, lpad),
                "optax": jax_runner(optax.ctc_loss, logits, fp, labels, lpad)}
            if torch is not None:
                runners["torch"] = torch_runner(logits, labels, frame_lengths, label_lengths)
            runners["noop"] = noop_runner(logits)
            losses = {n: float(runners[n]()[0]) for n in impls if n != "noop"}
            med, rounds = measure(runners, args.reps, args.min_seconds, args.burst_ms)
            rows.append(dict(shape=shape, dist=dist, med=med, losses=losses, rounds=rounds))
            print("  ms: " + "  ".join(f"{n} {med[n]:.2f}" for n in impls) + "\n  sum-loss: "
                  + "  ".join(f"{n} {v:.3f}" for n, v in losses.items()), flush=True)
    return impls, rows


def cpu_report(args, impls, rows, load_before):
    has_torch = "torch" in impls
    lines = [
        "# CTC loss benchmark (CPU, forward + backward)",
        "",
        f"`python bench/ctc.py` — {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPU cores; jax {jax.__version__}, "
        f"optax {optax.__version__}" + (f", torch {torch.__version__} ({torch.get_num_threads()} threads)"
                                         if has_torch else ", no torch") + ".",
        "",
        f"Load: `{load_before}` before the run, `{uptime()}` after it (the machine is shared: treat the "
        "absolute times as noisy; the ratios come from interleaved calls of the same run).",
        "",
        "Protocol: see bench/ctc.py's docstring (frame lengths 60-100 % of T, label lengths 0-100 % of N with "
        "25 % repeated labels; distributions `normal` = N(0, 1) logits, `x3`, `x10` = scaled, `model` = a "
        "trained Conformer-CTC's log-probs on held-out FSDD speech). ms = median of the steady calls. "
        f"`jasr` = `fsa_ops.ctc.ctc_nll` (what `jasr.ctc_loss` runs) with its default method "
        f"'{default_method(32)}' (exact) on XLA; `auto` = method 'auto' (rescaled recursion, recomputed with "
        "'log' when its alpha/beta totals disagree); `noop` = a jitted `x + 1` on the logits. Ratios > 1: jasr is "
        "faster. `rel. diff` = |sum-loss(jasr) - sum-loss(torch)| / |torch| (float32 both)"
        + ("" if has_torch else " (n/a without torch)") + "; `auto diff` the same for 'auto'.",
        "",
        "| B, T, K, N | inputs | jasr ms | auto ms | optax ms | torch ms | optax / jasr | torch / jasr "
        "| noop ms | rel. diff | auto diff | rounds |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    optax_ratios, torch_ratios = [], []
    for r in rows:
        m, losses = r["med"], r["losses"]
        where = (", ".join(map(str, r["shape"])), r["dist"])
        optax_ratios.append((m["optax"] / m["jasr"],) + where)
        ref = losses.get("torch", float("nan"))
        if has_torch:
            torch_ratios.append((m["torch"] / m["jasr"],) + where)
        lines.append(
            f"| {where[0]} | {where[1]} | {m['jasr']:.2f} | {m['jasr auto']:.2f} | {m['optax']:.2f} "
            f"| {m.get('torch', float('nan')):.2f} | {m['optax'] / m['jasr']:.2f} "
            f"| {m.get('torch', float('nan')) / m['jasr']:.2f} | {m['noop']:.2f} "
            f"| {abs(losses['jasr'] - ref) / abs(ref):.1e} | {abs(losses['jasr auto'] - ref) / abs(ref):.1e} "
            f"| {r['rounds']} |")
    lines += ["", f"optax / jasr: least favourable {fmt_ratio(optax_ratios, min)}, best "
              f"{fmt_ratio(optax_ratios, max)}."]
    if torch_ratios:
        lines.append(f"torch / jasr: least favourable {fmt_ratio(torch_ratios, min)}, best "
                     f"{fmt_ratio(torch_ratios, max)}.")
    lines += ["", f"Run with OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}."]
    if args.note:
        lines += ["", args.note]
    if plot(rows, optax_ratios, torch_ratios, os.path.splitext(args.out or os.path.join(HERE, "results", "ctc.md"))[0]
            + ".png"):
        lines += ["", "![CTC forward+backward: speed-up of jasr over optax and torch per shape and input](ctc.png)"]
    return lines


def plot(rows, optax_ratios, torch_ratios, path) -> bool:
    """Bar chart of optax / jasr and torch / jasr per (shape, distribution); False without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(12, 4.5))
    xs = np.arange(len(rows))
    ax.bar(xs - 0.2, [r[0] for r in optax_ratios], 0.4, label="optax / jasr")
    if torch_ratios:
        ax.bar(xs + 0.2, [r[0] for r in torch_ratios], 0.4, label="torch / jasr")
    ax.axhline(2.0, color="k", lw=0.8, ls="--")
    ax.set_xticks(xs, [f"{','.join(map(str, r['shape']))}\n{r['dist']}" for r in rows], fontsize=6)
    ax.set_ylabel("time ratio (> 1: jasr faster)")
    ax.set_title("CTC loss forward+backward on CPU: peer time / jasr time (dashed: 2x)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True


def run_gpu(args):
    """The Pallas and XLA paths vs optax (GPU) and torch (cuDNN, native) at GPU_SHAPES."""
    device = jax.devices("gpu")[0]
    impls = ["jasr pallas", "jasr xla", "optax"]
    if torch is not None and torch.cuda.is_available():
        impls += ["torch cudnn", "torch native"]
    impls.append("noop")
    rows = []
    for shape in args.shapes:
        for dist in args.dists:
            logits, fp, labels, lpad, frame_lengths, label_lengths = make_inputs(shape, dist)
            runners = {
                "jasr pallas": jax_runner(lambda *a: ctc_nll(*a, implementation="pallas"), logits, fp, labels, lpad,
                                          device),
                "jasr xla": jax_runner(lambda *a: ctc_nll(*a, implementation="xla"), logits, fp, labels, lpad, device),
                "optax": jax_runner(optax.ctc_loss, logits, fp, labels, lpad, device)}
            if "torch cudnn" in impls:
                runners["torch cudnn"] = torch_runner(logits, labels, frame_lengths, label_lengths, "cuda", True)
                runners["torch native"] = torch_runner(logits, labels, frame_lengths, label_lengths, "cuda", False)
            runners["noop"] = noop_runner(logits, device)
            losses = {n: float(runners[n]()[0]) for n in impls if n != "noop"}
            med, rounds = measure(runners, args.reps, args.min_seconds, args.burst_ms)
            rows.append(dict(shape=shape, dist=dist, med=med, losses=losses, rounds=rounds))
            print(f"[ctc bench gpu] {shape} {dist}: " + "  ".join(f"{n} {med[n]:.2f}" for n in impls)
                  + "\n  sum-loss: " + "  ".join(f"{n} {v:.3f}" for n, v in losses.items()), flush=True)
    return impls, rows, device.device_kind


def gpu_report(args, impls, rows, gpu_name, load_before):
    cols = [n for n in impls if n != "noop"]
    lines = [
        f"# CTC loss benchmark (GPU: {gpu_name}, forward + backward)",
        "",
        f"`python bench/ctc.py --gpu` — {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; jax {jax.__version__}, "
        f"optax {optax.__version__}" + (f", torch {torch.__version__} (cuDNN {torch.backends.cudnn.version()})"
                                         if "torch cudnn" in impls else ", no CUDA torch") + ".",
        "",
        f"Load: `{load_before}` before, `{uptime()}` after. Protocol as the CPU tables (bench/ctc.py's docstring). "
        "`jasr pallas` = the frame loop as one Pallas (Triton) kernel (fsa_ops/pallas_ctc.py), `jasr xla` = the "
        "XLA loop; `torch cudnn` = targets concatenated int32 on the CPU (torch uses cuDNN where its conditions "
        "hold), `torch native` = padded int64 targets on the GPU. Ratios > 1: the Pallas path is faster.",
        "",
        "| B, T, K, N | inputs | " + " | ".join(f"{n} ms" for n in cols) + " | optax / pallas "
        + ("| torch cudnn / pallas | torch native / pallas " if "torch cudnn" in impls else "")
        + "| max rel. diff vs optax | rounds |",
        "| --- | --- | " + " | ".join("---:" for _ in cols) + " | ---: | "
        + ("---: | ---: | " if "torch cudnn" in impls else "") + "---: | ---: |",
    ]
    for r in rows:
        m, losses = r["med"], r["losses"]
        rel = max(abs(v - losses["optax"]) / abs(losses["optax"]) for v in losses.values())
        cells = [f"{m[n]:.2f}" for n in cols] + [f"{m['optax'] / m['jasr pallas']:.2f}"]
        if "torch cudnn" in impls:
            cells += [f"{m['torch cudnn'] / m['jasr pallas']:.2f}", f"{m['torch native'] / m['jasr pallas']:.2f}"]
        lines.append(f"| {', '.join(map(str, r['shape']))} | {r['dist']} | " + " | ".join(cells)
                     + f" | {rel:.1e} | {r['rounds']} |")
    if args.note:
        lines += ["", args.note]
    return lines


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpu", action="store_true", help="time the GPU paths (Pallas, XLA) at the GPU shapes")
    parser.add_argument("--reps", type=int, default=9, help="minimum rounds per (shape, distribution)")
    parser.add_argument("--min-seconds", type=float, default=1.0,
                        help="more rounds (up to %d) until each implementation ran about this long" % MAX_REPS)
    parser.add_argument("--burst-ms", type=float, default=3.0, help="steady calls per turn: about this long, 1 to 8")
    parser.add_argument("--shapes", nargs="*", default=None, help="B,T,K,N entries")
    parser.add_argument("--dists", default=",".join(DISTS), help="comma-separated subset of " + ",".join(DISTS))
    parser.add_argument("--out", default=None, help="results file (default: bench/results/ctc.md, or "
                        "bench/results/ctc_gpu_<gpu>.md with --gpu)")
    parser.add_argument("--note", default="", help="extra line for the report")
    args = parser.parse_args()
    args.dists = [d for d in args.dists.split(",") if d]
    if any(d not in DISTS for d in args.dists):
        parser.error(f"--dists: choose from {DISTS}")
    default_shapes = GPU_SHAPES if args.gpu else SHAPES
    args.shapes = [tuple(int(v) for v in s.split(",")) for s in args.shapes] if args.shapes else default_shapes
    load_before = uptime()
    if args.gpu:
        impls, rows, gpu_name = run_gpu(args)
        lines = gpu_report(args, impls, rows, gpu_name, load_before)
        slug = re.sub(r"[^a-z0-9]+", "_", gpu_name.lower()).strip("_")
        out = args.out or os.path.join(HERE, "results", f"ctc_gpu_{slug}.md")
    else:
        impls, rows = run_cpu(args)
        lines = cpu_report(args, impls, rows, load_before)
        out = args.out or os.path.join(HERE, "results", "ctc.md")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"[ctc bench] wrote {out}")


if __name__ == "__main__":
    main()
