"""FSDD held-out speaker: WER of each decoding method on one trained run, written to bench/results/fsdd_decoding.md.

    python train.py --config configs/fsdd.py --workdir runs/fsdd      # once (10-20 min on 2 CPU cores)
    cp -r runs/fsdd runs/fsdd_more                                    # optional: 1200 more steps, the cosine
    python train.py --config configs/fsdd.py --workdir runs/fsdd_more --config.train.num_steps=2400  # restarted
    python bench/fsdd_decoding.py [--workdir runs/fsdd [runs/fsdd_more]] [--checkpoint best]

Every method decodes the same checkpoint's log-probs of the dev split (the held-out speaker of configs/fsdd.py)
through jasr.transcribe (what decode.py runs); each row's command reproduces it with decode.py. The word LM of the
"beam + LM" row is a Kneser-Ney bigram that jasr estimates from the run's training transcripts
(jasr.ngram_estimate, with lmplz's --discount_fallback: ten distinct sentences are too few for the closed-form
discounts; written next to the run as WORKDIR/train_words_2gram.arpa): no external tool.
"""
import argparse
import datetime
import os
import platform
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from jasr.ngram import write_arpa  # noqa: E402
from jasr.ngram_estimate import estimate_kneser_ney  # noqa: E402
from jasr.run_data import split_utterances  # noqa: E402
from jasr.training import enable_compilation_cache, load_run  # noqa: E402
from jasr.transcribe import settings_from_config, transcribe  # noqa: E402

OUT = os.path.join(ROOT, "bench", "results", "fsdd_decoding.md")


def methods(lm_path: str) -> list[tuple[str, dict]]:
    """(label, decode.py flags) per row; flags override the run's decode section."""
    lex, gram = "configs/fsdd_lexicon.txt", "configs/fsdd_grammar.arpa"
    rows = [
        ("greedy (character best path)", {"method": "greedy"}),
        ("beam 8, no LM", {"method": "beam", "beam": 8, "lexicon": "", "grammar": ""}),
        ("beam 8 + word 2-gram LM (KN, train transcripts)", {"method": "beam", "beam": 8, "lm": lm_path,
                                                              "lm_weight": 1.0, "lexicon": "", "grammar": ""}),
        ("lexicon-constrained beam 8 (10 digit words)", {"method": "lexicon", "beam": 8, "lexicon": lex,
                                                         "grammar": ""}),
        ("lexicon + grammar (one digit word), beam 8", {"method": "lexicon", "beam": 8, "lexicon": lex,
                                                        "grammar": gram, "lm_weight": 1.0}),
        ("graph: HLG of lexicon and grammar, one best", {"method": "graph", "lexicon": lex, "grammar": gram,
                                                         "lm_weight": 1.0}),
    ]
    return rows


def command(workdir: str, flags: dict) -> str:
    parts = [f"python decode.py --workdir {workdir} --split dev"]
    for k, v in flags.items():
        parts.append(f"--{k.replace('_', '-')} {v if v != '' else repr('')}")
    return " ".join(parts)


def measure(workdir: str, checkpoint: str) -> list[str]:
    """The markdown section (heading, notes, table) of one run."""
    run = load_run(workdir, checkpoint=checkpoint, root=ROOT)
    cfg = run.config
    train_text = [u.text for u in split_utterances(cfg, "train", ROOT)]
    lm_path = os.path.join(workdir, "train_words_2gram.arpa")
    write_arpa(estimate_kneser_ney(train_text, 2, discount_fallback=(0.5, 1.0, 1.5)), lm_path)   # lmplz's fallback
    bad: list = []
    utts = split_utterances(cfg, "dev", ROOT, bad=bad)
    rows = []
    for label, flags in methods(lm_path):
        settings = settings_from_config(cfg, flags, root=ROOT)     # "" clears a path of the config's section
        m, _ = transcribe(run, utts, settings, bad=bad, progress=False)
        rows.append((label, m, command(workdir, flags)))
        print(f"{workdir} {label}: WER {100 * m['wer']:.2f}% CER {100 * m['cer']:.2f}% over {m['scored']} "
              f"utterances ({m['seconds']:.1f} s)", flush=True)
    lines = [
        f"### `{workdir}`: checkpoint step {run.step} (best dev WER; {cfg.train.num_steps} training steps)",
        "",
        f"Dev split = held-out speaker `{', '.join(cfg.data.speakers_dev)}`, {rows[0][1]['scored']} utterances "
        f"({rows[0][1]['failed']} unreadable).",
        "",
        "| method | WER % | CER % | utterances | decode s | command |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for label, m, cmd in rows:
        lines.append(f"| {label} | {100 * m['wer']:.2f} | {100 * m['cer']:.2f} | {m['scored']} | "
                     f"{m['seconds']:.1f} | `{cmd}` |")
    return lines + [""]


def main(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workdir", nargs="+", default=["runs/fsdd"], help="one or more runs of configs/fsdd.py")
    p.add_argument("--checkpoint", default="best")
    p.add_argument("--output", default=OUT)
    a = p.parse_args(argv)
    enable_compilation_cache(ROOT)
    lines = [
        "## FSDD held-out speaker: decoding methods",
        "",
        f"Measured {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC on {platform.machine()} "
        f"({os.cpu_count()} cores, shared with other jobs); decode seconds include compilation. Regenerate: "
        f"`python bench/fsdd_decoding.py --workdir {' '.join(a.workdir)}`. A run with more than configs/fsdd.py's "
        f"1200 steps is the 1200-step run resumed with a larger `--config.train.num_steps` (the cosine schedule "
        f"continues from that step of the longer schedule: a warm restart; commands in this script's docstring). "
        f"The best checkpoint is chosen by the greedy WER of the same held-out speaker (configs/fsdd.py's dev "
        f"split), so these figures are a little optimistic for a truly unseen speaker.",
        "",
    ]
    for w in a.workdir:
        lines += measure(w, a.checkpoint)
    os.makedirs(os.path.dirname(a.output), exist_ok=True)
    with open(a.output, "w") as f:
        f.write("\n".join(lines))
    print(f"written {a.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
