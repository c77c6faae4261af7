"""Long audio with the demo model: RTF and peak memory decoding 1, 10 and 60 minutes of real speech in chunks
(jasr.long_audio), against whole-file decoding where that fits; the demo model's plain RTF on its dev split.
Writes bench/results/long_audio.md.

    python train.py --config configs/fsdd.py --workdir runs/fsdd      # once, if runs/fsdd does not exist (~10 min)
    nice -n 10 python bench/long_audio.py [--workdir runs/fsdd] [--minutes 1 10 60]

The long files are built once under .cache/long_audio/: every recording of ../shared/data (FSDD digits, the
LJ Speech and LibriVox sentences; human speech), shuffled with a fixed seed and repeated until the duration is
reached, resampled to 16 kHz and written as 16-bit WAV. Decoding reads the file block by block, resamples it to the
model's 8 kHz with soxr's stream resampler, computes fbank features in two streaming passes (the first gathers the
file's mean / std for the model's per-utterance normalisation), runs the Conformer over fixed windows of
``left + chunk + right`` frames and decodes greedily chunk by chunk. Each measurement runs in its own process, so
that ``ru_maxrss`` (peak resident memory of the process) belongs to that measurement alone; tracemalloc's peak
counts the host numpy arrays allocated during decoding. Times exclude loading the model and compiling the window
program (reported separately).
"""
import argparse
import datetime
import glob
import json
import os
import platform
import random
import resource
import subprocess
import sys
import time
import tracemalloc

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import jax  # noqa: E402
import numpy as np  # noqa: E402
import soundfile as sf  # noqa: E402

from jasr.audio import load_audio  # noqa: E402
from jasr.features import compute_features  # noqa: E402
from jasr.long_audio import (chunked_ctc_log_probs, iter_audio_blocks, iter_chunked_log_probs,  # noqa: E402
                             stream_features, task_log_probs_fn)
from jasr.config import load_saved_config  # noqa: E402
from jasr.metrics import cer, wer  # noqa: E402
from jasr.run_data import feature_config, split_utterances  # noqa: E402
from jasr.tasks import family  # noqa: E402
from jasr.training import enable_compilation_cache, load_run  # noqa: E402
from jasr.transcribe import settings_from_config, transcribe  # noqa: E402

OUT = os.path.join(ROOT, "bench", "results", "long_audio.md")
CACHE = os.path.join(ROOT, ".cache", "long_audio")
DATA = os.path.join(os.path.dirname(ROOT), "shared", "data")
FILE_RATE = 16000


def recordings() -> list[tuple[str, str]]:
    """(audio path, transcript) of every recording in the shared data manifests."""
    out = []
    for man in sorted(glob.glob(os.path.join(DATA, "*", "manifest.jsonl"))):
        with open(man) as f:
            for line in f:
                r = json.loads(line)
                out.append((os.path.join(os.path.dirname(man), r["audio"]), r["text"]))
    if not out:
        raise FileNotFoundError(f"no manifests under {DATA}")
    return out


def build_long_file(minutes: float) -> str:
    """.cache/long_audio/speech_<minutes>min.wav: the shared recordings, shuffled (seed 0), repeated to `minutes`;
    the transcript of the recordings it holds (the last one possibly cut) in the same name with .txt."""
    path = os.path.join(CACHE, f"speech_{minutes:g}min.wav")
    if os.path.exists(path) and os.path.exists(path[:-4] + ".txt"):
        return path
    os.makedirs(CACHE, exist_ok=True)
    files = recordings()
    random.Random(0).shuffle(files)
    need, done, i, texts = int(minutes * 60 * FILE_RATE), 0, 0, []
    with sf.SoundFile(path + ".tmp", "w", FILE_RATE, 1, subtype="PCM_16", format="WAV") as f:
        while done < need:
            audio, text = files[i % len(files)]
            x = load_audio(audio, FILE_RATE)[:need - done]
            f.write(x)
            done += len(x)
            texts.append(text)
            i += 1
    with open(path[:-4] + ".txt", "w") as f:
        f.write(" ".join(texts) + "\n")
    os.replace(path + ".tmp", path)
    return path


def maxrss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def greedy(lp_blocks, blank: int):
    """Greedy CTC tokens over a stream of [n, V] log-prob blocks (repeats merged across block boundaries)."""
    toks, prev, frames = [], -1, 0
    for lp in lp_blocks:
        best = lp.argmax(-1)
        prevs = np.concatenate([[prev], best[:-1]])
        toks += best[(best != blank) & (best != prevs)].tolist()
        if len(best):
            prev = int(best[-1])
        frames += len(best)
    return toks, frames


