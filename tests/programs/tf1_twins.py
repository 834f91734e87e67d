"""Run several plain TF1 programs one after another in this one process (one TensorFlow import).

``python tf1_twins.py SPEC.json``: SPEC is a list of ``{"program", "argv", "cwd", "out"}``. Each
program runs as ``__main__`` (``runpy.run_path``) with ``sys.argv = [program, *argv]`` in ``cwd``;
what it prints goes to ``out/stdout``, a traceback to ``out/stderr``, and its exit code (its
``SystemExit``'s, 1 for an exception, 0 when it returns) to ``out/code``. The programs are the
seeds' TensorFlow twins (tests/test_seeds_tf1.py): each builds its graph in a
``tf.Graph().as_default()`` block of its own.
"""

from __future__ import annotations

import contextlib
import json
import os
import runpy
import sys
import traceback

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import tensorflow as tf  # noqa: E402,F401  (imported once, for every program)


def run(program: str, argv: list[str], cwd: str, out: str) -> int:
    os.chdir(cwd)
    sys.argv = [program, *argv]
    with open(os.path.join(out, "stdout"), "w") as stdout, open(os.path.join(out, "stderr"), "w") as stderr:
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            try:
                runpy.run_path(program, run_name="__main__")
            except SystemExit as exc:
                return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            except BaseException:  # noqa: BLE001  (the program's failure, reported in its own files)
                traceback.print_exc()
                return 1
    return 0


def main() -> int:
    with open(sys.argv[1]) as fh:
        spec = json.load(fh)
    for item in spec:
        code = run(item["program"], item["argv"], item["cwd"], item["out"])
        with open(os.path.join(item["out"], "code"), "w") as fh:
            fh.write(str(code))
    return 0


if __name__ == "__main__":
    sys.exit(main())
