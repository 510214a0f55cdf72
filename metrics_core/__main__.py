"""``python -m metrics_core``: see ``metrics_core.cli``."""

import sys

from metrics_core.cli import main

sys.exit(main())
