"""What every ``basics_*`` demo does around its body: parse ``--ranks``, fork, close."""

from __future__ import annotations

import argparse
from collections.abc import Callable

import synkhronos as synk


def run(body: Callable[[int], None], doc: str) -> None:
    """Fork ``--ranks`` ranks, run ``body(n_ranks)``, close, and print "passed"."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2, help="number of ranks (processes)")
    n_ranks = synk.fork(parser.parse_args().ranks)
    try:
        body(n_ranks)
    finally:
        synk.close()
    print("passed")