# ------------------------------------------------------------------------------------------------------------
# workers (one process per measurement)

def work_long(a) -> dict:
    enable_compilation_cache(ROOT)
    run = load_run(a.workdir)
    cfg, task = run.config, run.task
    fc = feature_config(cfg)
    sub = family(cfg.model.name).subsampling(cfg)
    fn = task_log_probs_fn(task, run.state, raw_audio=False)
    per_s = 1000.0 / fc.frame_shift_ms
    path = a.path
    audio_s = sf.info(path).duration
    out = {"audio_s": audio_s, "mode": a.mode}
    if a.mode == "whole":
        rss0 = maxrss_mb()
        tracemalloc.start()
        t0 = time.perf_counter()
        feats = compute_features(load_audio(path, fc.sample_rate), fc)
        t_feat = time.perf_counter() - t0
        x, pad = feats[None], np.zeros((1, len(feats)), np.float32)
        t1 = time.perf_counter()
        jax.block_until_ready(fn(x, pad))                      # compile + run
        t2 = time.perf_counter()
        lp, pads = fn(x, pad)
        lp = np.asarray(lp[0])[np.asarray(pads[0]) < 0.5]
        t3 = time.perf_counter()
        toks, frames = greedy([lp], task.blank_id)
        out.update(compile_s=t2 - t1 - (t3 - t2), wall_s=t_feat + (t3 - t2))
    else:
        chunk, ctx = int(a.chunk_seconds * per_s), int(a.context_seconds * per_s)
        w = chunk + 2 * ctx
        t0 = time.perf_counter()
        jax.block_until_ready(fn(np.zeros((a.batch, w, fc.num_mel_bins), np.float32),
                                 np.zeros((a.batch, w), np.float32)))
        out["compile_s"] = time.perf_counter() - t0
        rss0 = maxrss_mb()
        tracemalloc.start()
        t0 = time.perf_counter()
        feats = stream_features(lambda: iter_audio_blocks(path, fc.sample_rate, block_seconds=a.block_seconds), fc)
        parts = []

        def keep(blocks):
            for b in blocks:
                if a.save:
                    parts.append(b)
                yield b
        toks, frames = greedy(keep(iter_chunked_log_probs(fn, feats, chunk_frames=chunk, left_context=ctx,
                                                          right_context=ctx, subsampling=sub, batch_size=a.batch)),
                              task.blank_id)
        out["wall_s"] = time.perf_counter() - t0
        lp = np.concatenate(parts) if parts else None
    text = run.tokenizer.decode(toks)
    out.update(rss_before_mb=rss0, rss_peak_mb=maxrss_mb(), host_peak_mb=tracemalloc.get_traced_memory()[1] / 2 ** 20,
               frames=frames, rtf=out["wall_s"] / audio_s, text=text,
               device_memory=jax.devices()[0].memory_stats())
    if a.save and lp is not None:
        np.save(a.save, lp)
    return out


def work_dev(a) -> dict:
    enable_compilation_cache(ROOT)
    run = load_run(a.workdir)
    utts = split_utterances(run.config, "dev", ROOT)
    rows = []
    lexicon = {"method": "lexicon", "beam": 8, "lexicon": os.path.join(ROOT, "configs", "fsdd_lexicon.txt"),
               "grammar": os.path.join(ROOT, "configs", "fsdd_grammar.arpa"), "lm_weight": 1.0}
    for over in ({"method": "greedy"}, {"method": "greedy"}, lexicon):
        settings = settings_from_config(run.config, over, root=ROOT)
        m, _ = transcribe(run, utts, settings, progress=False)
        rows.append({k: m[k] for k in ("audio_s", "seconds", "rtf", "method", "wer", "utterances")})
    # what the model makes of two digits in a row (it was trained on one word per utterance)
    fc = feature_config(run.config)
    fn = task_log_probs_fn(run.task, run.state, raw_audio=False)
    pair = [os.path.join(DATA, "fsdd", "recordings", f"{n}.wav") for n in ("0_theo_0", "0_theo_1")]
    feats = compute_features(np.concatenate([load_audio(p, fc.sample_rate) for p in pair]), fc)
    toks, _ = greedy([np.asarray(fn(feats[None], np.zeros((1, len(feats)), np.float32))[0][0])], run.task.blank_id)
    return {"rows": rows, "pair": run.tokenizer.decode(toks), "dev_chunked": dev_chunked(run, utts, fn, fc)}


