"""The documentation against the code: every option of ``python -m api serve`` documented with
its variable and default, every command the docs name runs with the flags they give it, every
relative link lands on a file (and heading).

Fast and offline: parsers are built and ``--help`` is run in this process; nothing starts.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import runpy
import sys
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from api.config import OPTIONS, add_arguments, from_args, load_file

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
CONFIG_DOC = DOCS / "configuration.md"
README_MAX_LINES = 400

CODE_SPAN = re.compile(r"`([^`]+)`")


def pages() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def shown(path: Path) -> str:
    """A page's name in a failure message: relative to the repository when inside it."""
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


# --- options ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class DocumentedOption:
    flags: tuple[str, ...]
    variable: str
    file_key: str | None  # None: documented as having none (—)
    default: str | None  # the first code span of the default cell; None: documented as none
    line: int


def documented_options(text: str) -> list[DocumentedOption]:
    """The rows of every table headed ``| flag | variable | file key | default | meaning |`` (in
    any order; ``file key`` may be left out) whose first cell names flags."""
    found = []
    columns: dict[str, int] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.lstrip().startswith("|"):
            columns = {}
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells and cells[0] == "flag":
            columns = {name: i for i, name in enumerate(cells)}
            continue
        flags = tuple(f for f in CODE_SPAN.findall(cells[0]) if f.startswith("--"))
        if not flags or not {"variable", "default"} <= set(columns):
            continue

        cell = {name: cells[i] for name, i in columns.items() if i < len(cells)}
        variables = CODE_SPAN.findall(cell.get("variable", ""))
        keys = CODE_SPAN.findall(cell.get("file key", ""))
        spans = CODE_SPAN.findall(cell.get("default", ""))
        none = cell.get("default", "").lower().startswith("none")
        found.append(
            DocumentedOption(
                flags,
                variables[0] if variables else cell.get("variable", ""),
                keys[0] if keys else None,
                None if none or not spans else spans[0],
                number,
            )
        )
    return found


@dataclass(frozen=True)
class ParserOption:
    """One flag of ``python -m api serve`` as the parser and the configuration define it."""

    flags: tuple[str, ...]  # the primary first: ``--shadow``, ``--no-shadow``
    variable: str
    file_key: str | None  # its key in the --config file; None: it has none
    default: object  # what the sidecar runs when neither flag, variable nor file gives one
    help: str


def serve_options(monkeypatch: pytest.MonkeyPatch) -> dict[str, ParserOption]:
    """Every flag of ``python -m api serve`` by its dest, with its variable and its default: the
    value the configuration takes when nothing sets it (no flag, no SIDECAR_* variable, no file),
    read from the configuration tree, since the parser leaves unset flags as None to resolve them
    later; ``--config`` and any flag outside the tree keep the parser's own default."""
    for name in list(os.environ):
        if name.startswith("SIDECAR_"):
            monkeypatch.delenv(name)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    parser = argparse.ArgumentParser(prog="python -m api serve")
    add_arguments(parser)
    config = from_args(parser.parse_args([]), environ={})
    in_tree = {o.dest: o for o in OPTIONS}
    found = {}
    for action in parser._actions:
        if not action.option_strings or action.dest == "help":
            continue
        default: object = action.default
        file_key = in_tree[action.dest].file_key if action.dest in in_tree else None
        if action.dest in in_tree:
            default = config
            for key in in_tree[action.dest].path:
                default = getattr(default, key)
        named = re.search(r"\b(SIDECAR_[A-Z0-9_]+)", action.help or "")
        variable = named.group(1) if named else "SIDECAR_" + action.dest.upper()
        help_text = re.sub(r"\s*\(env SIDECAR_[^)]*\)\s*$", "", action.help or "")
        found[action.dest] = ParserOption(
            tuple(action.option_strings), variable, file_key, default, help_text
        )
    return found


