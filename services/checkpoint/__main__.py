"""Entry point of the checkpoint service process: ``python -m services.checkpoint``."""

from __future__ import annotations

import os
import sys

from procsv.child import ChildContext, die_with_parent, write_error_file


def main() -> int:
    die_with_parent()
    ctx = ChildContext.from_env()
    if ctx is None:
        print("procsv checkpoint: PROCSV_LOGDIR and PROCSV_RUNTIME_DIR must be set", file=sys.stderr)
        return 2
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    try:
        from services.checkpoint.service import CheckpointService

        return CheckpointService(ctx).run()
    except BaseException as exc:
        write_error_file(ctx, exc, "run")
        raise


if __name__ == "__main__":
    sys.exit(main())
