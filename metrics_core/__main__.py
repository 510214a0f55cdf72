"""``python -m metrics_core``: see ``metrics_core.cli.main``."""

import sys

from metrics_core.cli.main import main

sys.exit(main())
