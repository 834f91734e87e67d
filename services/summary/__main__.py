"""Entry point of the summary service process: ``python -m procsv.services.summary``."""

from __future__ import annotations

import sys

from procsv.common.bootstrap import ChildContext, run_service


def _main(ctx: ChildContext) -> int:
    from procsv.common import lossyio
    from procsv.services.summary.service import SummaryService

    lossyio.install()  # a log line that does not fit on a full disk is dropped, not a crash
    return SummaryService(ctx).run()


if __name__ == "__main__":
    sys.exit(run_service("summary", _main))
