"""``python -m fp8lab``: the same command line as the ``fp8lab`` script."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