def render(value: object) -> str:
    """A default as the docs write it."""
    if value is None or value == ():
        return "none"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, tuple):
        return ",".join(map(str, value))
    if isinstance(value, Path):
        home = str(Path.home())
        return "~" + str(value)[len(home) :] if str(value).startswith(home) else str(value)
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def same_default(value: object, documented: str | None) -> bool:
    """Whether the docs' default (None: documented as none) is ``value``."""
    if documented is None:
        return value is None or value == ()
    if isinstance(value, bool):
        return documented == ("on" if value else "off")
    if isinstance(value, tuple):
        return documented == ",".join(map(str, value))
    if isinstance(value, Path):
        return Path(os.path.expanduser(documented)) == value
    if isinstance(value, int | float):
        try:
            return float(documented) == value
        except ValueError:
            return False
    return documented == str(value)


def suggested_row(option: ParserOption) -> str:
    default = render(option.default)
    default = default if default == "none" else f"`{default}`"
    flags = ", ".join(f"`{f}`" for f in option.flags)
    key = f"`{option.file_key}`" if option.file_key else "—"
    return f"| {flags} | `{option.variable}` | {key} | {default} | {option.help} |"


def test_every_serve_option_is_documented_with_its_variable_and_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    parsed = serve_options(monkeypatch)
    rows = documented_options(CONFIG_DOC.read_text())
    by_flag = {flag: row for row in rows for flag in row.flags}
    where = CONFIG_DOC.relative_to(ROOT)
    problems = []
    for option in parsed.values():
        primary = option.flags[0]
        row = by_flag.get(primary)
        if row is None:
            problems.append(f"{primary} is not in {where}; add a row:\n    {suggested_row(option)}")
            continue
        if row.variable != option.variable:
            problems.append(
                f"{primary} ({where}:{row.line}): documented variable {row.variable}, "
                f"the parser's is {option.variable}"
            )
        if row.file_key != option.file_key:
            problems.append(
                f"{primary} ({where}:{row.line}): documented file key {row.file_key or '—'}, "
                f"the configuration's is {option.file_key or '— (none)'}"
            )
        if not same_default(option.default, row.default):
            problems.append(
                f"{primary} ({where}:{row.line}): documented default "
                f"{row.default if row.default is not None else 'none'}, "
                f"the configuration's is {render(option.default)} ({option.default!r})"
            )
    known = {flag for option in parsed.values() for flag in option.flags}
    for row in rows:
        for flag in row.flags:
            if flag not in known:
                problems.append(
                    f"{flag} ({where}:{row.line}) is documented but python -m api serve has no "
                    "such flag: remove the row or rename it"
                )
    documented = [flag for row in rows for flag in row.flags]
    twice = sorted({f for f in documented if documented.count(f) > 1})
    if twice:
        problems.append(f"documented more than once in {where}: {', '.join(twice)}")
    assert not problems, "\n".join(problems)


def test_the_option_check_sees_a_wrong_default(monkeypatch: pytest.MonkeyPatch) -> None:
    """The comparison itself: the rows it parses and the defaults it rejects."""
    parsed = serve_options(monkeypatch)
    rows = documented_options(
        "| flag | variable | file key | default | meaning |\n| --- | --- | --- | --- | --- |\n"
        "| `--policy` | `SIDECAR_POLICY` | `policy.name` | `slack` | the policy |\n"
        "| `--shadow`, `--no-shadow` | `SIDECAR_SHADOW` | `shadow` | `off` | x |\n"
        "\n| flag | variable | default | meaning |\n| --- | --- | --- | --- |\n"
        "| `--slo-ms` | `SIDECAR_SLO_MS` | `100` (ms) | x |\n"
        "| `--table` | `SIDECAR_TABLE` | none (profiled) | x |\n"
    )
    assert [r.flags for r in rows] == [
        ("--policy",),
        ("--shadow", "--no-shadow"),
        ("--slo-ms",),
        ("--table",),
    ]
    assert [r.file_key for r in rows] == ["policy.name", "shadow", None, None]
    assert parsed["policy"].default == "adaptive"
    assert parsed["policy"].file_key == "policy.name"
    assert parsed["config"].file_key is None
    assert not same_default(parsed["policy"].default, rows[0].default)
    assert same_default(parsed["shadow"].default, rows[1].default)
    assert same_default(parsed["slo_ms"].default, rows[2].default)
    assert same_default(parsed["table"].default, rows[3].default)
    assert not same_default(parsed["slo_ms"].default, "50")
    assert not same_default(parsed["learn"].default, "off")
    assert same_default(parsed["state_dir"].default, "~/.cache/energy-sidecar")
    assert suggested_row(parsed["max_queue"]).startswith(
        "| `--max-queue` | `SIDECAR_MAX_QUEUE` | `scheduler.max_queue` | `1000` | requests waiting"
    )


