"""``python -m workers.stack.reservation [--host H] [--port P] [--db FILE] [--capacity NAME=UNITS]``."""

from __future__ import annotations

import sys

from workers.stack.reservation.server import main

if __name__ == "__main__":
    sys.exit(main())
