"""Transcribe audio with a trained run and report WER/CER.

  python decode.py --workdir RUN (--split NAME | --manifest FILE.jsonl | FILES_OR_FOLDERS ...) [options]
  python decode.py --hf-model DIR (--manifest FILE.jsonl | FILES_OR_FOLDERS ...) [options]

--hf-model decodes a Hugging Face Whisper (WhisperForConditionalGeneration) or Wav2Vec2ForCTC directory as it is
(its weights, output layer and vocabulary; the settings of configs/whisper_finetune.py / configs/wav2vec2_ctc.py
for features and batching).

Decoding settings default to the run config's `decode` section (jasr.config.base_config; e.g. configs/fsdd.py
decodes with its digit lexicon and grammar); the flags below override them. Inputs are decoded in batches of the
run's length-bucketed training shapes (a handful of compiled programs), with a progress bar on stderr; results come
back in input order. At the end: WER/CER where references exist, the worst utterances with their ref/hyp
alignment (all of them in OUTPUT.errors.txt), the real-time factor and throughput.

Methods (--method): greedy (best path; AED and Whisper runs decode with their own decoders, Whisper long-form
over the whole file); beam (CTC prefix beam search; with --lm a word n-gram LM is fused, the LM's words spelling
the words it scores; for AED and Whisper runs the attention decoder's beam search with --length-penalty, AED joint
runs with --ctc-weight CTC prefix scoring, Whisper long-form with beam search in every 30 s window and the n-best
of a file that fits one window); lexicon (the CTC beam search constrained to the words of --lexicon, with --lm or
--grammar fused); graph (HLG of --lexicon and --grammar searched by intersect_dense_pruned with graph scale
--lm-weight, then --graph-decoding, icefall's methods: one_best, the lattice's best path; nbest, --num-paths paths
sampled from the lattice (scores scaled by --nbest-scale), the best distinct word sequence; nbest_rescoring, those
paths rescored by --rescore-lm (default: the grammar) at each of --lm-scales; whole_lattice_rescoring, the lattice
intersected with --rescore-lm's G, best path at each of --lm-scales; attention_rescoring, the n-best rescored by
the attention decoder of an AED joint run, at each pair of --lm-scales and --attention-scales). With several
scales the first (pair) gives the transcript; every scale's text is in the JSONL ("rescored") and its WER is
printed. lexicon and graph need a CTC head (conformer_ctc, wav2vec2_ctc, conformer_aed trained with loss.type
'joint'). A hypothesis never depends on the reference: a file decodes to the same text with or without a
transcript. A file that cannot be read is reported (a "failed:" line, a result with an "error" field) and counts
in WER/CER as all deletions (a manifest's transcript is its reference); the others are decoded.

Long files (longer than --long-file-seconds) decode in bounded memory: CTC models stream the audio and run their
encoder over fixed windows (--chunk-seconds, with --context-seconds on each side), then search the whole file's
log-probs as above; AED runs decode pieces of at most --segment-seconds cut at quiet points and join the texts
(JSONL "segments" with times); Whisper transcribes long-form (30 s windows, seeking on timestamps).

Outputs (--format, or the extension of --output), in input order (a manifest's order, unreadable entries
included): jsonl (id, ref, hyp, tokens, score, n-best with scores, rescored texts per scale, word timestamps where
the method gives them, error), txt (id<TAB>text), srt / vtt (subtitles: one file, or a folder with one file per
input), ctm (word times; CTC models).

Devices: batches spread over this machine's devices (data parallel, parameters replicated); --mesh-tensor N (and
--mesh-fsdp N) shard the parameters over N devices (tensor parallel along mlp / heads / vocab; fsdp along embed),
so that a model too large for one device decodes, the batches split over the devices left over. Transcripts and
scores are those of one device (to float rounding).
"""
import argparse
import os
import sys

SETTINGS = ("method", "beam", "nbest", "lm", "lm_weight", "word_bonus", "lexicon", "grammar", "hotword_boost",
            "token_min_logp", "length_penalty", "ctc_weight", "graph_decoding", "num_paths", "nbest_scale",
            "rescore_lm", "lm_scales", "attention_scales", "lm_lookahead", "long_file_seconds", "chunk_seconds",
            "context_seconds", "segment_seconds", "mesh_tensor", "mesh_fsdp")
GRAPH_METHODS = ("one_best", "nbest", "nbest_rescoring", "whole_lattice_rescoring", "attention_rescoring")


def _scales(text):
    try:
        return tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        self.exit(2, f"decode.py: error: {message}\n")


