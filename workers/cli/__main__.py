"""``python -m workers.cli``: the ``cairn`` command."""

import sys

from workers.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
