"""``python -m procsv`` is the ``procsv`` command."""

import sys

from procsv.cli import main

sys.exit(main())
