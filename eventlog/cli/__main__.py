"""``python -m eventlog.cli``."""

import sys

from eventlog.cli.main import main

sys.exit(main())
