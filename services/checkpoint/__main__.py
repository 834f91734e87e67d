"""Entry point of the checkpoint service process: ``python -m procsv.services.checkpoint``.

Runs in the checkpoint service: started fresh (this module as ``__main__``), or grown from a seed the launch
forked (:mod:`procsv.services.seed`), which calls :func:`preload` while it waits and :func:`main` once
it is the service. The imports wait for :func:`procsv.common.bootstrap.run_service`'s first step (the
stop signals blocked before any thread, an import's native ones too).
"""

from __future__ import annotations

import sys

from procsv.common.bootstrap import ChildContext, run_service


def preload() -> None:
    """Import what :func:`main` runs (a seed, before its start: the service then imports nothing)."""
    import procsv.common.lossyio  # noqa: F401
    import procsv.services.checkpoint.service  # noqa: F401


def main(ctx: ChildContext) -> int:
    """The service's life, once :func:`~procsv.common.bootstrap.run_service` has set it up."""
    from procsv.common import lossyio
    from procsv.services.checkpoint.service import CheckpointService

    lossyio.install()  # a log line that does not fit on a full disk is dropped, not a crash
    return CheckpointService(ctx).run()


if __name__ == "__main__":
    sys.exit(run_service("checkpoint", main))
