"""``python -m synkhronos check`` (and ``sweep``): see :mod:`synkhronos.api.machine_check`."""

import logging
import sys

from synkhronos.api.machine_check import main

if __name__ == "__main__":  # not when a doctest collector imports this file
    logging.basicConfig(format="%(message)s")  # the library's warnings, plainly
    sys.exit(main(sys.argv[1:]))
