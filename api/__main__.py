"""``python -m api serve``: run the sidecar."""

from __future__ import annotations

import argparse
import logging
import sys

from api.config import add_arguments, from_args
from api.embedded import EmbeddedUnavailableError, require_embedded


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m api", description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)
    serve = sub.add_parser("serve", help="run the sidecar (flags or SIDECAR_* variables)")
    add_arguments(serve)
    args = parser.parse_args(argv)
    try:
        config = from_args(args)
        if config.embedded:
            require_embedded()
    except (ValueError, EmbeddedUnavailableError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    from api.server import build_server

    logging.basicConfig(
        level=config.log_level.upper(), format="%(levelname)s %(name)s: %(message)s"
    )
    try:
        server = build_server(config)
    except ValueError as err:  # a bad tenants file
        print(f"error: {err}", file=sys.stderr)
        return 2
    server.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
