"""Helpers shared by the ``--ps`` launch tests (``test_ps_strategy``, ``test_ps_replicas``, ``test_ps_hosts``):
a task's ``status.json`` entry and a log file's text, read while the run goes on."""

from __future__ import annotations

import os
from typing import Any

from conftest import raw_status


def entry(logdir: str, role: str) -> dict[str, Any]:
    """``role``'s entry of ``status.json`` (``{}`` until it has one)."""
    for p in (raw_status(logdir) or {}).get("processes", []):
        if p["role"] == role:
            return dict(p)
    return {}


def log_of(logdir: str, name: str) -> str:
    """The text of ``logs/<name>`` (``""`` until the file exists)."""
    try:
        with open(os.path.join(logdir, "logs", name)) as fh:
            return fh.read()
    except FileNotFoundError:
        return ""
