"""``python -m scheduler simulate | compare | tune | bench``: the simulator's commands, kept under
the name users know (their code lives in the :mod:`simulator` package, apart from the runtime)."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    from simulator.cli import main as simulator_main

    return simulator_main(argv)


if __name__ == "__main__":
    sys.exit(main())
