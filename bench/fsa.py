"""Benchmark: dense intersection total score, forward + backward (fsa_ops.dense / graph_ctc), on CPU or GPU.

CPU (default): per shape, for every input distribution,

1. CTC graphs (``ctc_graph(labels)``, one per sequence): ``fsa_ops.graph_ctc.ctc_loss`` (k2's usage: the user's
   log_softmax, then the graph loss; output_beam=inf and k2's default 10) next to the dedicated CTC path
   ``fsa_ops.ctc.ctc_nll`` (what ``jasr.ctc_loss`` wraps, default method) and ``optax.ctc_loss``, same data;
2. LF-MMI-style denominator graphs shared by the batch, on the same log-probs: a phone-bigram-like graph
   (`phone_bigram_graph`: a state per last phone, self loops, its most likely successors, a blank backoff state
   and unigram arcs out of it; state-labelled) and a random phone-loop graph (`den_graph`: random labels, not
   state-labelled: the general arc path).

Inputs as bench/ctc.py draws them: N(0, 1) logits scaled x1, x3, x10, and "trained-like" logits (a network that
has learnt the task: each label peaks on a few frames in order, blank elsewhere, see `trained_like_logits`;
``--logits FILE.npz`` replaces them by a saved array of real logits, key ``logits`` or ``lp`` [N, T', C]); frame
lengths 60-100 % of T, label lengths 0-100 % of N (the first row full), about a third of the labels a repeat of the
previous one.  Times are medians of ``--reps`` rounds of one jitted loss+gradient call (``block_until_ready``); in
each round the rows of a group are called in turn (so load changes hit every row alike); compile time separate.

``--gpu``: the same graphs timed with ``implementation='pallas'`` against ``'xla'`` (and optax.ctc_loss; torch's CTC,
cuDNN and native, when torch with CUDA is importable) on the GPU, written with the GPU's name
(bench/results/fsa_gpu.md); exits with a message when JAX has no GPU.  ``--interpret``: the Pallas rows in
interpret mode on the CPU at tiny shapes (a smoke test of the ``--gpu`` code path; no timing worth reading).

Usage: ``python bench/fsa.py [--shapes 32,250,32,60 16,500,500,80] [--reps 5] [--out bench/results/fsa.md]``.
Imports jax, numpy and fsa_ops only (optax, torch and jasr when present).
"""
from __future__ import annotations

import argparse
import datetime
import math
import os
import platform
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from fsa_ops.ctc import ctc_nll, default_method  # noqa: E402
from fsa_ops.dense import DenseFsaVec, dense_tot_scores  # noqa: E402
from fsa_ops.fsa import Fsa  # noqa: E402
from fsa_ops.graph_ctc import ctc_loss  # noqa: E402
from fsa_ops.graphs import ctc_graph  # noqa: E402

try:
    import optax
except ImportError:          # a bare image: the optax rows are left out
    optax = None

CPU_SHAPES = [(32, 250, 32, 60), (16, 500, 500, 80)]
GPU_SHAPES = [(64, 500, 500, 100), (32, 1000, 5000, 200)]
INTERPRET_SHAPES = [(2, 12, 6, 3)]
DISTRIBUTIONS = ("N(0,1)", "N(0,1) x3", "N(0,1) x10", "trained-like")


def time_rows(named_fns, inputs, reps):
    """{(row, input name): (median wall s, median CPU s)} and {row: compile s}: each fn compiled on the first
    input, then `reps` rounds per input in which every fn is called once, in turn."""
    compile_s, out = {}, {}
    first = next(iter(inputs.values()))
    for name, fn in named_fns:
        t0 = time.perf_counter()
        jax.block_until_ready(fn(first))
        compile_s[name] = time.perf_counter() - t0
    for iname, x in inputs.items():
        for _, fn in named_fns:          # one warm call per input (new buffers)
            jax.block_until_ready(fn(x))
        walls = {name: [] for name, _ in named_fns}
        cpus = {name: [] for name, _ in named_fns}
        for _ in range(reps):
            for name, fn in named_fns:
                t0, c0 = time.perf_counter(), time.process_time()
                jax.block_until_ready(fn(x))
                walls[name].append(time.perf_counter() - t0)
                cpus[name].append(time.process_time() - c0)
        for name, _ in named_fns:
            out[(name, iname)] = (statistics.median(walls[name]), statistics.median(cpus[name]))
            print(f"  {iname:>12} | {name}: {out[(name, iname)][0] * 1e3:.2f} ms", flush=True)
    return out, compile_s


