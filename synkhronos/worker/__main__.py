"""``python -m synkhronos.worker SESSION PREFIX RANK N_RANKS MASTER_PID BACKEND``."""

import sys

from synkhronos.worker.loop import main

if __name__ == "__main__":  # not when a doctest collector imports this file
    main(sys.argv[1:])
