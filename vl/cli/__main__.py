"""`python -m vl.cli`: the `vl` command without its console script (tests and scripts start it this way)."""

import sys

from vl.cli import main

sys.exit(main())
