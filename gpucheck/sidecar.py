"""``python -m gpucheck.sidecar ARGS``: ``python -m api serve --shadow ARGS`` with every NVML
write made impossible in the process first (see :mod:`gpucheck.guard`). Shadow mode cannot be
turned off here."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    import pynvml

    from gpucheck.guard import forbid_nvml_writes

    forbid_nvml_writes(pynvml)
    args = list(sys.argv[1:] if argv is None else argv)
    if any(a.startswith("--no-shadow") for a in args):
        print("error: the GPU check's sidecar runs in shadow mode only", file=sys.stderr)
        return 2
    from api.__main__ import main as serve

    return serve(["serve", *args, "--shadow"])


if __name__ == "__main__":
    sys.exit(main())
