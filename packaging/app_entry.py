"""The standalone bundle's entry point (PyInstaller runs this file): the ``quantdeck`` command."""

import sys

from quantdeck.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