# ---------------------------------------------------------------------------------------------------------------
# inputs
# ---------------------------------------------------------------------------------------------------------------


def draw_batch(batch, frames, classes, max_labels, seed=0):
    """Labels (with repeats), label and frame lengths as bench/ctc.py's distributions describe."""
    rng = np.random.default_rng(seed)
    frame_lengths = rng.integers(int(0.6 * frames), frames + 1, size=batch)
    frame_lengths[0] = frames
    label_lengths = rng.integers(0, max_labels + 1, size=batch)
    label_lengths[0] = max_labels
    labels = rng.integers(1, classes, size=(batch, max_labels)).astype(np.int32)
    repeat = rng.random(size=(batch, max_labels)) < 1 / 3
    for n in range(1, max_labels):
        labels[:, n] = np.where(repeat[:, n], labels[:, n - 1], labels[:, n])
    return rng, labels, label_lengths, frame_lengths


def trained_like_logits(rng, labels, label_lengths, frame_lengths, frames, classes):
    """Logits of a network that has learnt the transcripts: each label peaks (+6 over N(0, 1)) on 1-3 frames at
    increasing positions, a repeated label with a blank frame between, blank (+8) on the other frames and past
    the sequence's end; 10 % of label frames give a confusable second label."""
    B = len(labels)
    x = rng.normal(size=(B, frames, classes)).astype(np.float32)
    x[:, :, 0] += 8.0
    for b in range(B):
        L, Tb = int(label_lengths[b]), int(frame_lengths[b])
        if L == 0:
            continue
        starts = np.sort(rng.choice(np.arange(0, Tb - 2, 2), size=L, replace=False)) if L <= (Tb - 2) // 2 \
            else np.arange(L) * 2
        for n in range(L):
            lab = labels[b, n]
            for t in range(starts[n], min(starts[n] + rng.integers(1, 3), Tb)):
                x[b, t, 0] -= 5.0
                x[b, t, lab] += 6.0 + rng.normal()
                if rng.random() < 0.1:
                    x[b, t, rng.integers(1, classes)] += 5.5
    return x


