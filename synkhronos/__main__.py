"""``python -m synkhronos check`` (and ``sweep``): see :mod:`synkhronos.api.machine_check`."""

import logging
import os
import sys

from synkhronos.api.machine_check import main

if __name__ == "__main__":  # not when a doctest collector imports this file
    logging.basicConfig(format="%(message)s")  # the library's warnings, plainly
    try:
        sys.exit(main(sys.argv[1:]))
    except BrokenPipeError:  # the reader went (| head): end quietly, as Python's docs advise
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)