def dev_chunked(run, utts, fn, fc) -> list[dict]:
    """Greedy WER of the dev split decoded whole (padded to multiples of 64 frames: the padding is masked) and in
    chunks (each setting: chunk, context each side, in seconds), with the mean |delta log-prob| against whole."""
    sub = family(run.config.model.name).subsampling(run.config)
    blank, tok = run.task.blank_id, run.tokenizer
    feats = [compute_features(load_audio(u.audio_path, fc.sample_rate), fc) for u in utts]
    refs = [u.text for u in utts]
    whole = []
    for f in feats:
        n = -(-len(f) // 64) * 64
        x = np.zeros((1, n, f.shape[1]), np.float32)
        x[0, :len(f)] = f
        lp, pads = fn(x, (np.arange(n)[None] >= len(f)).astype(np.float32))
        whole.append(np.asarray(lp[0])[np.asarray(pads[0]) < 0.5])
    out = [{"chunk": 0.0, "context": 0.0, "wer": wer(refs, [tok.decode(greedy([w], blank)[0]) for w in whole]),
            "mean": 0.0}]
    for chunk_s, ctx_s in ((0.1, 0.1), (0.2, 0.2), (0.2, 0.4), (0.4, 0.4)):
        c, k = int(round(chunk_s * 100)) // sub * sub, int(round(ctx_s * 100)) // sub * sub
        hyps, diffs = [], []
        for f, w in zip(feats, whole):
            lp = chunked_ctc_log_probs(fn, f, chunk_frames=c, left_context=k, right_context=k, subsampling=sub)
            hyps.append(tok.decode(greedy([lp], blank)[0]))
            diffs.append(np.abs(lp - w).mean())
        out.append({"chunk": chunk_s, "context": ctx_s, "wer": wer(refs, hyps), "mean": float(np.mean(diffs))})
    return out


def worker(argv) -> dict:
    a = argv
    return work_dev(a) if a.mode == "dev" else work_long(a)


def spawn(args: list[str]) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", *args]
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if p.returncode != 0:
        return {"error": (p.stderr or p.stdout).strip().splitlines()[-1][:300]}
    return json.loads(p.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------------------------------------------------

def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", default=os.path.join(ROOT, "runs", "fsdd"))
    ap.add_argument("--minutes", type=float, nargs="+", default=[1, 10, 60])
    ap.add_argument("--whole-minutes", type=float, nargs="+", default=[1, 2])
    ap.add_argument("--chunk-seconds", type=float, default=10.0)
    ap.add_argument("--context-seconds", type=float, default=2.0)
    ap.add_argument("--sweep", nargs="+", default=["10:0.5", "10:1", "10:2", "10:4", "2:1", "4:2"],
                    help="CHUNK:CONTEXT seconds compared with whole-file log-probs on the shortest whole-file "
                         "duration")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--block-seconds", type=float, default=30.0)
    ap.add_argument("--out", default=OUT)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--mode", default="chunked", help=argparse.SUPPRESS)
    ap.add_argument("--path", default="", help=argparse.SUPPRESS)
    ap.add_argument("--save", default="", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        print(json.dumps(worker(a)))
        return 0
    if not os.path.isfile(os.path.join(a.workdir, "config.json")):
        print(f"no run at {a.workdir}: train the demo model first:\n"
              f"  python train.py --config configs/fsdd.py --workdir runs/fsdd", file=sys.stderr)
        return 1
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    load = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    base = ["--workdir", a.workdir, "--batch", str(a.batch), "--block-seconds", str(a.block_seconds)]
    tmp = os.path.join(CACHE, "lp")
    os.makedirs(tmp, exist_ok=True)

    chunked, whole, sweep = {}, {}, []
    for m in sorted(set(a.minutes) | set(a.whole_minutes)):
        path = build_long_file(m)
        save = os.path.join(tmp, f"chunked_{m:g}.npy") if m in a.whole_minutes else ""
        if m in a.minutes or m in a.whole_minutes:
            chunked[m] = spawn(base + ["--path", path, "--chunk-seconds", str(a.chunk_seconds),
                                       "--context-seconds", str(a.context_seconds)] + (["--save", save] if save
                                                                                       else []))
            print(f"[long_audio] chunked {m:g} min: {json.dumps({k: v for k, v in chunked[m].items() if k != 'text'})}",
                  flush=True)
        if m in a.whole_minutes:
            wsave = os.path.join(tmp, f"whole_{m:g}.npy")
            whole[m] = spawn(base + ["--path", path, "--mode", "whole", "--save", wsave])
            print(f"[long_audio] whole {m:g} min: {json.dumps({k: v for k, v in whole[m].items() if k != 'text'})}",
                  flush=True)
    m0 = min(a.whole_minutes)
    ref = np.load(os.path.join(tmp, f"whole_{m0:g}.npy")) if "error" not in whole.get(m0, {"error": 1}) else None
    for pair in a.sweep:
        if ref is None:
            break
        chunk_s, ctx = (float(v) for v in pair.split(":"))
        save = os.path.join(tmp, f"sweep_{chunk_s:g}_{ctx:g}.npy")
        r = spawn(base + ["--path", build_long_file(m0), "--chunk-seconds", str(chunk_s),
                          "--context-seconds", str(ctx), "--save", save])
        ctx = (chunk_s, ctx)
        if "error" in r:
            sweep.append((ctx, r))
            continue
        lp = np.load(save)
        d = np.abs(lp - ref)
        sweep.append((ctx, {"max": float(d.max()), "mean": float(d.mean()),
                            "argmax": float(np.mean(lp.argmax(-1) == ref.argmax(-1))),
                            "cer": cer([whole[m0]["text"]], [r["text"]]),
                            "rtf": r["rtf"]}))
        print(f"[long_audio] sweep chunk, context {ctx} s: {sweep[-1][1]}", flush=True)
    dev = spawn(["--workdir", a.workdir, "--mode", "dev"])
    print(f"[long_audio] dev: {dev}", flush=True)
    write_report(a, stamp, load, chunked, whole, sweep, dev, tmp)
    return 0


def fmt(x, spec=".1f"):
    return "—" if x is None else format(x, spec)


def write_report(a, stamp, load, chunked, whole, sweep, dev, tmp) -> None:
    run_name = os.path.relpath(os.path.abspath(a.workdir), ROOT)
    lines = ["## Long audio: chunked CTC decoding in bounded memory (demo model)", "",
             f"Measured {stamp} on {platform.machine()} ({os.cpu_count()} cores, shared with other jobs; "
             f"`uptime`: {load}); CPU only, under `nice -n 10`. Model: `{run_name}` (configs/fsdd.py: Conformer CTC, "
             f"4 layers, d_model 96, full relative-position self-attention, 2x subsampling, fbank at 8 kHz with "
             f"per-utterance mean/variance normalisation). Regenerate: `python train.py --config configs/fsdd.py "
             f"--workdir runs/fsdd` (once, ~10 min) then `nice -n 10 python bench/long_audio.py`.", "",
             f"Input: real speech (every recording of ../shared/data: FSDD digits, LJ Speech and LibriVox sentences, "
             f"shuffled, repeated to the duration), a 16 kHz 16-bit WAV decoded at the model's 8 kHz. Chunked: "
             f"{a.chunk_seconds:g} s chunks with {a.context_seconds:g} s of left and right context (windows of "
             f"{a.chunk_seconds + 2 * a.context_seconds:g} s, batch {a.batch}), audio read in {a.block_seconds:g} s "
             f"blocks, features in two streaming passes, greedy decoding chunk by chunk. Wall time excludes loading "
             f"the model and compiling (one window program, compile s column). RSS before = after loading the model "
             f"and compiling; peak RSS = the process's `ru_maxrss` at the end; host arrays = tracemalloc's peak of the "
             f"numpy arrays allocated while decoding. JAX's device memory statistics are not available on the CPU "
             f"backend (`memory_stats()` is None).", "",
              "| audio | mode | wall s | RTF | compile s | RSS before MB | peak RSS MB | host arrays peak MB | "
             "output frames | tokens |", "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for m in sorted(set(chunked) | set(whole)):
        for mode, r in (("chunked", chunked.get(m)), ("whole file", whole.get(m))):
            if r is None:
                continue
            if "error" in r:
                lines.append(f"| {m:g} min | {mode} | failed: {r['error']} | | | | | | | |")
                continue
            lines.append(f"| {m:g} min | {mode} | {r['wall_s']:.1f} | {r['rtf']:.4f} | {r['compile_s']:.1f} | "
                         f"{r['rss_before_mb']:.0f} | {r['rss_peak_mb']:.0f} | {r['host_peak_mb']:.1f} | "
                         f"{r['frames']} | {len(r['text'])} |")
    if "pair" in dev:
        lines += ["", f"Accuracy on these files is not a meaningful figure for this model: it was trained on isolated "
                  f"digits (one word per utterance), and two recordings of \"zero\" back to back (FSDD 0_theo_0 + "
                  f"0_theo_1, one file) decode to {dev['pair']!r}. The long file is its input here for speed and "
                  f"memory; how far chunking moves the model's output is measured as the distance between chunked and "
                  f"whole-file log-probs below."]
    big = [m for m in sorted(chunked) if m not in whole]
    cfg = load_saved_config(os.path.join(a.workdir, "config.json"))
    sub, heads = family(cfg.model.name).subsampling(cfg), int(cfg.model.get("num_heads", 4))
    if big:
        m = big[0]
        t_out = int(m * 60 * 100 / sub)
        lines += ["", f"Whole-file decoding of {', '.join(f'{x:g}' for x in big)} min was not attempted: the "
                  f"encoder's self-attention holds [heads, T', T'] scores and a [heads, T', 2T'-1] relative-position "
                  f"tensor per layer; at {m:g} min T' = {t_out} frames, so one float32 score tensor alone is "
                  f"{heads * t_out * t_out * 4 / 2 ** 30:.1f} GiB (the {max(big):g} min file: "
                  f"{heads * (6000 * max(big) / sub) ** 2 * 4 / 2 ** 30:.0f} GiB), beyond this machine's 23 GiB."]
    for m in sorted(whole):
        w, c = whole[m], chunked.get(m)
        if "error" in w or not c or "error" in c:
            continue
        lp_c, lp_w = np.load(os.path.join(tmp, f"chunked_{m:g}.npy")), np.load(os.path.join(tmp, f"whole_{m:g}.npy"))
        d = np.abs(lp_c - lp_w)
        same = 100 * np.mean(lp_c.argmax(-1) == lp_w.argmax(-1))
        lines += ["", f"{m:g} min, chunked vs whole file (same model): |Δ log-prob| max {d.max():.3f}, mean "
                  f"{d.mean():.4f} nats; best-path label equal in {same:.2f} % "
                  f"of {len(d)} frames; greedy transcripts differ by CER {100 * cer([w['text']], [c['text']]):.2f} % "
                  f"(chunked against whole file)."]
    if sweep:
        m0 = min(whole)
        lines += ["", f"Chunk and context against whole-file log-probs ({m0:g} min file):",
                  "", "| chunk | context each side | max \\|Δ\\| | mean \\|Δ\\| | best-path label equal | "
                  "CER vs whole | RTF |",
                  "|---:|---:|---:|---:|---:|---:|---:|"]
        for (chunk_s, ctx), r in sweep:
            if "error" in r:
                lines.append(f"| {chunk_s:g} s | {ctx:g} s | failed: {r['error']} | | | | |")
                continue
            lines.append(f"| {chunk_s:g} s | {ctx:g} s | {r['max']:.3f} | {r['mean']:.4f} | "
                         f"{100 * r['argmax']:.2f} % | {100 * r['cer']:.2f} % | {r['rtf']:.4f} |")
    if "rows" in dev:
        lines += ["", "Plain RTF of the demo model on its dev split (held-out speaker, whole utterances through "
                  "jasr.transcribe as decode.py runs it; seconds include compiling the bucket programs in the first "
                  "row, the second row repeats the first with the programs in the persistent compilation cache; the "
                  "third decodes with the digit lexicon and one-word grammar of configs/fsdd.py, beam 8):", "",
                  "| method | utterances | audio s | decode s | RTF | WER % |", "|---|---:|---:|---:|---:|---:|"]
        for r in dev["rows"]:
            lines.append(f"| {r['method']} | {r['utterances']} | {r['audio_s']:.1f} | {r['seconds']:.2f} | "
                         f"{r['rtf']:.4f} | {100 * r['wer']:.2f} |")
    elif dev:
        lines += ["", f"Dev-split RTF failed: {dev.get('error')}"]
    if dev.get("dev_chunked"):
        lines += ["", "Chunking where the model is in its element: the dev split (isolated digits, 0.39 s on average) "
                  "decoded greedily whole and in chunks (jasr.long_audio.chunked_ctc_log_probs on each utterance's "
                  "features; a window of chunk + 2 x context):", "",
                  "| chunk | context each side | WER % | mean \\|Δ log-prob\\| vs whole |", "|---:|---:|---:|---:|"]
        for r in dev["dev_chunked"]:
            name = ("whole utterance", "—") if r["chunk"] == 0 else (f"{r['chunk']:g} s", f"{r['context']:g} s")
            lines.append(f"| {name[0]} | {name[1]} | {100 * r['wer']:.2f} | {r['mean']:.4f} |")
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"[long_audio] wrote {a.out}")


if __name__ == "__main__":
    sys.exit(main())
