"""Benchmark: dense intersection total score, forward + backward (fsa_ops.dense / graph_ctc), on CPU or GPU.

CPU (default): per shape, for every input distribution,

1. CTC graphs (``ctc_graph(labels)``, one per sequence): ``fsa_ops.graph_ctc.ctc_loss`` (k2's usage: the user's
   log_softmax, then the graph loss; output_beam=inf and k2's default 10) next to the dedicated CTC path
   ``fsa_ops.ctc.ctc_nll`` (what ``jasr.ctc_loss`` wraps, default method) and ``optax.ctc_loss``, same data;
2. LF-MMI-style denominator graphs shared by the batch, on the same log-probs: a phone-bigram-like graph
   (`phone_bigram_graph`: a state per last phone, self loops, its most likely successors, a blank backoff state
   and unigram arcs out of it; state-labelled) and a random phone-loop graph (`den_graph`: random labels, not
   state-labelled: the general arc path).

Inputs as bench/ctc.py draws them: N(0, 1) logits scaled x1, x3, x10 with random labels (frame lengths 60-100 % of
T, label lengths 0-100 % of N, the first row full, about a third of the labels a repeat of the previous one), and a
trained network's log-probs with their transcripts (`model_batch`, from bench/data/fsdd_ctc_logprobs.npz or
``--logits FILE``; without such a file, generated "trained-like" logits on the random labels,
`trained_like_logits`).  Times are medians of ``--reps`` rounds of one jitted loss+gradient call
(``block_until_ready``); in each round the rows of a group are called in turn (so load changes hit every row alike);
compile time separate.

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
INTERPRET_SHAPES = [(2, 40, 20, 6)]
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


MODEL_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "fsdd_ctc_logprobs.npz")


def model_batch(path, rng, batch, frames, classes, max_labels, frame_lengths):
    """Rows of a trained network's log-probs with their transcripts, from an .npz holding ``logprobs``
    [sum of frames, K'] (blank 0), ``frame_lengths``, ``labels`` (concatenated) and ``label_lengths`` per utterance
    (bench/data/fsdd_ctc_logprobs.npz: configs/fsdd.py's Conformer-CTC on its held-out speaker).  Row b takes whole
    consecutive utterances from a random one on, while they fit its drawn frame length and `max_labels` labels.
    The K' model classes go to `classes` by a random injective map per row (blank stays 0); each other class
    repeats a character's column lowered by log((classes - K') / (K' - 1)), so the extra classes share a
    character's mass instead of none.  Returns (logits, labels, label_lengths, frame_lengths)."""
    data = np.load(path)
    lp = data["logprobs"].astype(np.float32)
    fr = np.concatenate([[0], np.cumsum(data["frame_lengths"])])
    lb = np.concatenate([[0], np.cumsum(data["label_lengths"])])
    n_utt, K = len(data["frame_lengths"]), lp.shape[1]
    x = np.zeros((batch, frames, classes), np.float32)
    labels = np.zeros((batch, max_labels), np.int32)
    ll, fl = np.zeros(batch, np.int64), np.zeros(batch, np.int64)
    lower = np.log(max(1.0, (classes - K) / (K - 1)))
    for b in range(batch):
        u = int(rng.integers(n_utt))
        seg, lab = [], []
        for _ in range(n_utt):
            f_u, l_u = lp[fr[u]:fr[u + 1]], data["labels"][lb[u]:lb[u + 1]]
            if sum(map(len, seg)) + len(f_u) > frame_lengths[b] or sum(map(len, lab)) + len(l_u) > max_labels:
                break
            seg.append(f_u)
            lab.append(l_u)
            u = (u + 1) % n_utt
        if not seg:            # no utterance fits: a row of blank frames with no labels
            seg = [np.where(np.arange(K)[None] == 0, 0.0, -30.0).repeat(max(int(frame_lengths[b]), 1), 0)]
        row_lp = np.concatenate(seg)
        ids = np.concatenate(lab).astype(np.int64) if lab else np.zeros(0, np.int64)
        to_c = np.zeros(K, np.int64)
        to_c[1:] = rng.choice(np.arange(1, classes), size=K - 1, replace=False)
        row = row_lp[:, 1 + np.arange(classes) % (K - 1)] - lower
        row[:, 0] = row_lp[:, 0]
        row[:, to_c[1:]] = row_lp[:, 1:]
        x[b, :len(row)] = row
        labels[b, :len(ids)] = to_c[ids]
        ll[b], fl[b] = len(ids), len(row)
    return x, labels, ll, fl


def make_inputs(shape, model_file=None, seed=0):
    """[(inputs {name: logits}, labels, label_lengths, frame_lengths)]: the N(0, 1) group (x1, x3, x10, one set of
    labels) and the trained-network group (its own transcripts: real log-probs from `model_file` when given, else
    `trained_like_logits` on the first group's labels)."""
    B, T, C, N = shape
    rng, labels, label_lengths, frame_lengths = draw_batch(B, T, C, N, seed)
    base = rng.normal(size=(B, T, C)).astype(np.float32)
    groups = [({"N(0,1)": base, "N(0,1) x3": base * 3, "N(0,1) x10": base * 10}, labels, label_lengths,
               frame_lengths)]
    if model_file and np.load(model_file)["logprobs"].shape[1] <= C:
        x, lab, ll, fl = model_batch(model_file, rng, B, T, C, N, frame_lengths)
        groups.append(({"trained model": x}, lab, ll, fl))
    else:
        groups.append(({"trained-like": trained_like_logits(rng, labels, label_lengths, frame_lengths, T, C)},
                       labels, label_lengths, frame_lengths))
    return [({k: jnp.asarray(v) for k, v in g[0].items()},) + g[1:] for g in groups]


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


DEN_REF = "optax.ctc_loss (denominator group)"


def table(shape, times, compile_s, row_names, input_names, ref_name, den_names=()):
    """Markdown: one row per computation, a column per input distribution (ms, and x ref_name's time)."""
    head = "| computation | " + " | ".join(input_names) + " | compile |"
    lines = [head, "|---" * (len(input_names) + 2) + "|"]
    for name in row_names:
        cells = []
        for iname in input_names:
            t = times[(name, iname)][0]
            ratio = ""
            ref_i = DEN_REF if name in den_names and (DEN_REF, iname) in times else ref_name
            if ref_name and (ref_i, iname) in times and name != ref_name:
                ratio = f" ({times[(ref_i, iname)][0] / t:.2f}x)"
            cells.append(f"{t * 1e3:.1f} ms{ratio}")
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {compile_s[name]:.1f} s |")
    return lines


def ratio_summary(times, input_names, num, den):
    """min / max over inputs of time(den) / time(num): how many times faster `num` is than `den`."""
    r = [times[(den, i)][0] / times[(num, i)][0] for i in input_names if (den, i) in times and (num, i) in times]
    return (min(r), max(r)) if r else None


def time_groups(groups, make_rows, reps, den_reps=None):
    """Times every group's rows on its inputs (the rows are built per group: its own labels and graphs); with
    den_reps, rows past the first `len(ctc)` rows (see `run_cpu`) run in a second alternation with optax.
    Returns (times, compile s of the first group, [row names], {row name: fn} of the last group per input)."""
    times, comp, names, fns = {}, {}, None, {}
    for inputs, labels, ll, fl in groups:
        ctc_rows, den_rows = make_rows(labels, ll, fl)
        t, c = time_rows(ctc_rows, inputs, reps)
        times.update(t)
        comp = comp or c
        if den_rows:
            opt = [r for r in ctc_rows if r[0] == "optax.ctc_loss"]
            t2, c2 = time_rows(den_rows + opt, inputs, den_reps)
            times.update({k: v for k, v in t2.items() if k[0] != "optax.ctc_loss" or not opt})
            times.update({(DEN_REF, k[1]): v for k, v in t2.items()
                          if k[0] == "optax.ctc_loss"})
            comp.update({k: v for k, v in c2.items() if k not in comp})
        names = names or [n for n, _ in ctc_rows + den_rows]
        for iname in inputs:
            fns[iname] = dict(ctc_rows + den_rows)
    return times, comp, names, fns


def run_cpu(args):
    shapes = [tuple(int(v) for v in s.split(",")) for s in args.shapes] if args.shapes else CPU_SHAPES
    lines = ["# fsa_ops dense intersection benchmark (CPU)", "", machine_line() + ".", "",
             "Loss + gradient w.r.t. the logits, one jitted call; median of "
             f"{args.reps} rounds per input (denominator rows: {max(3, args.reps // 2)}, alternating with optax "
             "again) after a compile call and a warm call, the rows called in turn each round. Cells: wall time per "
             "call and, in brackets, optax.ctc_loss's time over this row's (> 1: faster than optax). Inputs: N(0, 1) "
             "logits x1, x3, x10 (random labels) and "
             + (f"a trained network's log-probs with their transcripts (`{os.path.relpath(args.logits)}`, "
                "`model_batch`)" if args.logits else
                "trained-like logits (generated: `trained_like_logits`; no saved log-probs were available)")
             + "; frame lengths 60-100 % of T, label lengths 0-100 % of N, ~1/3 repeated labels.", ""]
    summary = []
    ref = "optax.ctc_loss" if optax is not None else None
    for shape in shapes:
        B, T, C, N = shape
        print(f"shape B={B} T={T} C={C} N={N}", flush=True)
        groups = make_inputs(shape, args.logits)

        def make_rows(labels, ll, fl):
            rows = graph_rows(labels, ll, fl, C)
            return rows[:2] + ctc_reference_rows(labels, ll, fl, T, C), rows[2:]
        times, comp, row_names, fns = time_groups(groups, make_rows, args.reps, max(3, args.reps // 2))
        inputs = {k: v for g in groups for k, v in g[0].items()}
        names = list(inputs)
        lines += [f"## B={B}, T={T}, C={C}, N={N}", ""]
        lines += table(shape, times, comp, row_names, names, ref, den_names=row_names[-4:])
        ctc_names = [n for n in row_names[:len(row_names) - 4] if "beam=10" not in n]
        lines += ["", "Sum of the losses (the same numbers from every CTC row): " + "; ".join(
            f"{iname}: " + " / ".join(f"{float(fns[iname][n](x)[0]):.6g}" for n in ctc_names)
            for iname, x in inputs.items()) + " (graph exact / dedicated" + (" / optax)" if ref else ")"), ""]
        g, dedicated = row_names[0], row_names[2]
        parts = []
        if ref:
            lo, hi = ratio_summary(times, names, g, ref)
            parts.append(f"graph ctc_loss (exact) {lo:.2f}-{hi:.2f}x optax's speed")
        lo, hi = ratio_summary(times, names, g, dedicated)      # dedicated's time / graph's time
        parts.append(f"{1 / hi:.2f}-{1 / lo:.2f}x the dedicated CTC path's time")
        for dname in row_names[-4:]:
            if ref and dname.endswith("output_beam=inf"):
                lo, hi = ratio_summary(times, names, dname, DEN_REF)
                parts.append(f"{dname.split(' (')[0]} (exact) {1 / hi:.1f}-{1 / lo:.1f}x optax's CTC time")
        summary.append(f"({B}, {T}, {C}, {N}): " + "; ".join(parts))
    lines += ["Summary (least favourable input - most favourable, over the inputs above):", ""]
    lines += [f"- {s}" for s in summary]
    lines += ["", "The denominator rows take the XLA loops on CPU (`implementation='auto'`); the phone-bigram graph is "
              "state-labelled (per-state emissions, occupancy gradients), the random phone-loop graph takes the "
              "general arc path; their ratios are to optax timed in the same alternation.  Reproduce: "
              "`python bench/fsa.py --out bench/results/fsa.md`.", ""]
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
        groups = make_inputs(shape, args.logits)

        def make_rows(labels, ll, fl):
            xla = graph_rows(labels, ll, fl, C, "xla")
            pallas = graph_rows(labels, ll, fl, C, "pallas")
            refs = ctc_reference_rows(labels, ll, fl, T, C) + ([] if interpret else torch_rows(labels, ll, fl))
            return [r for pair in zip(pallas, xla) for r in pair] + refs, []
        times, comp, row_names, fns = time_groups(groups, make_rows, args.reps)
        inputs = {k: v for g in groups for k, v in g[0].items()}
        lines += [f"## B={B}, T={T}, C={C}, N={N}", "", "| computation | " + " | ".join(inputs) + " | compile |",
                  "|---" * (len(inputs) + 2) + "|"]
        for rname in row_names:
            cells = []
            for iname in inputs:
                t = times[(rname, iname)][0]
                peer = rname.replace(", pallas", ", xla")
                ratio = f" ({times[(peer, iname)][0] / t:.2f}x)" if peer != rname else ""
                cells.append(f"{t * 1e3:.2f} ms{ratio}")
            lines.append(f"| {rname} | " + " | ".join(cells) + f" | {comp[rname]:.1f} s |")
        for rname in row_names:                 # the same numbers (loss) from both paths
            if not rname.endswith(", pallas"):
                continue
            for iname, v in inputs.items():
                lp_ = float(fns[iname][rname](v)[0])
                lx = float(fns[iname][rname.replace(", pallas", ", xla")](v)[0])
                if not math.isclose(lp_, lx, rel_tol=1e-5, abs_tol=1e-3):
                    lines.append(f"\nMISMATCH {rname} on {iname}: pallas {lp_} vs xla {lx}")
        lines.append("")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="*", default=None, help="B,T,C,N entries")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--logits", default=None, help="a trained network's log-probs (.npz, see `model_batch`; "
                    "default: bench/data/fsdd_ctc_logprobs.npz when present)")
    ap.add_argument("--gpu", action="store_true", help="Pallas vs XLA on the GPU")
    ap.add_argument("--interpret", action="store_true", help="the --gpu rows in interpret mode on CPU (smoke test)")
    ap.add_argument("--out", default=None, help="write the markdown report here")
    args = ap.parse_args()
    if args.logits is None and os.path.exists(MODEL_FILE):
        args.logits = MODEL_FILE
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