def load_logits(path, batch, frames, classes):
    """Real logits from an .npz (key 'logits' or 'lp'), tiled/cut to [batch, frames, classes]; None if unusable."""
    data = np.load(path)
    key = "logits" if "logits" in data else "lp" if "lp" in data else None
    if key is None or data[key].ndim != 3 or data[key].shape[2] != classes:
        return None
    x = data[key].astype(np.float32)
    reps = (-(-batch // x.shape[0]), -(-frames // x.shape[1]), 1)
    return np.tile(x, reps)[:batch, :frames]


def make_inputs(shape, logits_file=None, seed=0):
    B, T, C, N = shape
    rng, labels, label_lengths, frame_lengths = draw_batch(B, T, C, N, seed)
    base = rng.normal(size=(B, T, C)).astype(np.float32)
    inputs = {"N(0,1)": base, "N(0,1) x3": base * 3, "N(0,1) x10": base * 10}
    real = load_logits(logits_file, B, T, C) if logits_file else None
    if real is not None:
        inputs["real logits"] = real
    else:
        inputs["trained-like"] = trained_like_logits(rng, labels, label_lengths, frame_lengths, T, C)
    return {k: jnp.asarray(v) for k, v in inputs.items()}, labels, label_lengths, frame_lengths


# ---------------------------------------------------------------------------------------------------------------
# graphs
# ---------------------------------------------------------------------------------------------------------------


def den_graph(num_states: int, arcs_per_state: int, num_symbols: int, seed: int = 0) -> Fsa:
    """Random phone-loop-like denominator graph: every state has `arcs_per_state` arcs to random
    states (self loops included) with random labels/scores, and an arc to the final state."""
    rng = np.random.default_rng(seed)
    S = num_states
    src = np.repeat(np.arange(S), arcs_per_state)
    dst = rng.integers(0, S, size=src.size)
    lab = rng.integers(1, num_symbols, size=src.size)
    sc = rng.normal(size=src.size).astype(np.float32) * 0.5
    src = np.concatenate([src, np.arange(S)])
    dst = np.concatenate([dst, np.full(S, S)])
    lab = np.concatenate([lab, np.full(S, -1)])
    sc = np.concatenate([sc, np.zeros(S, np.float32)])
    return Fsa.from_arcs(src, dst, lab, sc, num_states=S + 1)


def phone_bigram_graph(num_symbols: int, successors: int = 16, seed: int = 0) -> Fsa:
    """LF-MMI-style denominator: a pruned phone bigram over phones 1..C-1.  State 0 is the blank / backoff state
    (blank self loop, an arc to every phone with its unigram log-prob), state p the last phone p (self loop, arcs to
    its `successors` most likely next phones, a blank arc back to 0); every state may end.  All arcs into a state
    carry its label (state-labelled)."""
    rng = np.random.default_rng(seed)
    P = num_symbols - 1
    uni = np.log(rng.dirichlet(np.ones(P))).astype(np.float32)
    rows = [(0, 0, 0, np.log(0.5))] + [(0, p, p, uni[p - 1]) for p in range(1, P + 1)]
    for p in range(1, P + 1):
        nxt = rng.choice(np.arange(1, P + 1), size=min(successors, P), replace=False)
        probs = np.log(rng.dirichlet(np.ones(len(nxt) + 2)))
        rows.append((p, p, p, probs[0]))
        rows.append((p, 0, 0, probs[1]))
        rows += [(p, int(q), int(q), probs[i + 2]) for i, q in enumerate(nxt) if q != p]
    S = P + 1
    rows += [(s, S, -1, 0.0) for s in range(S)]
    arr = np.array(rows, dtype=np.float64)
    return Fsa.from_arcs(arr[:, 0].astype(np.int32), arr[:, 1].astype(np.int32), arr[:, 2].astype(np.int32),
                         arr[:, 3].astype(np.float32), num_states=S + 1)


# ---------------------------------------------------------------------------------------------------------------
# rows
# ---------------------------------------------------------------------------------------------------------------


def graph_rows(labels, label_lengths, frame_lengths, classes, implementation=None):
    """[(name, fn(logits) -> (loss, grad))] of the CTC-graph and denominator rows."""
    B = len(labels)
    segs = np.stack([np.arange(B), np.zeros(B, int), frame_lengths], 1).astype(np.int32)
    graphs = ctc_graph([list(labels[b, :label_lengths[b]]) for b in range(B)])
    rows = []
    beams = (math.inf, 10.0)
    if implementation is None:
        for beam in beams:
            def f(x, beam=beam):
                return ctc_loss(graphs, DenseFsaVec(jax.nn.log_softmax(x), segs), output_beam=beam, reduction="sum",
                                use_double_scores=False)
            rows.append((f"graph ctc_loss (ctc_graph), output_beam={beam}", jax.jit(jax.value_and_grad(f))))
    else:
        for beam in beams:
            def f(x, beam=beam):
                return -jnp.sum(dense_tot_scores(graphs, DenseFsaVec(jax.nn.log_softmax(x), segs), output_beam=beam,
                                                 use_double_scores=False, implementation=implementation))
            rows.append((f"ctc_graph, output_beam={beam}, {implementation}", jax.jit(jax.value_and_grad(f))))
    dens = [("phone-bigram denominator", phone_bigram_graph(classes)),
            ("random phone-loop denominator", den_graph(2000, 4, classes))]
    for dname, den in dens:
        for beam in beams:
            def fden(x, den=den, beam=beam):
                return -jnp.sum(dense_tot_scores(den, DenseFsaVec(jax.nn.log_softmax(x), segs), output_beam=beam,
                                                 use_double_scores=False,
                                                 implementation=implementation or "auto"))
            suffix = f", {implementation}" if implementation else ""
            rows.append((f"{dname} ({int(den.num_arcs)} arcs, {int(den.num_states)} states), output_beam={beam}"
                         f"{suffix}", jax.jit(jax.value_and_grad(fden))))
    return rows


def ctc_reference_rows(labels, label_lengths, frame_lengths, frames, classes):
    B, N = labels.shape
    lpad = jnp.asarray((np.arange(N)[None] >= label_lengths[:, None]).astype(np.float32))
    tpad_np = (np.arange(frames)[None] >= frame_lengths[:, None]).astype(np.float32)
    lab = jnp.asarray(labels)

    def tpad(x):
        return jnp.asarray(tpad_np)

    rows = []

    def dedicated(x):
        return jnp.sum(ctc_nll(x, tpad(x), lab, lpad))
    rows.append((f"fsa_ops.ctc.ctc_nll (dedicated CTC, method={default_method(classes)!r})",
                 jax.jit(jax.value_and_grad(dedicated))))
    if optax is not None:
        def ref_optax(x):
            return jnp.sum(optax.ctc_loss(x, tpad(x), lab, lpad))
        rows.append(("optax.ctc_loss", jax.jit(jax.value_and_grad(ref_optax))))
    return rows


def torch_rows(labels, label_lengths, frame_lengths):
    """torch CTC on CUDA (cuDNN and native), or [] without torch+CUDA."""
    try:
        import torch
    except ImportError:
        return []
    if not torch.cuda.is_available():
        return []
    dev = torch.device("cuda")
    flat = np.concatenate([labels[b, :label_lengths[b]] for b in range(len(labels))]).astype(np.int64)
    rows = []
    on_device = {}           # each input copied to the GPU once, outside the timed calls

    def tensor(x):
        if id(x) not in on_device:
            on_device[id(x)] = (x, torch.from_numpy(np.asarray(x)).to(dev))
        return on_device[id(x)][1]

    for cudnn in (True, False):
        def run(x, cudnn=cudnn):
            xs = tensor(x).detach().requires_grad_(True)
            lp = torch.log_softmax(xs, -1).transpose(0, 1)
            with torch.backends.cudnn.flags(enabled=cudnn):
                if cudnn:       # cuDNN's kernel: int32 concatenated targets on the CPU, lengths on the CPU
                    loss = torch.nn.functional.ctc_loss(lp, torch.from_numpy(flat.astype(np.int32)),
                                                        tuple(int(v) for v in frame_lengths),
                                                        tuple(int(v) for v in label_lengths), reduction="sum",
                                                        zero_infinity=True)
                else:
                    loss = torch.nn.functional.ctc_loss(lp, torch.from_numpy(labels.astype(np.int64)).to(dev),
                                                        torch.from_numpy(frame_lengths).to(dev),
                                                        torch.from_numpy(label_lengths).to(dev), reduction="sum",
                                                        zero_infinity=True)
            loss.backward()
            torch.cuda.synchronize()
            return loss.item()
        rows.append((f"torch ctc_loss ({'cuDNN' if cudnn else 'native'})", run))
    return rows


# ---------------------------------------------------------------------------------------------------------------
# report
# ---------------------------------------------------------------------------------------------------------------


def machine_line():
    up = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    dev = jax.devices()[0]
    cpu = platform.processor() or platform.machine()
    now = datetime.datetime.now(datetime.timezone.utc)
    return (f"{now:%Y-%m-%d %H:%M} UTC; {cpu}, {os.cpu_count()} CPUs, jax {jax.__version__} on {dev.platform} "
            f"({getattr(dev, 'device_kind', dev.platform)}); `uptime` at start: {up}")


def table(shape, times, compile_s, row_names, input_names, ref_name):
    """Markdown: one row per computation, a column per input distribution (ms, and x ref_name's time)."""
    head = "| computation | " + " | ".join(input_names) + " | compile |"
    lines = [head, "|---" * (len(input_names) + 2) + "|"]
    for name in row_names:
        cells = []
        for iname in input_names:
            t = times[(name, iname)][0]
            ratio = ""
            if ref_name and (ref_name, iname) in times and name != ref_name:
                ratio = f" ({times[(ref_name, iname)][0] / t:.2f}x)"
            cells.append(f"{t * 1e3:.1f} ms{ratio}")
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {compile_s[name]:.1f} s |")
    return lines


def ratio_summary(times, input_names, num, den):
    """min / max over inputs of time(den) / time(num): how many times faster `num` is than `den`."""
    r = [times[(den, i)][0] / times[(num, i)][0] for i in input_names if (den, i) in times and (num, i) in times]
    return (min(r), max(r)) if r else None


def run_cpu(args):
    shapes = [tuple(int(v) for v in s.split(",")) for s in args.shapes] if args.shapes else CPU_SHAPES
    lines = ["# fsa_ops dense intersection benchmark (CPU)", "", machine_line() + ".", "",
             "Loss + gradient w.r.t. the logits, one jitted call; median of "
             f"{args.reps} rounds per input after a compile call and a warm call, the rows called in turn each round. "
             "Cells: wall time per call and, in brackets, optax.ctc_loss's time over this row's (> 1: faster than "
             "optax). Inputs: N(0, 1) logits x1, x3, x10 and "
             + ("real logits from " + args.logits if args.logits else
                "trained-like logits (generated: `trained_like_logits`; no saved real logits were available)")
             + "; frame lengths 60-100 % of T, label lengths 0-100 % of N, ~1/3 repeated labels.", ""]
    summary = []
    for shape in shapes:
        B, T, C, N = shape
        print(f"shape B={B} T={T} C={C} N={N}", flush=True)
        inputs, labels, ll, fl = make_inputs(shape, args.logits)
        ctc_rows = graph_rows(labels, ll, fl, C)
        den_rows, ctc_rows = ctc_rows[2:], ctc_rows[:2] + ctc_reference_rows(labels, ll, fl, T, C)
        times, comp = time_rows(ctc_rows, inputs, args.reps)
        t2, c2 = time_rows(den_rows + [r for r in ctc_rows if r[0] == "optax.ctc_loss"], inputs,
                           max(3, args.reps // 2))
        times.update({k: v for k, v in t2.items() if k[0] != "optax.ctc_loss"})
        comp.update({k: v for k, v in c2.items() if k != "optax.ctc_loss"})
        names = list(inputs)
        ref = "optax.ctc_loss" if optax is not None else None
        lines += [f"## B={B}, T={T}, C={C}, N={N}", ""]
        lines += table(shape, times, comp, [n for n, _ in ctc_rows] + [n for n, _ in den_rows], names, ref)
        lines += ["", "Sum of the losses (the same numbers from every CTC row): " + "; ".join(
            f"{iname}: " + " / ".join(f"{float(fn(x)[0]):.6g}" for rname, fn in ctc_rows if "beam=10" not in rname)
            for iname, x in inputs.items()) + " (graph exact / dedicated" + (" / optax)" if ref else ")"), ""]
        g, dedicated = ctc_rows[0][0], ctc_rows[2][0]
        parts = []
        if ref:
            lo, hi = ratio_summary(times, names, g, ref)
            parts.append(f"graph ctc_loss (exact) {lo:.2f}-{hi:.2f}x optax's speed")
        lo, hi = ratio_summary(times, names, g, dedicated)      # dedicated's time / graph's time
        parts.append(f"{1 / hi:.2f}-{1 / lo:.2f}x the dedicated CTC path's time")
        for dname, _ in den_rows:
            if ref and dname.endswith("output_beam=inf"):
                lo, hi = ratio_summary(times, names, dname, ref)
                parts.append(f"{dname.split(' (')[0]} (exact) {1 / hi:.1f}-{1 / lo:.1f}x optax's CTC time")
        summary.append(f"({B}, {T}, {C}, {N}): " + "; ".join(parts))
    lines += ["Summary (least favourable input - most favourable, over the inputs above):", ""]
    lines += [f"- {s}" for s in summary]
    lines += ["", "The denominator rows take the XLA loops on CPU (`implementation='auto'`); the phone-bigram graph is "
              "state-labelled (per-state emissions, occupancy gradients), the random phone-loop graph takes the "
              "general arc path.  Reproduce: `python bench/fsa.py --out bench/results/fsa.md`.", ""]
    return "\n".join(lines)


def run_pallas(args, interpret):
    if not interpret and jax.default_backend() != "gpu":
        sys.exit("bench/fsa.py --gpu: JAX sees no GPU (default backend: "
                 f"{jax.default_backend()}); run it on a machine with a CUDA jax, or --interpret for a CPU smoke test")
    if args.shapes:
        shapes = [tuple(int(v) for v in s.split(",")) for s in args.shapes]
    else:
        shapes = INTERPRET_SHAPES if interpret else GPU_SHAPES
    dev = jax.devices()[0]
    name = getattr(dev, "device_kind", dev.platform)
    lines = [f"# fsa_ops dense intersection: Pallas kernels vs XLA loops on {name}", "", machine_line() + ".", "",
             "Loss + gradient w.r.t. the logits (dense_tot_scores over ctc_graph and the denominator graphs, "
             f"implementation='pallas' vs 'xla'), median of {args.reps} rounds; cells: time and, in brackets, the "
             "XLA path's time over the row's." + (" INTERPRET MODE ON CPU: a smoke test, not a timing." if interpret
                                                   else ""), ""]
    for shape in shapes:
        B, T, C, N = shape
        print(f"shape B={B} T={T} C={C} N={N} on {name}", flush=True)
        inputs, labels, ll, fl = make_inputs(shape, args.logits)
        xla = graph_rows(labels, ll, fl, C, "xla")
        pallas = graph_rows(labels, ll, fl, C, "pallas")
        refs = ctc_reference_rows(labels, ll, fl, T, C) + ([] if interpret else torch_rows(labels, ll, fl))
        rows = [r for pair in zip(pallas, xla) for r in pair] + refs
        times, comp = time_rows(rows, inputs, args.reps)
        lines += [f"## B={B}, T={T}, C={C}, N={N}", "", "| computation | " + " | ".join(inputs) + " | compile |",
                  "|---" * (len(inputs) + 2) + "|"]
        for rname, _ in rows:
            cells = []
            for iname in inputs:
                t = times[(rname, iname)][0]
                peer = rname.replace(", pallas", ", xla")
                ratio = f" ({times[(peer, iname)][0] / t:.2f}x)" if peer != rname else ""
                cells.append(f"{t * 1e3:.2f} ms{ratio}")
            lines.append(f"| {rname} | " + " | ".join(cells) + f" | {comp[rname]:.1f} s |")
        for p, x in zip(pallas, xla):          # the same numbers (loss) from both paths
            for iname, v in inputs.items():
                lp_, lx = float(p[1](v)[0]), float(x[1](v)[0])
                if not math.isclose(lp_, lx, rel_tol=1e-5, abs_tol=1e-3):
                    lines.append(f"\nMISMATCH {p[0]} on {iname}: pallas {lp_} vs xla {lx}")
        lines.append("")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="*", default=None, help="B,T,C,N entries")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--logits", default=None, help=".npz of real logits (key 'logits' or 'lp', [N, T, C])")
    ap.add_argument("--gpu", action="store_true", help="Pallas vs XLA on the GPU")
    ap.add_argument("--interpret", action="store_true", help="the --gpu rows in interpret mode on CPU (smoke test)")
    ap.add_argument("--out", default=None, help="write the markdown report here")
    args = ap.parse_args()
    if args.logits is None:
        default = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "logits.npz")
        args.logits = default if os.path.exists(default) else None
    if args.gpu or args.interpret:
        text = run_pallas(args, interpret=args.interpret and not args.gpu)
        if args.gpu and args.out is None:
            args.out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "fsa_gpu.md")
    else:
        text = run_cpu(args)
    print(text)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as fh:
            fh.write(text)
        import collect_results  # noqa: E402  (bench/, next to this script)
        collect_results.refresh_after(args.out)


if __name__ == "__main__":
    main()
