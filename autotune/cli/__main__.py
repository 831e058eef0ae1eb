"""``python -m autotune.cli``: the ``autotune`` command."""

import sys

from autotune.cli.main import main

sys.exit(main())
