"""`python -m agentrft.cli ...`, the same as the `agentrft` console script."""

import sys

from agentrft.cli.main import main

sys.exit(main())
