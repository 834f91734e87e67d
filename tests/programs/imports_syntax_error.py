"""A training module that compiles, but imports a module with a syntax error (found only in the trainer)."""

import syntax_error  # noqa: F401  (tests/programs/syntax_error.py)
