"""Entry point of the summary service process: ``python -m services.summary``."""

from __future__ import annotations

import sys

from procsv.child import ChildContext, die_with_parent, write_error_file


def main() -> int:
    die_with_parent()
    ctx = ChildContext.from_env()
    if ctx is None:
        print("procsv summary: PROCSV_LOGDIR and PROCSV_RUNTIME_DIR must be set", file=sys.stderr)
        return 2
    try:
        from services.summary.service import SummaryService

        return SummaryService(ctx).run()
    except BaseException as exc:
        write_error_file(ctx, exc, "run")
        raise


if __name__ == "__main__":
    sys.exit(main())
