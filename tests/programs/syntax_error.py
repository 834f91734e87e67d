"""A training module with a syntax error (it cannot even be compiled)."""

import procsv

def main(:
    pass