def _parser():
    p = _Parser(prog="decode.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                usage="decode.py (--workdir RUN | --hf-model DIR) (--split NAME | --manifest FILE | FILES ...) "
                      "[options]")
    g = p.add_argument_group("model and inputs")
    g.add_argument("--workdir", help="a folder written by train.py (config.json, tokenizer.json, checkpoints/)")
    g.add_argument("--hf-model", metavar="DIR", help="a Hugging Face Whisper or Wav2Vec2ForCTC directory")
    g.add_argument("--checkpoint", default="best",
                   help="best by dev WER (default; the latest if none has a WER), latest, or a step number")
    g.add_argument("--no-ema", action="store_true",
                   help="a run trained with train.ema_decay: decode with the raw parameters, not their moving average")
    g.add_argument("--split", help="a split of the run's config: train, dev, the demo's heldout, "
                                   "data.eval_manifests keys")
    g.add_argument("--manifest", help="any JSONL manifest (id, audio, text, ...); WER/CER when it has transcripts")
    g.add_argument("files", nargs="*", metavar="FILES_OR_FOLDERS",
                   help="audio files, or folders (transcripts from <stem>.txt / *.trans.txt when present)")
    s = p.add_argument_group("search (default: the run config's decode section)")
    s.add_argument("--method", choices=("greedy", "beam", "lexicon", "graph"))
    s.add_argument("--beam", type=int, help="prefixes kept per frame")
    s.add_argument("--nbest", type=int, help="hypotheses written per utterance (<= beam)")
    s.add_argument("--lm", metavar="FILE.arpa", help="word n-gram LM (ARPA) to fuse")
    s.add_argument("--lm-weight", type=float, help="LM weight (alpha)")
    s.add_argument("--word-bonus", type=float, help="bonus per word (beta; per token without a lexicon)")
    s.add_argument("--lexicon", metavar="FILE", help="word list (first column per line), spelled by the tokenizer")
    s.add_argument("--grammar", metavar="FILE.arpa", help="ARPA grammar (lexicon: LM when no --lm; graph: G)")
    s.add_argument("--hotwords", action="append", metavar="PHRASE[,PHRASE...]",
                   help="phrases to boost (repeat the flag or separate by commas)")
    s.add_argument("--hotword-boost", type=float, help="boost per matched token of a hotword")
    s.add_argument("--token-min-logp", type=float, help="grow prefixes only by tokens at least this likely")
    s.add_argument("--lm-lookahead", action="store_true", default=None,
                   help="beam/lexicon with a word LM: score partial words by the best LM word below them in the "
                        "lexicon (changes pruning, not final scores; helps narrow beams)")
    s.add_argument("--length-penalty", type=float, help="attention beam search (AED, Whisper): length normalisation "
                                                        "exponent")
    s.add_argument("--ctc-weight", type=float, help="AED beam search: weight of the CTC prefix score (joint runs)")
    s.add_argument("--graph-decoding", choices=GRAPH_METHODS,
                   help="--method graph: what follows the lattice search (default one_best)")
    s.add_argument("--num-paths", type=int, help="graph n-best methods: paths sampled per lattice (default 100)")
    s.add_argument("--nbest-scale", type=float, help="graph n-best methods: lattice score scale for the sampling "
                                                     "(default 0.5; smaller gives more distinct paths)")
    s.add_argument("--rescore-lm", metavar="FILE.arpa", help="graph nbest/whole-lattice rescoring: the (larger) "
                                                             "word LM (default: --grammar)")
    s.add_argument("--lm-scales", type=_scales, metavar="S[,S...]",
                   help="graph rescoring: LM scales to rescore at, the first gives the transcript "
                        "(default: --lm-weight)")
    s.add_argument("--attention-scales", type=_scales, metavar="S[,S...]",
                   help="graph attention_rescoring: attention-decoder scales (default 1.0)")
    lf = p.add_argument_group("long files (bounded memory; jasr.long_audio)")
    lf.add_argument("--long-file-seconds", type=float, help="files longer than this decode in pieces (default 60)")
    lf.add_argument("--chunk-seconds", type=float, help="CTC models: encoder windows of this length (default 10)")
    lf.add_argument("--context-seconds", type=float, help="CTC models: context on each side of a window, not "
                                                          "output (default 2)")
    lf.add_argument("--segment-seconds", type=float, help="attention decoders (AED): pieces of at most this, cut "
                                                          "at quiet points (default 20)")
    d = p.add_argument_group("devices (batches split over the local devices; a model too large for one device is "
                             "sharded)")
    d.add_argument("--mesh-tensor", type=int, metavar="N",
                   help="shard the parameters over N devices along their mlp / heads / vocab dimensions (tensor "
                        "parallel); batches split over the local devices left over (default 1)")
    d.add_argument("--mesh-fsdp", type=int, metavar="N",
                   help="shard the parameters over N devices along their embed dimension; batches split over them "
                        "too (default 1)")
    o = p.add_argument_group("output")
    o.add_argument("--output", help="where to write the results (default WORKDIR/decode_<name>.jsonl, with "
                                    "--hf-model ./decode_<name>.jsonl)")
    o.add_argument("--format", choices=("jsonl", "txt", "srt", "vtt", "ctm"),
                   help="output format (default: from the --output extension, else jsonl)")
    o.add_argument("--show", type=int, default=5, help="example transcripts to print (default 5)")
    o.add_argument("--errors", type=int, default=5, help="worst utterances to print with alignments (default 5)")
    o.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def _check(p, a):
    if bool(a.workdir) == bool(a.hf_model):
        p.error("give one of --workdir DIR (a train.py run) or --hf-model DIR")
    if a.hf_model and a.split:
        p.error("--split names a split of a run's config: with --hf-model give --manifest FILE or audio files")
    if sum(bool(x) for x in (a.split, a.manifest, a.files)) != 1:
        p.error("give exactly one of --split NAME, --manifest FILE or audio files/folders")
    if a.show < 0 or a.errors < 0:
        p.error("--show and --errors must be >= 0")


