"""Train a speech recogniser from a config file.

usage: python train.py --config configs/NAME.py[:ARG] [--config.SECTION.KEY=VALUE ...] --workdir DIR

  --config FILE          a Python file whose get_config() returns an ml_collections.ConfigDict
                         (configs/demo.py, configs/fsdd.py, configs/conformer_aed.py, configs/wav2vec2_ctc.py,
                         configs/whisper_finetune.py, configs/wav2vec2_pretrain.py); FILE:ARG calls get_config(ARG)
  --config.KEY=VALUE     override one config value, e.g. --config.optim.lr=3e-4 --config.train.num_steps=100;
                         the value is parsed as the type of the current value; unknown keys are errors
  --workdir DIR          run folder: checkpoints/, metrics.jsonl, tb/ (TensorBoard), config.json, tokenizer.json;
                         if it holds checkpoints the run resumes exactly where it stopped
  --print-config         print the resolved config and exit

Several processes (hosts) training one model together: start the same command on every host with
  --coordinator HOST:PORT  address of process 0 (any free port there), or "auto": the cluster environment says
                           (SLURM, Cloud TPU, GKE, Open MPI; jax.distributed.initialize() without arguments)
  --num-processes N        number of processes in the run
  --process-id I           this process's number, 0 .. N-1 (process 0 writes the logs, config and metrics)
(or the environment variables JASR_COORDINATOR, JASR_NUM_PROCESSES, JASR_PROCESS_ID). Inside a SLURM job step
with several tasks (srun) and on a multi-host TPU slice no flag is needed. The mesh spans the devices of all
processes; each process loads its own rows of every batch; --workdir must be a folder all processes share
(checkpoints are written by all processes together).

The config is validated before anything starts. See jasr/config.py:base_config() for every key and its default.
A mistake in the input (config, manifest, audio, transcripts, tokenizer), a checkpoint that cannot be read or
written, and a full disk are one line "train.py: error: ..." naming the file or key, with exit status 2.
"""
import os
import sys


def _error(e) -> int:
    print(f"train.py: error: {e}", file=sys.stderr)
    return 2


def _raised_by_jasr(e: BaseException) -> bool:
    """True for an exception raised by jasr's own code: its ValueErrors are checks of the user's input (manifests,
    audio, transcripts, batch shapes, pretrained weights) with a message that names it. A ValueError raised inside
    jax, numpy or another library is a bug and keeps its traceback."""
    tb = e.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    path = os.path.abspath(tb.tb_frame.f_code.co_filename) if tb is not None else ""
    return path.startswith(os.path.join(os.path.dirname(os.path.abspath(__file__)), "jasr") + os.sep)


def main(argv):
    if any(a in ("-h", "--help") for a in argv):
        print(__doc__)
        from jasr.config import base_config
        print("Config keys and defaults:\n" + str(base_config()))
        return 0
    from jasr.config import ConfigError, config_from_argv, validate_config
    try:
        cfg, rest = config_from_argv(argv)
        workdir, print_only = None, False
        dist = {"coordinator": None, "num-processes": None, "process-id": None}
        i = 0
        while i < len(rest):
            a = rest[i]
            name = a[2:].split("=", 1)[0] if a.startswith("--") else ""
            if name in ("workdir", *dist) and "=" not in a and i + 1 < len(rest):
                value = rest[i + 1]
                i += 1
            elif name in ("workdir", *dist) and "=" in a:
                value = a.split("=", 1)[1]
            else:
                value = None
            if value is not None:
                if name == "workdir":
                    workdir = value
                else:
                    dist[name] = value
            elif a == "--print-config":
                print_only = True
            else:
                raise ConfigError(f"unknown argument {a!r} (see --help)")
            i += 1
        root = os.path.dirname(os.path.abspath(__file__))
        validate_config(cfg, repo_root=root)
        if print_only:
            print(cfg)
            return 0
        if not workdir:
            raise ConfigError("--workdir DIR is required")
        from jasr.distributed import distributed_settings, initialize_distributed
        distributed_settings(dist["coordinator"], dist["num-processes"], dist["process-id"])   # checks them
    except (ConfigError, ValueError, FileNotFoundError) as e:
        print(f"train.py: error: {e}", file=sys.stderr)
        return 2
    line = initialize_distributed(dist["coordinator"], dist["num-processes"], dist["process-id"])
    if line:
        print(f"[train] {line}", flush=True)
        from jasr.distributed import is_main_process
        if not is_main_process():     # process 0 reports for all; the others print only errors (stderr)
            sys.stdout = open(os.devnull, "w")
    from jasr.audio import AudioError
    from jasr.checkpoint import CheckpointError, is_disk_full
    from jasr.data import DataError
    from jasr.manifests import ManifestError
    from jasr.tokenizers import TokenizerError
    from jasr.training import enable_compilation_cache, train
    enable_compilation_cache(root)
    try:
        final = train(cfg, workdir, root=root)
    except (ConfigError, ManifestError, DataError, TokenizerError, AudioError, CheckpointError) as e:
        return _error(e)
    except OSError as e:
        if is_disk_full(e):
            return _error(f"no space left on device while writing {e.filename or 'to the run folder'} "
                          f"(--workdir {os.path.abspath(workdir)}): {e.strerror or e}")
        if isinstance(e, FileNotFoundError):
            return _error(e)
        raise
    except ValueError as e:
        if _raised_by_jasr(e):
            return _error(e)
        raise
    shown = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in final.items()
             if k in ("step", "loss", "dev_loss", "dev_wer", "dev_cer", "wall_s", "skipped_total")}
    print(f"[train] done: {shown}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
