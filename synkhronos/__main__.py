"""``python -m synkhronos check`` (and ``sweep``): see :mod:`synkhronos.api.machine_check`;
``python -m synkhronos port``: see :mod:`synkhronos.api.porting`."""

import logging
import os
import sys

from synkhronos.api import machine_check, porting

if __name__ == "__main__":  # not when a doctest collector imports this file
    logging.basicConfig(format="%(message)s")  # the library's warnings, plainly
    main = porting.main if sys.argv[1:2] == ["port"] else machine_check.main
    try:
        sys.exit(main(sys.argv[2:] if main is porting.main else sys.argv[1:]))
    except BrokenPipeError:  # the reader went (| head): end quietly, as Python's docs advise
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)