def test_the_documented_config_file_loads(tmp_path: Path) -> None:
    """The example under "The configuration file" is a file the sidecar accepts."""
    text = CONFIG_DOC.read_text()
    section = text[text.index("## The configuration file") :]
    example = section[section.index("```toml") + len("```toml") : section.index("```\n\n")]
    path = tmp_path / "sidecar.toml"
    path.write_text(example)
    leaves = load_file(path)
    assert leaves["scheduler.default_slo_ms"] == 50.0
    assert leaves["policy.name"] == "adaptive"
    assert leaves["shadow"] is True


# --- commands ---------------------------------------------------------------------------------

PYTHON_M = re.compile(r"\bpython[0-9.]* -m ([A-Za-z_][\w.]*)(.*)")
MAKE = re.compile(r"(?:^|[\s;&(])make ([a-z][\w-]*)")
SHELL_END = re.compile(r"\s(?:\||&&|;|#|>|2>)\s|\s#")


@dataclass(frozen=True)
class Command:
    module: str
    words: tuple[str, ...]
    where: str


def code_of(text: str) -> Iterator[tuple[int, str]]:
    """Code in a Markdown file: each code-block line (continuation lines joined) and each
    inline code span, with its line number."""
    in_block = False
    pending = ""
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            in_block = not in_block
            continue
        if in_block:
            pending += line.rstrip()
            if pending.endswith("\\"):
                pending = pending[:-1] + " "
                continue
            yield number, pending
            pending = ""
        else:
            for span in CODE_SPAN.findall(line):
                yield number, span


def commands(path: Path) -> list[Command]:
    found = []
    for number, code in code_of(path.read_text()):
        for match in PYTHON_M.finditer(code):
            rest = SHELL_END.split(" " + match.group(2))[0]
            words = tuple(w.strip("[](),'\"") for w in rest.split())
            found.append(Command(match.group(1).rstrip("."), words, f"{shown(path)}:{number}"))
    return found


def make_targets(path: Path) -> list[tuple[str, str]]:
    return [
        (m.group(1), f"{shown(path)}:{number}")
        for number, code in code_of(path.read_text())
        for m in MAKE.finditer(code)
    ]


def help_of(module: str, words: list[str]) -> str | None:
    """``python -m module *words --help``, run in this process; None if it is not a command."""
    out = io.StringIO()
    argv = sys.argv
    sys.argv = [module, *words, "--help"]
    try:
        with (
            contextlib.redirect_stdout(out),
            contextlib.redirect_stderr(io.StringIO()),
            warnings.catch_warnings(),
        ):
            warnings.simplefilter("ignore", RuntimeWarning)  # a module already imported
            runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as done:
        if done.code not in (0, None):
            return None
    except ImportError:
        return None
    finally:
        sys.argv = argv
    return out.getvalue()


def subcommands(usage: str) -> set[str]:
    """The choices of the first ``{a,b,c}`` in a usage text (none: no subcommands)."""
    match = re.search(r"\{([\w,-]+)\}", usage)
    return set(match.group(1).split(",")) if match else set()


def long_flags(text: str) -> set[str]:
    return set(re.findall(r"(?<![\w-])--[a-z][\w-]*", text))


def test_every_command_in_the_docs_exists_with_its_flags() -> None:
    problems = []
    helps: dict[tuple[str, ...], str | None] = {}

    def cached(module: str, *words: str) -> str | None:
        key = (module, *words)
        if key not in helps:
            helps[key] = help_of(module, list(words))
        return helps[key]

    for path in pages():
        for cmd in commands(path):
            top = cached(cmd.module)
            if top is None:
                problems.append(f"{cmd.where}: python -m {cmd.module} is not a runnable module")
                continue
            subs = subcommands(top.split("\n\n")[0])
            helps_to_check = [top]
            first = cmd.words[0] if cmd.words else ""
            if subs and first and not first.startswith("-") and re.fullmatch(r"[\w|-]+", first):
                named = first.split("|")
                for sub in named:
                    if sub not in subs:
                        problems.append(
                            f"{cmd.where}: python -m {cmd.module} has no command {sub!r} "
                            f"(it has {', '.join(sorted(subs))})"
                        )
                if len(named) == 1 and named[0] in subs:
                    helps_to_check = [cached(cmd.module, named[0]) or ""]
            flags = {w.split("=")[0] for w in cmd.words if re.fullmatch(r"--[a-z][\w-]*(=.*)?", w)}
            known = set().union(*(long_flags(h) for h in helps_to_check))
            for flag in sorted(flags - known):
                problems.append(f"{cmd.where}: python -m {cmd.module} has no flag {flag}")
    assert not problems, "\n".join(problems)


