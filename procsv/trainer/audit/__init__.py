"""The trainer's side of the audit (issue 71): an auditor's replay, and the tests' bit-flip fault."""
