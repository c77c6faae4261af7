"""CTC prefix beam search with a word n-gram LM: jasr.ctc_prefix_beam_search vs pyctcdecode (+ kenlm), same logits,
same ARPA file, one run.

    python bench/decode.py [--venv /tmp/bench-venv] [--batch 32] [--beam 16] [--out bench/results/decode.md]

pyctcdecode and kenlm live in their own virtual environment (--venv; `python3 -m venv /tmp/bench-venv &&
/tmp/bench-venv/bin/pip install pyctcdecode kenlm`); this script runs itself there as a worker (`--worker`) for
the pyctcdecode side, so only numpy and the standard library are imported at the top, and jax / jasr only on the
jasr side.

Data (synthetic, seeded): sentences from a random word Markov chain over the words of the shared LJSpeech and
LibriVox transcripts; a trigram ARPA LM (absolute discounting with backoff) estimated from 3000 such sentences;
32 longer sentences (12-24 words) from the same chain turned into peaky character-CTC log-probs shaped like a
trained model's (mostly blank, one to three frames per character, 10 % confusable frames where another character
competes), 40 ms frames, T ~ 200-500.

Scores: every decoder's best hypothesis is re-scored with one objective, acoustic (exact CTC log-likelihood of the
text, float64 forward algorithm) + alpha * ln P_LM(text, with <s> and </s>, kenlm) + beta * words + OOV offset
(pyctcdecode's: alpha * unk_score_offset * ln 10 per out-of-vocabulary word), so the higher objective is the
better search result. jasr reads the same ARPA with jasr.ngram.read_arpa (NgramLM, checked against kenlm here) and
fuses it at word level with the ARPA's unigrams as its lexicon (not constrained).
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LN10 = math.log(10.0)
ORDER = 3
CHARS = [" ", "'"] + [chr(c) for c in range(ord("A"), ord("Z") + 1)]   # token id = index + 1; 0 = blank
FRAME_SHIFT = 0.04


# ----------------------------------------------------------------------------------------------- data and LM
def shared_words():
    words = set()
    for name in ("ljspeech_sample", "librivox_sense_sensibility"):
        with open(os.path.join(ROOT, "..", "shared", "data", name, "manifest.jsonl")) as f:
            for line in f:
                words.update(json.loads(line)["text"].split())
    return sorted(words)


def markov_sentences(words, n, rng_chain, rng, lo=6, hi=15):
    """n sentences of lo..hi-1 words from a random sparse word Markov chain (the chain is a function of rng_chain)."""
    succ = {w: rng_chain.choice(len(words), 4, replace=False) for w in words}
    probs = {w: rng_chain.dirichlet(np.ones(4)) for w in words}
    out = []
    for _ in range(n):
        w = words[rng.integers(len(words))]
        sent = [w]
        for _ in range(rng.integers(lo, hi) - 1):
            w = words[rng.integers(len(words))] if rng.random() < 0.1 else words[succ[w][rng.choice(4, p=probs[w])]]
            sent.append(w)
        out.append(" ".join(sent))
    return out


def write_arpa(sentences, path, discount=0.5):
    """Trigram backoff LM (absolute discounting, add-one unigrams with <unk>), log10, normalised."""
    counts = [Counter() for _ in range(ORDER + 1)]
    for s in sentences:
        toks = ["<s>"] + s.split() + ["</s>"]
        for n in range(1, ORDER + 1):
            for i in range(len(toks) - n + 1):
                if n == 1 and toks[i] == "<s>":
                    continue
                counts[n][tuple(toks[i:i + n])] += 1
    vocab = sorted({w for (w,) in counts[1]} | {"<unk>"})
    total = sum(counts[1].values())
    prob = {(w,): (counts[1][(w,)] + 1) / (total + len(vocab)) for w in vocab}
    prob[("<s>",)] = 0.0
    bow = {}

    def p(ng):   # backed-off probability (linear)
        if ng in prob and prob[ng] > 0:
            return prob[ng]
        if len(ng) == 1:
            return prob[("<unk>",)]
        return bow.get(ng[:-1], 1.0) * p(ng[1:])

    for n in range(2, ORDER + 1):
        by_hist = defaultdict(dict)
        for ng, c in counts[n].items():
            by_hist[ng[:-1]][ng[-1]] = c
        for h, nxt in by_hist.items():
            ch = sum(nxt.values())
            for w, c in nxt.items():
                prob[h + (w,)] = (c - discount) / ch
            left = discount * len(nxt) / ch
            lower = sum(p(h[1:] + (w,)) for w in nxt)
            bow[h] = left / max(1.0 - lower, 1e-12)
    with open(path, "w") as f:
        f.write("\\data\\\n")
        grams = [[ng for ng in prob if len(ng) == n] for n in range(1, ORDER + 1)]
        for n, g in enumerate(grams, 1):
            f.write(f"ngram {n}={len(g)}\n")
        for n, g in enumerate(grams, 1):
            f.write(f"\n\\{n}-grams:\n")
            for ng in sorted(g):
                lp = -99.0 if prob[ng] == 0 else math.log10(prob[ng])
                line = f"{lp:.6f}\t{' '.join(ng)}"
                if n < ORDER and ng in bow:
                    line += f"\t{math.log10(bow[ng]):.6f}"
                elif n < ORDER and ng[-1] != "</s>":
                    line += "\t0.0"
                f.write(line + "\n")
        f.write("\n\\end\\\n")


def read_arpa(path):
    """{ngram tuple: (log10 prob, log10 backoff)}."""
    grams = {}
    with open(path) as f:
        for line in f:
            parts = line.strip().split("\t")
            if len(parts) >= 2 and not line.startswith("ngram"):
                grams[tuple(parts[1].split())] = (float(parts[0]), float(parts[2]) if len(parts) > 2 else 0.0)
    return grams


def synth_logprobs(texts, rng):
    """Peaky character-CTC log-probs for each text: [B, T, V] float32 (padded with blank frames) and lengths."""
    V = len(CHARS) + 1
    utts = []
    for text in texts:
        ids = [CHARS.index(c) + 1 for c in text]
        frames = [0] * int(rng.integers(5, 15))
        for i, t in enumerate(ids):
            frames += [t] * int(rng.choice([1, 2, 3], p=[0.7, 0.25, 0.05]))
            gap = int(rng.integers(0, 5))
            if i + 1 < len(ids) and ids[i + 1] == t:
                gap = max(gap, 1)
            frames += [0] * gap
        frames += [0] * int(rng.integers(5, 15))
        utts.append(frames)
    T = max(len(f) for f in utts)
    logits = rng.normal(0, 1.0, (len(texts), T, V))
    for b, frames in enumerate(utts):
        for t, lab in enumerate(frames):
            if lab == 0:
                logits[b, t, 0] += 8.0 + rng.normal()
                if t + 1 < len(frames) and frames[t + 1]:
                    logits[b, t, frames[t + 1]] += 2.0      # the next character smears into the blank frame
            else:
                logits[b, t, lab] += 6.0 + rng.normal()
                logits[b, t, 0] += 3.0
                if rng.random() < 0.1:                      # a confusable frame: another character competes
                    other = int(rng.integers(1, V))
                    logits[b, t, other] = logits[b, t, lab] + rng.uniform(-2.0, 0.5)
        logits[b, len(frames):, 0] += 8.0
    lp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    return lp.astype(np.float32), np.array([len(f) for f in utts])


def ctc_log_likelihood(lp, text):
    """log P(text | lp) summed over all CTC alignments (float64 forward algorithm)."""
    lab = [CHARS.index(c) + 1 for c in text]
    ext = [0]
    for t in lab:
        ext += [t, 0]
    ext = np.array(ext)
    S = len(ext)
    lp = np.asarray(lp, np.float64)
    alpha = np.full(S, -np.inf)
    alpha[0] = lp[0, 0]
    if S > 1:
        alpha[1] = lp[0, ext[1]]
    skip = np.zeros(S, bool)
    skip[2:] = (ext[2:] != 0) & (ext[2:] != ext[:-2])
    for t in range(1, lp.shape[0]):
        a1 = np.concatenate([[-np.inf], alpha[:-1]])
        a2 = np.where(skip, np.concatenate([[-np.inf, -np.inf], alpha[:-2]]), -np.inf)
        alpha = np.logaddexp(np.logaddexp(alpha, a1), a2) + lp[t, ext]
    return float(np.logaddexp(alpha[-1], alpha[-2]) if S > 1 else alpha[-1])


def wer_counts(ref, hyp):
    r, h = ref.split(), hyp.split()
    d = np.arange(len(h) + 1)
    for i in range(1, len(r) + 1):
        prev, d[0] = d.copy(), i
        for j in range(1, len(h) + 1):
            d[j] = min(prev[j] + 1, d[j - 1] + 1, prev[j - 1] + (r[i - 1] != h[j - 1]))
    return int(d[-1]), len(r)


# ----------------------------------------------------------------------------------------------- decoders
def run_pyctcdecode(args):
    """Worker in the bench venv: pyctcdecode timings and texts, kenlm scores of the given texts."""
    import kenlm   # noqa: E402 the bench venv's packages, absent from jasr's environment
    from pyctcdecode import build_ctcdecoder
    data = np.load(args.data)
    lp, lengths = data["lp"], data["lengths"]
    with open(args.texts) as f:
        to_score = json.load(f)
    out = {}
    for name, arpa in (("nolm", None), ("lm", args.arpa)):
        dec = build_ctcdecoder([""] + CHARS, kenlm_model_path=arpa, alpha=args.alpha, beta=args.beta,
                               unk_score_offset=args.unk_offset)
        opts = dict(beam_width=args.beam, beam_prune_logp=-10.0, token_min_logp=-5.0)
        dec.decode_beams(lp[0, :lengths[0]], **opts)   # warm-up (builds caches)
        times, texts = [], None
        for _ in range(args.py_reps):
            start = time.perf_counter()
            beams = [dec.decode_beams(lp[b, :lengths[b]], **opts) for b in range(lp.shape[0])]
            times.append(time.perf_counter() - start)
            texts = [bm[0][0] for bm in beams]
        out[name] = {"seconds": times, "texts": texts}
    model = kenlm.Model(args.arpa)
    vocab = set(read_arpa(args.arpa)) - {("<s>",), ("</s>",), ("<unk>",)}
    all_texts = sorted({t for v in out.values() for t in v["texts"]} | set(to_score))
    out["kenlm"] = {t: [model.score(t, bos=True, eos=True) * LN10, sum((w,) not in vocab for w in t.split())]
                    for t in all_texts}
    with open(args.result, "w") as f:
        json.dump(out, f)


def run_jasr(lp, lengths, arpa, args):
    """jasr's side: (seconds per batch call [reps], compile s, {name: texts}, dense-LM scores of texts)."""
    import jax   # noqa: E402 imported here so that the worker in the bench venv never needs jax
    import jax.numpy as jnp
    from jasr.ctc_beam import ctc_prefix_beam_search, nbest_lists
    from jasr.lexicon import make_lexicon
    from jasr.ngram import read_arpa as jasr_read_arpa

    lm = jasr_read_arpa(arpa)
    words = [w for w in lm.vocab.words if w not in ("<s>", "</s>", "<unk>")]
    lex = make_lexicon([[CHARS.index(c) + 1 for c in w] for w in words], len(CHARS) + 1,
                       word_ids=lm.ids(words).tolist(), boundary_ids=[1], unk_id=lm.unk_id)
    pad = (np.arange(lp.shape[1])[None] >= lengths[:, None]).astype(np.float32)
    lpj, padj = jnp.asarray(lp), jnp.asarray(pad)
    oov = args.alpha * args.unk_offset * LN10
    configs = {"nolm": dict(), "lm": dict(lm=lm, lm_weight=args.alpha, lm_level="word", word_bonus=args.beta,
                                          lexicon=lex, oov_penalty=oov)}
    out = {}
    for name, kw in configs.items():
        for topk in args.topk:
            cap = None if topk == "auto" else int(topk)
            call = lambda: ctc_prefix_beam_search(lpj, padj, args.beam, nbest=1, token_topk=cap,  # noqa: E731
                                                  token_min_logp=-5.0, beam_prune_logp=-10.0, **kw)
            start_t = time.perf_counter()
            jax.block_until_ready(call())
            compile_s = time.perf_counter() - start_t
            times = []
            for _ in range(args.reps):
                start_t = time.perf_counter()
                res = jax.block_until_ready(call())
                times.append(time.perf_counter() - start_t)
            raw = ["".join(CHARS[t - 1] for t in h[0][0]) for h in nbest_lists(res)]
            out[f"{name}/{topk}"] = {"seconds": times, "compile": compile_s, "raw": raw,
                                     "texts": [" ".join(t.split()) for t in raw],
                                     "scores": np.asarray(res.scores[:, 0]).tolist()}

    out["jasr_lm"] = {t: lm.score_sentence(t) for k, v in list(out.items()) for t in v["texts"]}
    return out, jax.__version__


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--venv", default="/tmp/bench-venv")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--beam", type=int, default=16)
    ap.add_argument("--topk", default="8,auto", type=lambda v: v.split(","),
                    help="jasr's static caps on the tokens tried per frame, one row each ('auto': token_topk=None, "
                         "as many as the fullest frame has above token_min_logp)")
    ap.add_argument("--alpha", type=float, default=0.5)
    ap.add_argument("--beta", type=float, default=1.5)
    ap.add_argument("--unk-offset", type=float, default=-10.0)
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--py-reps", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "decode.md"))
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--data", help=argparse.SUPPRESS)
    ap.add_argument("--arpa", help=argparse.SUPPRESS)
    ap.add_argument("--texts", help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return run_pyctcdecode(args)
    sys.path.insert(0, ROOT)
    load_before = os.getloadavg()
    words = shared_words()
    rng = np.random.default_rng(args.seed)
    train = markov_sentences(words, 3000, np.random.default_rng(args.seed + 1), rng)
    test = markov_sentences(words, args.batch, np.random.default_rng(args.seed + 1), rng, 12, 25)
    lp, lengths = synth_logprobs(test, rng)
    with tempfile.TemporaryDirectory() as tmp:
        arpa = os.path.join(tmp, "lm.arpa")
        write_arpa(train, arpa)
        jasr_out, jax_version = run_jasr(lp, lengths, arpa, args)
        data, texts, result = (os.path.join(tmp, n) for n in ("data.npz", "texts.json", "result.json"))
        np.savez(data, lp=lp, lengths=lengths)
        with open(texts, "w") as f:
            json.dump(sorted({t for k, v in jasr_out.items() if k != "jasr_lm" for t in v["texts"]} | set(test)), f)
        subprocess.run([os.path.join(args.venv, "bin", "python"), os.path.abspath(__file__), "--worker", "--data",
                        data, "--arpa", arpa, "--texts", texts, "--result", result, "--beam", str(args.beam),
                        "--alpha", str(args.alpha), "--beta", str(args.beta), "--unk-offset", str(args.unk_offset),
                        "--py-reps", str(args.py_reps)], check=True)
        with open(result) as f:
            py_out = json.load(f)
        py_versions = subprocess.run([os.path.join(args.venv, "bin", "python"), "-c",
                                      "import importlib.metadata as m; print(m.version('pyctcdecode'), "
                                      "m.version('kenlm'))"], capture_output=True, text=True).stdout.split()
    load_after = os.getloadavg()
    kenlm_scores = py_out["kenlm"]
    lm_diff = max(abs(jasr_out["jasr_lm"][t] - kenlm_scores[t][0]) for t in jasr_out["jasr_lm"] if t)
    rows = []
    for key in (k for k in jasr_out if k != "jasr_lm"):
        name, topk = key.split("/")
        alpha, beta = (args.alpha, args.beta) if name == "lm" else (0.0, 0.0)
        oov = args.alpha * args.unk_offset * LN10 if name == "lm" else 0.0

        def objective(b, text, raw=None):
            lm_s, n_oov = kenlm_scores[" ".join(text.split())] if name == "lm" else (0.0, 0)
            return (ctc_log_likelihood(lp[b, :lengths[b]], text if raw is None else raw) + alpha * lm_s
                    + beta * len(text.split()) + oov * n_oov)
        jt, pt = jasr_out[key]["texts"], py_out[name]["texts"]
        obj_j = np.array([objective(b, t) for b, t in enumerate(jt)])
        obj_p = np.array([objective(b, t) for b, t in enumerate(pt)])
        obj_raw = np.array([objective(b, t, r) for b, (t, r) in enumerate(zip(jt, jasr_out[key]["raw"]))])
        err_j = np.sum([wer_counts(r, h) for r, h in zip(test, jt)], axis=0)
        err_p = np.sum([wer_counts(r, h) for r, h in zip(test, pt)], axis=0)
        own = np.abs(obj_raw - np.array(jasr_out[key]["scores"])).max()
        j_s, p_s = statistics.median(jasr_out[key]["seconds"]), statistics.median(py_out[name]["seconds"])
        fastest = min(py_out[name]["seconds"]) / min(jasr_out[key]["seconds"])
        speed = f"{p_s / j_s:.1f}x ({fastest:.1f}x)"
        cap = topk if topk == "auto" else "<= " + topk
        rows.append((name, cap, j_s, jasr_out[key]["compile"], p_s, speed, obj_j.mean(), obj_p.mean(),
                     int((obj_j > obj_p + 1e-3).sum()), int((np.abs(obj_j - obj_p) <= 1e-3).sum()),
                     int((obj_j < obj_p - 1e-3).sum()), err_j[0] / err_j[1], err_p[0] / err_p[1], own))
    write_report(args, rows, lengths, lp.shape, load_before, load_after, lm_diff, jax_version, py_versions)


def write_report(args, rows, lengths, shape, load_before, load_after, lm_diff, jax_version, py_versions):
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    audio_s = float(lengths.sum()) * FRAME_SHIFT
    lines = [
        "# CTC prefix beam search benchmark (CPU, word trigram LM)", "",
        f"`python bench/decode.py` — {now}; {platform.machine()}, {os.cpu_count()} CPU cores shared with other "
        f"jobs (load average {load_before[0]:.1f} before, {load_after[0]:.1f} after); jax {jax_version}, "
        f"pyctcdecode {(py_versions + ['?'])[0]}, kenlm {(py_versions + ['?', '?'])[1]}.",
        "",
        f"Batch {shape[0]} synthetic peaky character-CTC log-prob matrices (V = {shape[2]}, T = {lengths.min()}-"
        f"{lengths.max()} frames, padded to {shape[1]}; {audio_s:.0f} s of audio at {FRAME_SHIFT * 1000:.0f} ms "
        f"frames), beam {args.beam}, token_min_logp -5, beam_prune_logp -10 in both; jasr also caps the tokens "
        f"tried per frame (a static shape; auto: as many as the fullest frame of the batch has above "
        f"token_min_logp, rounded up to a power of two, which drops nothing that token_min_logp keeps). LM: trigram "
        f"ARPA from 3000 sentences; "
        f"alpha {args.alpha}, beta {args.beta}, OOV offset {args.unk_offset} (pyctcdecode's unk_score_offset). "
        f"jasr = one jitted `ctc_prefix_beam_search` call on the whole batch (median of {args.reps}, after "
        f"compiling); pyctcdecode = `decode_beams` on each utterance in turn, one process (median of "
        f"{args.py_reps} passes).", "",
        "| LM | jasr tokens / frame | jasr s / batch | jasr first call s | pyctcdecode s / batch | "
        "speed-up (fastest runs) | "
        "mean objective jasr | mean objective pyctcdecode | jasr better / equal / worse | WER jasr | WER pyctcdecode | "
        "jasr score vs re-score |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: |"]
    for (name, topk, j_s, comp, p_s, ratio, oj, op, better, equal, worse, wj, wp, own) in rows:
        lines.append(f"| {'word trigram' if name == 'lm' else 'none'} | {topk} | {j_s:.3f} | {comp:.1f} | "
                     f"{p_s:.3f} | {ratio} | {oj:.2f} | {op:.2f} | {better} / {equal} / {worse} | {wj:.1%} | "
                     f"{wp:.1%} | {own:.1e} |")
    lines += ["",
              "Objective = exact CTC log-likelihood of the best text (float64 forward) + alpha * kenlm ln P(text) + "
              "beta * words + OOV offsets: the score both decoders maximise, recomputed independently of either; "
              "better / equal / worse counts utterances (tolerance 1e-3). `jasr score vs re-score`: max |jasr's "
              "own total - objective of its raw token sequence|; jasr's total sums the alignments that stayed in "
              "the beam, so it lies below the exact sum by those pruned (it converges with a wider beam). "
              f"jasr.ngram.NgramLM (read_arpa) vs kenlm on every text jasr output: "
              f"max |diff| {lm_diff:.1e} (ln). WER against the sentences the logits were drawn from (the synthetic "
              "logits are noisier than a good model's: 10 % of the character frames are confusable). `jasr first "
              "call`: compiling, or loading the program from JAX's persistent cache where JAX_COMPILATION_CACHE_DIR "
              "is set. pyctcdecode's decode_batch (a process pool) is not used: the machine has two shared cores."]
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    import collect_results  # noqa: E402
    collect_results.refresh_after(args.out)


if __name__ == "__main__":
    main()
