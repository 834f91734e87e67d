"""The quick tier's guard, loaded by every Python process a test starts under ``pytest --quick``
(tests/conftest.py puts this folder first on PYTHONPATH): an import of TensorFlow there is written
to the worker's log (``PROCSV_TEST_QUICK_TF_LOG``) and fails at once, so a test of the quick tier
that starts a TensorFlow process fails, named by the check in tests/conftest.py (mark it ``slow``)."""

from __future__ import annotations

import os
import sys
from typing import Any, Optional

_LOG = os.environ.get("PROCSV_TEST_QUICK_TF_LOG")


class _NoTensorFlow:
    """A meta path finder that refuses ``tensorflow`` and records who asked."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Optional[Any]:
        if name != "tensorflow" or not _LOG:
            return None
        with open(_LOG, "a") as fh:
            fh.write(f"pid {os.getpid()}: {' '.join(sys.argv)}\n")
        raise ImportError("pytest --quick: this test starts a TensorFlow process (mark it slow)")


if _LOG:
    sys.meta_path.insert(0, _NoTensorFlow())
