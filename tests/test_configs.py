"""Configs as code: every configs/*.py validates; unknown keys and bad values are clear errors; overrides."""
import glob
import os
import subprocess
import sys

import numpy as np
import pytest

from jasr.config import (ConfigError, apply_override, base_config, config_from_argv, load_config_file,
                         load_saved_config, save_config, validate_config)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = sorted(glob.glob(os.path.join(ROOT, "configs", "*.py")))


@pytest.mark.parametrize("path", CONFIGS, ids=[os.path.basename(p) for p in CONFIGS])
def test_every_config_validates(path):
    cfg = load_config_file(path)
    validate_config(cfg, check_paths=False, repo_root=ROOT)


def test_demo_and_fsdd_paths_exist():
    validate_config(load_config_file(os.path.join(ROOT, "configs", "demo.py")), repo_root=ROOT)
    fsdd = load_config_file(os.path.join(ROOT, "configs", "fsdd.py"))
    if os.path.isdir(os.path.join(ROOT, "..", "shared", "data", "fsdd")):
        validate_config(fsdd, repo_root=ROOT)
    assert fsdd.data.train_manifest == "../shared/data/fsdd/manifest.jsonl"


def test_overrides_are_typed():
    cfg, rest = config_from_argv(["--config", os.path.join(ROOT, "configs", "demo.py"), "--config.optim.lr=3e-4",
                                  "--config.train.num_steps", "7", "--config.data.spec_augment=false",
                                  "--config.model.d_model=64", "--config.data.bucket_boundaries=(1.0, 2.5)",
                                  "--workdir", "x"])
    assert cfg.optim.lr == 3e-4 and cfg.train.num_steps == 7 and cfg.data.spec_augment is False
    assert cfg.model.d_model == 64 and tuple(cfg.data.bucket_boundaries) == (1.0, 2.5)
    assert rest == ["--workdir", "x"]


@pytest.mark.parametrize("key,value,match", [
    ("optim.lrr", "1", r"unknown config key 'optim.lrr' \(did you mean 'lr'"),
    ("optimizer.lr", "1", r"unknown config key 'optimizer'"),
    ("optim.lr", "fast", r"cannot parse 'fast' as a float"),
    ("train.num_steps", "1.5", r"expected a int"),
    ("data.spec_augment", "maybe", r"expected a bool"),
    ("optim", "1", r"is a section"),
])
def test_bad_overrides(key, value, match):
    cfg = load_config_file(os.path.join(ROOT, "configs", "demo.py"))
    with pytest.raises(ConfigError, match=match):
        apply_override(cfg, key, value)


@pytest.mark.parametrize("key,value,match", [
    ("optim.lr", -1.0, r"'optim.lr' must be > 0"),
    ("optim.schedule", "linear", r"'optim.schedule' must be"),
    ("train.precision", "fp8", r"'train.precision' must be"),
    ("loss.type", "attention", r"does not fit model 'conformer_ctc'"),
    ("train.checkpoint_every", 7, r"multiple of 'train.log_every'"),
    ("data.bucket_boundaries", (2.0, 1.0), r"'data.bucket_boundaries' must be increasing"),
    ("optim.grad_accum", 3, r"multiple of 'optim.grad_accum'"),
    ("data.speed_perturb", (0.9, 0.0), r"'data.speed_perturb' must be speed factors"),
    ("data.gain_db", (6.0, -6.0), r"'data.gain_db' must be \(\) or \(low, high\)"),
    ("data.noise_snr_db", (10.0,), r"'data.noise_snr_db' must be \(\) or \(low, high\)"),
    ("data.max_time_ratio", 1.5, r"'data.max_time_ratio' must be in \[0, 1\]"),
    ("data.max_time_warp", -1, r"'data.max_time_warp' must be >= 0"),
    ("mesh.pipeline", 2, r"pipelining needs scanned layers"),
    ("mesh.data", 0, r"'mesh.data' must be >= 1 or -1"),
    ("data.high_freq", 9000.0, r"'data.high_freq'=9000.0 must give 0 <= low < high <= Nyquist \(8000 Hz"),
    ("data.random_eq_db", -3.0, r"'data.random_eq_db' must be >= 0"),
    ("data.low_freq", 8500.0, r"'data.low_freq'=8500.0"),
])
def test_bad_values(key, value, match):
    cfg = load_config_file(os.path.join(ROOT, "configs", "demo.py"))
    section, name = key.split(".")
    with cfg[section].ignore_type():
        cfg[section][name] = value
    with pytest.raises(ConfigError, match=match):
        validate_config(cfg, check_paths=False)


def test_unknown_keys_in_files_and_model_fields():
    cfg = load_config_file(os.path.join(ROOT, "configs", "demo.py"))
    cfg.train.num_stepz = 3
    with pytest.raises(ConfigError, match=r"unknown config key 'train.num_stepz' \(did you mean 'num_steps'"):
        validate_config(cfg, check_paths=False)
    cfg = load_config_file(os.path.join(ROOT, "configs", "demo.py"))
    cfg.model.d_modle = 3
    with pytest.raises(ConfigError, match=r"unknown config key 'model.d_modle'.*did you mean 'd_model'"):
        validate_config(cfg, check_paths=False)


