"""Entry point of the summary service process: ``python -m procsv.services.summary``."""

from __future__ import annotations

import sys

from procsv.common.bootstrap import ChildContext, run_service


def _main(ctx: ChildContext) -> int:
    from procsv.services.summary.service import SummaryService

    return SummaryService(ctx).run()


if __name__ == "__main__":
    sys.exit(run_service("summary", _main))
