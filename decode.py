"""Transcribe audio with a trained run and report WER/CER.

usage: python decode.py --workdir DIR [--split NAME | --manifest FILE.jsonl | FILES_OR_FOLDERS ...]
                        [--checkpoint best|latest|STEP] [--show N] [--output FILE.jsonl]

  --workdir DIR       a folder written by train.py (config.json, tokenizer.json, checkpoints/)
  --split NAME        a split of the run's config: train, dev, the demo's heldout, data.eval_manifests keys
  --manifest FILE     any JSONL manifest (id, audio, text, ...); WER/CER when it has transcripts
  FILES_OR_FOLDERS    audio files, or folders (transcripts from <stem>.txt / *.trans.txt when present)
  --checkpoint        which checkpoint: best by dev WER (default; the latest if none has a WER), latest, or a step
  --show N            print N example transcripts (default 5)
  --output FILE       where to write per-utterance results (default DIR/decode_<split>.jsonl)

Decoding is greedy: CTC best path (conformer_ctc, wav2vec2_ctc, conformer_aed with loss.type="joint"), greedy
attention decoding (conformer_aed with loss.type="attention": up to the encoder's output frames), or Whisper's
long-form transcription of the whole file (30 s windows, seeking on timestamps as openai-whisper; up to the model's
448 positions per window). A hypothesis never depends on the reference: a file decodes to the same text with or
without a transcript. Prints WER and CER against the references. A file that cannot be read (missing header,
truncated, no samples, non-finite samples, not as long as its manifest says) is reported, one line each, written
to the results with an "error" field and counted in WER/CER as all deletions; the others are decoded.
A wav2vec2_pretrain run has no decoder: decode.py refuses it (its dev loss is in DIR/metrics.jsonl).
"""
import json
import os
import sys


def _parse(argv):
    opts = {"workdir": None, "split": None, "manifest": None, "checkpoint": "best", "show": 5, "output": None,
            "files": []}
    i = 0
    while i < len(argv):
        a = argv[i]
        name, eq, val = a.partition("=")
        key = name[2:].replace("-", "_") if name.startswith("--") else None
        if key in opts and key != "files":
            if not eq:
                if i + 1 >= len(argv):
                    raise ValueError(f"{a}: missing value")
                val = argv[i + 1]
                i += 1
            opts[key] = int(val) if key == "show" else val
        elif a.startswith("-"):
            raise ValueError(f"unknown option {a!r} (see --help)")
        else:
            opts["files"].append(a)
        i += 1
    if not opts["workdir"]:
        raise ValueError("--workdir DIR is required")
    if sum(bool(x) for x in (opts["split"], opts["manifest"], opts["files"])) != 1:
        raise ValueError("give exactly one of --split NAME, --manifest FILE or audio files/folders")
    return opts


def _utterances(opts, cfg, root):
    """(name, utterances to decode, records {"id", "audio", "reason"} of files whose header cannot be read);
    utterances without a transcript carry jasr.run_data's placeholder."""
    from jasr.audio import AudioError, audio_info
    from jasr.manifests import AUDIO_EXTENSIONS, ManifestError, Utterance, read_folder, read_manifest
    from jasr.run_data import split_utterances, with_placeholder_transcripts
    bad = []
    if opts["split"]:
        return opts["split"], split_utterances(cfg, opts["split"], root, bad=bad), bad
    if opts["manifest"]:
        if not os.path.exists(opts["manifest"]):
            raise FileNotFoundError(f"--manifest: {opts['manifest']} does not exist")
        name = os.path.splitext(os.path.basename(opts["manifest"]))[0]
        utts = read_manifest(opts["manifest"], allow_empty_text=True, bad=bad)
        return name, with_placeholder_transcripts(utts), bad
    utts, files = [], []
    for p in opts["files"]:
        if os.path.isdir(p):
            try:
                utts += read_folder(p, bad=bad)
                continue
            except ManifestError:        # not every file has a transcript: decode them all, unlabelled
                files += sorted(os.path.join(d, n) for d, _, names in os.walk(p) for n in names
                                if os.path.splitext(n)[1].lower() in AUDIO_EXTENSIONS)
                continue
        if not os.path.exists(p):
            raise FileNotFoundError(f"audio file {p!r} does not exist")
        files.append(p)
    for p in files:
        uid = os.path.splitext(os.path.basename(p))[0]
        try:
            info = audio_info(p)
        except AudioError as e:
            bad.append({"id": uid, "audio": os.path.abspath(p), "reason": str(e)})
            continue
        utts.append(Utterance(id=uid, audio_path=os.path.abspath(p), text="", duration=info.duration,
                              sample_rate=info.sample_rate))
    return "files", with_placeholder_transcripts(utts), bad


def main(argv):
    if any(a in ("-h", "--help") for a in argv):
        print(__doc__)
        return 0
    try:
        opts = _parse(argv)
    except ValueError as e:
        print(f"decode.py: error: {e}", file=sys.stderr)
        return 2
    import time

    from jasr.training import enable_compilation_cache, evaluate_utterances, load_run
    root = os.path.dirname(os.path.abspath(__file__))
    enable_compilation_cache(root)
    try:
        run = load_run(opts["workdir"], checkpoint=opts["checkpoint"], root=root)
        cfg, step = run.config, run.step
        if not run.task.has_decoder:
            raise ValueError(f"{opts['workdir']} is a {cfg.model.name} run: it has no decoder to transcribe with "
                             f"(fine-tune it with configs/wav2vec2_ctc.py; its dev loss is in metrics.jsonl)")
        name, utts, bad = _utterances(opts, cfg, root)
    except (ValueError, FileNotFoundError) as e:
        print(f"decode.py: error: {e}", file=sys.stderr)
        return 2
    print(f"[decode] {len(utts) + len(bad)} utterances of {name!r} with checkpoint step {step} of "
          f"{opts['workdir']}", flush=True)
    t0 = time.time()
    m, results = evaluate_utterances(run, utts, bad=bad)
    dt = time.time() - t0
    out_path = opts["output"] or os.path.join(opts["workdir"], f"decode_{name}.jsonl")
    with open(out_path, "w") as f:
        for r in results:
            f.write(json.dumps(r) + "\n")
    decoded = [r for r in results if "error" not in r]
    for r in decoded[:opts["show"]]:
        print(f"  {r['id']}\n    ref: {r['ref']}\n    hyp: {r['hyp']}")
    failed = [r for r in results if "error" in r]
    for r in failed:
        print(f"[decode] failed: {r['id']}: {r['error']}")
    audio_s = sum(u.duration for u in utts)
    line = f"[decode] {name}: {m['utterances']} utterances"
    if "wer" in m:
        line += f", WER {100 * m['wer']:.2f}%, CER {100 * m['cer']:.2f}%"
    if failed:
        line += f"; {len(failed)} files could not be read (all deletions in WER/CER; listed above, with an " \
                f"\"error\" field in the results)"
    line += f" ({audio_s:.0f} s of audio in {dt:.1f} s); results in {out_path}"
    print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
