"""Entry point of the checkpoint service process: ``python -m procsv.services.checkpoint``."""

from __future__ import annotations

import sys

from procsv.common.bootstrap import ChildContext, run_service


def _main(ctx: ChildContext) -> int:
    from procsv.services.checkpoint.service import CheckpointService

    return CheckpointService(ctx).run()


if __name__ == "__main__":
    sys.exit(run_service("checkpoint", _main))
