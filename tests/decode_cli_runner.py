"""decode.py's main run in the test process (a helper module for the decode.py tests, like fsa_oracle.py)."""
import importlib.util
import json
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_spec = importlib.util.spec_from_file_location("decode_cli", os.path.join(ROOT, "decode.py"))
decode_cli = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(decode_cli)


def run_decode(capsys, *args):
    """(exit code, stdout, stderr) of ``decode.py --no-progress ARGS`` in this process."""
    try:
        rc = decode_cli.main(["--no-progress", *map(str, args)])
    except SystemExit as e:
        rc = e.code
    out, err = capsys.readouterr()
    return rc, out, err


def read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f]
