"""A training module that fails while it is being imported (before any step)."""

import procsv  # noqa: F401

raise RuntimeError("boom: the model config is broken")
