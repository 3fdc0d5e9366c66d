"""``python -m deniable.cli``."""

import sys

from deniable.cli.main import main

sys.exit(main())
