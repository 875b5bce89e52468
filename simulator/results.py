"""Results files: what a command measured, with the commit and the machine it ran on.

A command that measures prints its figures and also writes them with :func:`write_results`:
``<dir>/<name>.md`` (a provenance header, then the command's own Markdown) and
``<dir>/<name>.json`` (the same provenance, and the figures as data). A figure quoted anywhere
can then be traced to the command line, the commit (and whether the tree had local changes), the
date and the machine (CPU model, cores, memory, load, Python) that produced it. Each run replaces
the files of the previous run of the same name.
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

DEFAULT_DIR = Path("results")
# The source tree whose commit a result belongs to: the one this module was loaded from.
SOURCE_ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Machine:
    """Where a measurement ran: what a reader needs to compare two results."""

    cpu_model: str
    cpus: int  # logical CPUs in the machine
    cpus_usable: int  # of those, the ones this process may run on
    memory_gib: float | None
    load_avg_1m: float | None  # when the command started: a shared machine shows here
    python: str
    platform: str


@dataclass(frozen=True)
class Provenance:
    """A result's origin: the command line, the code, when, and where."""

    command: str
    commit: str | None  # None outside a git checkout
    dirty: bool | None  # tracked files outside results/ changed since that commit
    date: str  # ISO 8601, UTC
    machine: Machine


def _cpu_model(cpuinfo: Path) -> str:
    try:
        for line in cpuinfo.read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Model", "Hardware") and value.strip():
                return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def _memory_gib(meminfo: Path) -> float | None:
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)  # kB
    except (OSError, ValueError, IndexError):
        pass
    return None


def describe_machine(proc: Path = Path("/proc")) -> Machine:
    """The machine this process runs on (``proc``: where to read Linux's cpuinfo and meminfo)."""
    cpus = os.cpu_count() or 1
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        usable = cpus
    try:
        load: float | None = round(os.getloadavg()[0], 2)
    except OSError:
        load = None
    return Machine(
        cpu_model=_cpu_model(proc / "cpuinfo"),
        cpus=cpus,
        cpus_usable=usable,
        memory_gib=_memory_gib(proc / "meminfo"),
        load_avg_1m=load,
        python=f"{platform.python_implementation()} {platform.python_version()}",
        platform=platform.platform(),
    )


def git_commit(root: Path = SOURCE_ROOT) -> tuple[str | None, bool | None]:
    """The commit checked out at ``root`` and whether tracked files differ from it, those
    under ``results/`` aside (what the benchmarks write, not the code that gives it: a page
    written after another in the same checkout is not marked for it); (None, None) when
    ``root`` is not a git checkout or git is missing."""

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(
                ["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if commit is None:
        return None, None
    status = git("status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)results")
    return commit, (bool(status) if status is not None else None)


def provenance(
    argv: Sequence[str] | None = None,
    *,
    now: datetime | None = None,
    root: Path = SOURCE_ROOT,
) -> Provenance:
    """Where a result comes from; ``argv`` defaults to this process's command line."""
    args = list(sys.argv if argv is None else argv)
    if args and args[0].endswith(".py"):  # ``python -m pkg.mod`` shows as its file
        module = _module_of(Path(args[0]))
        args[0] = f"python -m {module}" if module else args[0]
    commit, dirty = git_commit(root)
    return Provenance(
        command=" ".join([args[0], *map(shlex.quote, args[1:])]) if args else "",
        commit=commit,
        dirty=dirty,
        date=(now or datetime.now(UTC)).isoformat(timespec="seconds"),
        machine=describe_machine(),
    )


def _module_of(path: Path) -> str | None:
    try:
        rel = path.resolve().relative_to(SOURCE_ROOT)
    except ValueError:
        return None
    parts = list(rel.with_suffix("").parts)
    if parts and parts[-1] == "__main__":
        parts.pop()
    return ".".join(parts) or None


def markdown_table(head: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A Markdown table; cells are written with ``str``."""
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def header(title: str, prov: Provenance) -> str:
    """The Markdown lines that open a results file: what ran, which code, when, where."""
    m = prov.machine
    if prov.commit is None:
        code = "not a git checkout"
    else:
        code = f"`{prov.commit[:12]}`" + (" with local changes" if prov.dirty else "")
    load = f", load {m.load_avg_1m:g} at start" if m.load_avg_1m is not None else ""
    memory = f", {m.memory_gib:g} GiB" if m.memory_gib is not None else ""
    return "\n".join(
        [
            f"# {title}",
            "",
            f"- command: `{prov.command}`",
            f"- commit: {code}",
            f"- date: {prov.date}",
            f"- machine: {m.cpu_model}, {m.cpus} CPUs ({m.cpus_usable} usable){memory}{load}",
            f"- Python: {m.python} on {m.platform}",
        ]
    )


def write_results(
    name: str,
    *,
    title: str,
    markdown: str,
    data: Mapping[str, object],
    directory: Path = DEFAULT_DIR,
    prov: Provenance | None = None,
) -> tuple[Path, Path]:
    """Write ``<directory>/<name>.md`` and ``.json`` (replacing an earlier run's); return both
    paths. ``data`` goes under ``"results"``: JSON types, with anything else (a ``Path``) written
    as its ``str``."""
    prov = prov or provenance()
    directory.mkdir(parents=True, exist_ok=True)
    md, js = directory / f"{name}.md", directory / f"{name}.json"
    md.write_text(header(title, prov) + "\n\n" + markdown.rstrip() + "\n")
    payload = {"title": title, "provenance": asdict(prov), "results": data}
    js.write_text(json.dumps(payload, indent=2, ensure_ascii=False, default=str) + "\n")
    return md, js
