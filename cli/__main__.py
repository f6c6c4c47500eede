"""``python -m quantdeck.cli``: the same as the ``quantdeck`` command."""

import sys

from quantdeck.cli.main import main

sys.exit(main())