def test_every_make_target_in_the_docs_exists() -> None:
    makefile = (ROOT / "Makefile").read_text()
    targets = set(re.findall(r"^([A-Za-z][\w-]*)\s*:(?!=)", makefile, re.MULTILINE))
    problems = [
        f"{where}: make {target}: no such target in the Makefile"
        for path in pages()
        for target, where in make_targets(path)
        if target not in targets
    ]
    assert not problems, "\n".join(problems)


def test_the_command_check_finds_commands_and_flags(tmp_path: Path) -> None:
    page = tmp_path / "probe.md"
    page.write_text(
        "Run `python -m scheduler simulate|compare --gpu v100` or\n\n"
        "```sh\nsudo .venv/bin/python -m api serve --shadow \\\n"
        "     --triton-url 127.0.0.1:8010   # a comment --not-a-flag\nmake demo\n```\n"
    )
    found, targets = commands(page), make_targets(page)
    assert [(c.module, c.words) for c in found] == [
        ("scheduler", ("simulate|compare", "--gpu", "v100")),
        ("api", ("serve", "--shadow", "--triton-url", "127.0.0.1:8010")),
    ]
    assert [t for t, _ in targets] == ["demo"]
    scheduler_help = help_of("scheduler", [])
    assert scheduler_help is not None
    assert {"simulate", "compare", "tune", "bench"} <= subcommands(scheduler_help)
    assert "--gpu" in long_flags(help_of("scheduler", ["simulate"]) or "")
    assert help_of("no_such_module_here", []) is None


# --- the README and the links -----------------------------------------------------------------


def test_readme_is_short() -> None:
    lines = len(README.read_text().splitlines())
    assert lines < README_MAX_LINES, (
        f"README.md has {lines} lines; keep it under {README_MAX_LINES} and move reference "
        "material to docs/"
    )


LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = re.sub(r"`|\*\*", "", heading.strip().lower())
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    found: set[str] = set()
    in_block = False
    for line in path.read_text().splitlines():
        if line.lstrip().startswith("```"):
            in_block = not in_block
        elif not in_block and line.startswith("#"):
            base = slug(line.lstrip("#"))
            n, name = 0, base
            while name in found:
                n += 1
                name = f"{base}-{n}"
            found.add(name)
    return found


def test_every_relative_link_lands() -> None:
    problems = []
    for path in pages():
        text = re.sub(r"```.*?```", "", path.read_text(), flags=re.DOTALL)
        for match in LINK.finditer(text):
            target = match.group(1) or match.group(2)
            if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
                continue
            file_part, _, fragment = target.partition("#")
            dest = (path.parent / file_part).resolve() if file_part else path
            where = shown(path)
            if not dest.exists():
                problems.append(f"{where}: link to {target}: no such file")
            elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
                problems.append(f"{where}: link to {target}: no heading #{fragment} there")
    assert not problems, "\n".join(problems)


def test_anchors_follow_github() -> None:
    assert slug("Shadow mode (`--shadow`, `SIDECAR_SHADOW=1`): watch before it acts") == (
        "shadow-mode---shadow-sidecar_shadow1-watch-before-it-acts"
    )
    assert slug("The GPU, the policy and the tables") == "the-gpu-the-policy-and-the-tables"


def test_the_index_lists_every_page() -> None:
    index = (DOCS / "index.md").read_text()
    linked = {m.group(1).partition("#")[0] for m in LINK.finditer(index) if m.group(1)}
    pages_here = {p.name for p in DOCS.glob("*.md")} - {"index.md"}
    missing = sorted(pages_here - linked)
    assert not missing, f"docs/index.md does not list: {', '.join(missing)}"
