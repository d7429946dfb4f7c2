"""``python -m colossal``: the same as the ``colossal`` command (torchrun launches ranks this way)."""

import sys

from colossal.cli import main

sys.exit(main())
