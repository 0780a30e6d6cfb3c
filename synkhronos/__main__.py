"""``python -m synkhronos check`` (and ``sweep``): see :mod:`synkhronos.tools.machine_check`;
``python -m synkhronos timeline``: see :mod:`synkhronos.tools.timeline_report`;
``python -m synkhronos port``: see :mod:`synkhronos.tools.porting`."""

import logging
import os
import sys

from synkhronos.tools import machine_check, porting, timeline_report

TOOLS = {"timeline": timeline_report.main, "port": porting.main}  # else machine_check.main

if __name__ == "__main__":  # not when a doctest collector imports this file
    logging.basicConfig(format="%(message)s")  # the library's warnings, plainly
    try:
        tool = TOOLS.get(sys.argv[1] if len(sys.argv) > 1 else "")
        sys.exit(tool(sys.argv[2:]) if tool else machine_check.main(sys.argv[1:]))
    except BrokenPipeError:  # the reader went (| head): end quietly, as Python's docs advise
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)