def test_missing_manifest_is_named(tmp_path):
    cfg = base_config()
    cfg.data.train_manifest = str(tmp_path / "nope.jsonl")
    with pytest.raises(ConfigError, match=r"'data.train_manifest'.*nope.jsonl.*does not exist"):
        validate_config(cfg)
    cfg.data.train_manifest = ""
    with pytest.raises(ConfigError, match=r"'data.train_manifest' is empty"):
        validate_config(cfg)


def test_saved_config_round_trip(tmp_path):
    cfg = load_config_file(os.path.join(ROOT, "configs", "demo.py"))
    save_config(cfg, str(tmp_path / "config.json"))
    back = load_saved_config(str(tmp_path / "config.json"))
    validate_config(back, check_paths=False)
    assert back.to_dict() == cfg.to_dict()


def _run(args):
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_cli_help_and_errors(tmp_path):
    r = _run(["train.py", "--help"])
    assert r.returncode == 0 and "--config" in r.stdout and "--workdir" in r.stdout and "optim" in r.stdout
    r = _run(["train.py", "--config", "configs/demo.py", "--config.optim.lrr=1", "--workdir", str(tmp_path)])
    assert r.returncode == 2 and "unknown config key 'optim.lrr'" in r.stderr
    assert not os.listdir(tmp_path), "nothing starts before the config is valid"
    r = _run(["train.py", "--config", "configs/nope.py", "--workdir", str(tmp_path)])
    assert r.returncode == 2 and "configs/nope.py" in r.stderr
    r = _run(["decode.py", "--help"])
    assert r.returncode == 0 and "--split" in r.stdout
    r = _run(["decode.py", "--workdir", str(tmp_path), "--split", "dev"])
    assert r.returncode == 2 and "not a training run folder" in r.stderr


def test_audio_augmentation_from_config():
    from jasr.run_data import audio_augment
    cfg = load_config_file(os.path.join(ROOT, "configs", "demo.py"))
    assert audio_augment(cfg.data) is None
    cfg.data.speed_perturb = (0.9, 1.0, 1.1)
    cfg.data.noise_snr_db = (10.0, 30.0)
    validate_config(cfg, check_paths=False)
    aug = audio_augment(cfg.data)
    assert (aug.min_speed, aug.max_speed, aug.gain_db, aug.noise_snr_db) == (0.9, 1.1, None, (10.0, 30.0))
    audio = np.sin(np.arange(16000) * 0.05).astype(np.float32)
    out = aug(audio, 16000, np.random.default_rng(0))
    assert out.dtype == np.float32 and 16000 / 1.1 - 2 <= len(out) <= 16000 / 0.9 + 2


def test_spec_augment_time_masks_and_warp_from_config():
    """data.max_time_ratio / max_time_warp reach SpecAugment (short utterances need more than the default 5 %)."""
    from jasr.features import FeatureConfig
    from jasr.tasks.base import Frontend
    cfg = load_config_file(os.path.join(ROOT, "configs", "fsdd.py"))
    cfg.data.max_time_ratio, cfg.data.max_time_warp = 0.2, 5
    validate_config(cfg, check_paths=False)
    fe = Frontend.from_config(cfg, FeatureConfig(kind="fbank", sample_rate=8000, num_mel_bins=40))
    assert fe.spec_augment[4:] == (0.2, 5)


def test_mel_range_from_config():
    """data.low_freq / high_freq reach the filter bank: a 3 kHz ceiling leaves the bins above it empty."""
    import numpy as np
    from jasr.features import fbank, kaldi_mel_banks
    from jasr.tasks import family
    cfg = load_config_file(os.path.join(ROOT, "configs", "fsdd.py"))
    cfg.data.low_freq, cfg.data.high_freq = 100.0, 3000.0
    validate_config(cfg, check_paths=False)
    fc = family(cfg.model.name).feature_config(cfg)
    assert (fc.low_freq, fc.high_freq) == (100.0, 3000.0)
    banks = kaldi_mel_banks(fc.num_mel_bins, fc.padded_window, fc.sample_rate, fc.low_freq, fc.high_freq)
    hz = np.arange(banks.shape[0]) * fc.sample_rate / fc.padded_window      # banks: [FFT bins, mel bins]
    assert banks[hz > 3000.0].max() == 0.0 and banks[hz < 100.0].max() == 0.0 and banks.max() > 0.0
    tone = np.sin(2 * np.pi * 3500.0 * np.arange(8000) / 8000.0)   # above the ceiling: nothing but leakage
    low = fbank(tone, 8000, 40, low_freq=100.0, high_freq=3000.0)
    full = fbank(tone, 8000, 40)
    assert full.max() - low.max() > 5.0