def main(argv):
    p = _parser()
    a = p.parse_args(argv)
    _check(p, a)
    overrides = {k: getattr(a, k) for k in SETTINGS}
    if a.hotwords:
        overrides["hotwords"] = tuple(h.strip() for x in a.hotwords for h in x.split(",") if h.strip())

    from jasr import transcribe as tr
    from jasr.errors import ConfigError
    from jasr.manifests import ManifestError
    from jasr.tokenizers import TokenizerError
    from jasr.training import enable_compilation_cache, load_run
    root = os.path.dirname(os.path.abspath(__file__))
    enable_compilation_cache(root)
    try:
        run = (load_run(a.workdir, checkpoint=a.checkpoint, root=root, use_ema=not a.no_ema) if a.workdir
               else tr.load_hf_model(a.hf_model, root))
        cfg = run.config
        if not run.task.has_decoder:
            raise ConfigError(f"{a.workdir} is a {cfg.model.name} run: it has no decoder to transcribe with "
                              f"(fine-tune it with configs/wav2vec2_ctc.py; its dev loss is in metrics.jsonl)")
        settings = tr.settings_from_config(cfg, overrides, root=root)
        name, utts, bad = tr.collect_utterances(cfg, root, split=a.split, manifest=a.manifest, paths=a.files)
        out_path = a.output or os.path.join(a.workdir or ".", f"decode_{name}.jsonl")
        fmt = a.format or tr.format_from_path(out_path)
        model = (f"checkpoint step {run.step} of {a.workdir}" if a.workdir
                 else f"the {cfg.model.name} model {a.hf_model}")
        print(f"[decode] {len(utts) + len(bad)} utterances of {name!r} with {model}", flush=True)
        m, results = tr.transcribe(run, utts, settings, bad=bad, progress=not a.no_progress)
        written = tr.write_results(results, out_path, fmt)
    except (ValueError, FileNotFoundError, ConfigError, ManifestError, TokenizerError) as e:
        print(f"decode.py: error: {e}", file=sys.stderr)
        return 2
    print(f"[decode] method: {m['method']}")
    if m.get("mesh"):
        print(f"[decode] mesh {m['mesh']}: {m['param_mib_per_device']:.2f} MiB of parameters per device")
    decoded = [r for r in results if "error" not in r]
    for r in decoded[:a.show]:
        print(f"  {r['id']}\n    ref: {r['ref']}\n    hyp: {r['hyp']}")
    failed = [r for r in results if "error" in r]
    for r in failed:
        print(f"[decode] failed: {r['id']}: {r['error']}")
    report = tr.error_report(results, worst=len(results))
    err_path = None
    if report:
        err_path = os.path.splitext(out_path.rstrip("/"))[0] + ".errors.txt"
        with open(err_path, "w") as f:
            f.write(report + "\n")
        shown = tr.error_report(results, worst=a.errors)
        if shown:
            print("[decode] worst utterances:\n" + "\n".join("  " + line for line in shown.splitlines()))
    line = f"[decode] {name}: {m['utterances']} utterances"
    if "wer" in m:
        line += f", WER {100 * m['wer']:.2f}%, CER {100 * m['cer']:.2f}%"
    if failed:
        line += f"; {len(failed)} files could not be read (all deletions in WER/CER; listed above, with an " \
                f"\"error\" field in the results)"
    print(line, flush=True)
    for key, wer in m.get("wer_by_key", {}).items():
        print(f"[decode]   {key}: WER {100 * wer:.2f}%")
    if m["audio_s"]:
        print(f"[decode] {m['audio_s']:.0f} s of audio in {m['seconds']:.1f} s: RTF {m['rtf']:.3f}, "
              f"{m['audio_s'] / max(m['seconds'], 1e-9):.1f} audio s/s, "
              f"{m['utterances'] / max(m['seconds'], 1e-9):.1f} utterances/s (first batches include compilation)")
    print(f"[decode] results in {written[0] if len(written) == 1 else os.path.dirname(written[0])}"
          + (f"; error report in {err_path}" if err_path else ""), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
