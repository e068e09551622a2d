"""The documentation tells the truth about the commands it quotes and the figures it reports.

Three checks over README.md and docs/**/*.md (issue 47, "docs made true, and kept true"):

- every ``bench/<script>.py`` command quoted in a code span or a fenced block names a script that exists,
  and every ``--flag`` quoted with it is an option of that script's argument parser (each script is run
  once with ``--help``, all of them in one helper process, and the parser it builds is read);
- every ``fleetsight <sub> <sub> --flag`` command (also ``.venv/bin/fleetsight ...`` and
  ``python -m fleetsight.cli ...``) names a sub-command path of the CLI and options that path accepts;
- every README paragraph, list item or table row that reports a measured figure (a number with a unit:
  s, ms, µs, minutes, CPU-s, %, GiB, cores, lines/s, ...) cites a footnote (``[^name]``), and that
  footnote says when the figure was measured and with which command: ``measured YYYY-MM-DD`` and the
  command in a code span (README's last section, "Where the figures come from").

In a quoted command ``a|b`` (``a\\|b`` in a table) means "a or b": each is checked. Placeholders such as
``<node>``, ``FILE``, ``...`` and brackets around optional flags (``[--dry-run]``) are allowed. A command
that no longer exists may still be named as history, struck through: ``~~`fleetsight rules evaluate`~~``.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import click
import pytest

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
ALT = "\x00"  # stands for an escaped or unspaced "|" inside a token: alternatives, not a shell pipe

# Words that run the command after them (with their own options), and the options that take a value.
WRAPPERS = {"nice", "sudo", "timeout", "time", "exec", "env", "taskset", "ionice", "uv", "run"}
WRAPPER_VALUE_OPTIONS = {"-n", "-u", "-c", "-g", "-k", "-s", "--signal"}
PYTHON = re.compile(r"^python(3(\.\d+)?)?$")
PYTHON_OPTIONS = {"-u": False, "-O": False, "-B": False, "-X": True, "-W": True}  # option: takes a value


@dataclass(frozen=True)
class Quote:
    """One command quoted in a document: where it is and its words."""

    doc: str
    line: int
    text: str
    words: tuple[str, ...]

    def where(self) -> str:
        return f"{self.doc}:{self.line}: `{self.text.replace(ALT, '|')}`"


# --------------------------------------------------------------------------------------------------
# Reading the documents


def documents() -> list[Path]:
    return [README, *sorted((REPO / "docs").rglob("*.md"))]


def code_texts(path: Path) -> Iterator[tuple[int, str]]:
    """Every code span and every command of a fenced block, with its line number. A fenced block's
    lines continued with a trailing backslash are joined into one command."""
    fence: str | None = None
    pending: tuple[int, str] | None = None
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        stripped = line.strip()
        if fence is None:
            opening = re.match(r"^(`{3,}|~{3,})", stripped)
            if opening:
                fence = opening.group(1)
                continue
            for match in re.finditer(r"(~~)?(`+)(.+?)(?<!`)\2(?!`)(~~)?", line):
                if not (match.group(1) and match.group(4)):  # ~~`old command`~~: retired, quoted as such
                    yield number, match.group(3).strip()
            continue
        if stripped.startswith(fence):
            fence = None
            if pending:
                yield pending
            pending = None
            continue
        start, text = pending if pending else (number, "")
        text = f"{text} {line.strip()}".strip()
        if text.endswith("\\"):
            pending = (start, text[:-1].rstrip())
        else:
            pending = None
            yield start, text


def segments(text: str) -> Iterator[str]:
    """The simple commands of a shell line: split at ;, &&, ||, spaced pipes and command substitution.
    A "|" with no space around it (or escaped, as tables must) joins alternatives."""
    text = text.replace("\\|", ALT)
    text = re.sub(r"(?<=\S)\|(?=\S)", ALT, text)
    yield from (part for part in re.split(r"&&|\|\||;|\s\|\s|\$\(|\)|`", text) if part.strip())


def words_of(segment: str) -> list[str]:
    """Shell words, comments dropped; prose that is no valid shell (an odd quote) splits at spaces."""
    try:
        return shlex.split(segment, comments=True)
    except ValueError:
        return segment.split("#", 1)[0].split()


def command_words(words: list[str]) -> list[str]:
    """The words from the program on: leading VAR=value assignments, a "$ " prompt and wrappers such
    as ``nice -n 10``, ``timeout 60`` or ``uv run`` dropped."""
    index = 0
    while index < len(words):
        word = words[index]
        if word == "$" or re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", word):
            index += 1
        elif word in WRAPPERS:
            index += 1
            while index < len(words) and words[index].startswith("-"):
                index += 2 if words[index] in WRAPPER_VALUE_OPTIONS else 1
            if word in {"timeout", "taskset"} and index < len(words):
                index += 1  # the duration, or the CPU list
        else:
            break
    return words[index:]


@cache
def quotes(kind: str) -> tuple[Quote, ...]:
    """Every quoted command of one kind ("bench" or "fleetsight") in every document, its words starting
    after the program (a bench command's first word is the script)."""
    found = []
    for path in documents():
        doc = str(path.relative_to(REPO))
        for line, text in code_texts(path):
            for segment in segments(text):
                words = command_words(words_of(segment))
                rest = program_arguments(words, kind)
                if rest is not None:
                    found.append(Quote(doc, line, segment.strip(), tuple(rest)))
    return tuple(found)


def program_arguments(words: list[str], kind: str) -> list[str] | None:
    """The words after the program when the command runs that kind of program, else None. A bench
    command keeps its script as its first word."""
    if words and PYTHON.match(Path(words[0]).name):
        words = words[1:]
        while words and words[0] in PYTHON_OPTIONS:
            words = words[2:] if PYTHON_OPTIONS[words[0]] else words[1:]
        if words[:2] == ["-m", "fleetsight.cli"]:
            return words[2:] if kind == "fleetsight" else None
    if not words:
        return None
    if kind == "fleetsight" and Path(words[0]).name == "fleetsight" and not words[0].endswith("/"):
        return words[1:]
    if kind == "bench" and re.match(r"^(\./)?bench/[\w.-]+\.py$", words[0]):
        return [words[0].removeprefix("./"), *words[1:]]
    return None


def flags(words: tuple[str, ...]) -> Iterator[str]:
    """The options among a command's words (``--name``, ``--name=value``, ``-x``), brackets of optional
    ones dropped; stops at ``--`` and at a redirection."""
    for word in words:
        if word in {"--", "<"} or re.match(r"^\d?>", word):
            return
        for option in word.strip("[](),").split(ALT):
            if re.match(r"^--[A-Za-z0-9][\w.-]*(=.*)?$", option) or re.match(r"^-[A-Za-z]$", option):
                yield option.split("=", 1)[0]


# --------------------------------------------------------------------------------------------------
# What the programs accept


BENCH_PROBE = r"""
import argparse, contextlib, io, json, runpy, sys
from pathlib import Path

class Parsed(BaseException):
    pass

found = {}

def record(parser, args=None, namespace=None):
    found["options"] = sorted(parser._option_string_actions)
    raise Parsed

argparse.ArgumentParser.parse_known_args = record
results = {}
for script in sys.argv[1:]:
    found.clear()
    path = Path(script).resolve()
    sys.argv = [str(path), "--help"]
    sys.path.insert(0, str(path.parent))
    out = io.StringIO()
    error = None
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            runpy.run_path(str(path), run_name="__main__")
    except Parsed:
        pass
    except SystemExit as exc:
        if not found and exc.code not in (0, None):
            error = f"exited {exc.code} before parsing its arguments"
    except BaseException as exc:
        error = f"{type(exc).__name__}: {exc}"
    finally:
        if str(path.parent) in sys.path:
            sys.path.remove(str(path.parent))
    results[script] = {"options": found.get("options"), "error": error, "output": out.getvalue()[-2000:]}
print("BENCH-PROBE " + json.dumps(results))
"""


@cache
def bench_probe() -> subprocess.Popen[str]:
    """Each quoted bench script run with --help, all in one process (run as __main__ one after the
    other, so their imports are paid once), which prints the options of the parser each one builds."""
    scripts = sorted({quote.words[0] for quote in quotes("bench") if (REPO / quote.words[0]).is_file()})
    return subprocess.Popen(
        [sys.executable, "-c", BENCH_PROBE, *scripts],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.fixture(scope="module", autouse=True)
def bench_probe_stopped() -> Iterator[None]:
    """A probe still running when the module's tests end (one failed early) is stopped."""
    yield
    if bench_probe.cache_info().currsize:
        process = bench_probe()
        if process.poll() is None:
            process.kill()
            process.communicate()


@cache
def bench_options() -> dict[str, dict]:
    """Script -> {"options": its parser's option strings (None: it builds no parser), "error": why its
    --help failed, "output": what it printed}."""
    process = bench_probe()
    stdout, stderr = process.communicate(timeout=300)
    marker = [line for line in stdout.splitlines() if line.startswith("BENCH-PROBE ")]
    assert marker, f"the bench probe failed (exit {process.returncode}):\n{stdout[-3000:]}{stderr[-3000:]}"
    return json.loads(marker[-1].removeprefix("BENCH-PROBE "))


@dataclass(frozen=True)
class CliNode:
    options: frozenset[str]
    subcommands: frozenset[str] | None  # None: a command, not a group
    broken: str | None = None  # why the command could not be loaded


@cache
def cli_tree() -> dict[tuple[str, ...], CliNode]:
    """Every sub-command path of ``fleetsight`` with its options and sub-commands (the same objects its
    --help is printed from)."""
    from fleetsight.cli import main

    tree: dict[tuple[str, ...], CliNode] = {}

    def walk(command: click.Command, context: click.Context, path: tuple[str, ...]) -> None:
        options = {
            name
            for param in command.params
            if isinstance(param, click.Option)
            for name in (*param.opts, *param.secondary_opts)
        }
        options |= set(command.get_help_option_names(context))
        subcommands = None
        if isinstance(command, click.Group):
            subcommands = frozenset(command.list_commands(context))
            for name in subcommands:
                try:
                    sub = command.get_command(context, name)
                except Exception as exc:  # a module that fails to import: reported where it is quoted
                    tree[(*path, name)] = CliNode(frozenset(), None, f"{type(exc).__name__}: {exc}")
                    continue
                if sub is None:
                    tree[(*path, name)] = CliNode(frozenset(), None, "listed, but loads no command")
                    continue
                walk(sub, click.Context(sub, parent=context, info_name=name), (*path, name))
        tree[path] = CliNode(frozenset(options), subcommands)

    walk(main, click.Context(main, info_name="fleetsight"), ())
    return tree


# --------------------------------------------------------------------------------------------------
# (b) fleetsight commands (first, so that the bench probe of (a) runs meanwhile)


def cli_paths(words: tuple[str, ...]) -> Iterator[tuple[tuple[str, ...], list[str], str | None]]:
    """Each sub-command path a quote spells (alternatives expand), the words after it and, where a word
    names no sub-command of a group, what is wrong."""
    tree = cli_tree()

    def walk(
        path: tuple[str, ...], rest: list[str]
    ) -> Iterator[tuple[tuple[str, ...], list[str], str | None]]:
        node = tree[path]
        index = 0
        while index < len(rest) and rest[index].startswith("-"):
            index += 1  # the group's own options (checked with the rest)
        if node.subcommands is None or index >= len(rest):
            yield path, rest, None
            return
        word = rest[index]
        if word in {"...", "…"} or word.startswith(("<", "[", "{")) or word.isupper():
            yield path, rest, None  # a placeholder for any sub-command
            return
        for name in word.split(ALT):
            if name in node.subcommands:
                yield from walk((*path, name), rest[:index] + rest[index + 1 :])
            else:
                known = ", ".join(sorted(node.subcommands))
                yield (
                    path,
                    rest,
                    f"`fleetsight {' '.join(path)}` has no sub-command {name!r} (it has {known})",
                )

    yield from walk((), list(words))


def test_every_quoted_fleetsight_command_exists_with_its_flags() -> None:
    bench_probe()  # started now, it runs while this test walks the CLI: (a) then finds it done
    problems = []
    broken: dict[tuple[str, ...], list[str]] = {}  # a command that fails to load: where it is quoted
    tree = cli_tree()
    for quote in quotes("fleetsight"):
        for path, rest, error in cli_paths(quote.words):
            if error:
                problems.append(f"{quote.where()}: {error}")
            elif tree[path].broken:
                broken.setdefault(path, []).append(f"{quote.doc}:{quote.line}")
            else:
                accepted = set().union(*(tree[path[:depth]].options for depth in range(len(path) + 1)))
                unknown = sorted({flag for flag in flags(tuple(rest)) if flag not in accepted})
                if unknown:
                    known = ", ".join(sorted(o for o in tree[path].options if o.startswith("--")))
                    problems.append(
                        f"{quote.where()}: `fleetsight {' '.join(path)}` has no option "
                        f"{', '.join(unknown)} (it has {known})"
                    )
    for path, places in broken.items():
        problems.append(
            f"`fleetsight {' '.join(path)}` fails to load ({tree[path].broken}), so the {len(places)} "
            f"quotes of it cannot be checked: {', '.join(places[:3])}{', ...' if len(places) > 3 else ''}"
        )
    assert not problems, "quoted fleetsight commands that are not true:\n" + "\n".join(problems)


# --------------------------------------------------------------------------------------------------
# (a) bench commands


def test_every_quoted_bench_command_names_a_script_and_its_flags() -> None:
    problems = []
    for quote in quotes("bench"):
        script = quote.words[0]
        if not (REPO / script).is_file():
            problems.append(f"{quote.where()}: {script} does not exist")
            continue
        probe = bench_options()[script]
        quoted = sorted(set(flags(quote.words[1:])))
        if not quoted:
            continue
        if probe["options"] is None:
            why = probe["error"] or "it builds no argument parser"
            problems.append(f"{quote.where()}: {script} --help tells nothing ({why}): {probe['output']}")
            continue
        unknown = [flag for flag in quoted if flag not in probe["options"]]
        if unknown:
            problems.append(
                f"{quote.where()}: {script} has no option {', '.join(unknown)} "
                f"(it has {', '.join(o for o in probe['options'] if o.startswith('--'))})"
            )
    assert not problems, "quoted bench commands that are not true:\n" + "\n".join(problems)


def test_every_bench_script_answers_help_without_servers() -> None:
    """--help of every quoted bench script works on a bare machine (no server running): the check above
    relies on it, and so does a reader who wants to know what a script measures."""
    failures = [f"{script}: {probe['error']}" for script, probe in bench_options().items() if probe["error"]]
    assert not failures, "bench scripts whose --help fails:\n" + "\n".join(failures)


# --------------------------------------------------------------------------------------------------
# (c) README's measured figures

NUMBER = r"(?<![\w@.,/-])\d[\d,]*(?:\.\d+)?(?:\s?(?:-|–|to)\s?\d[\d,]*(?:\.\d+)?)?"
UNIT = (
    r"(?:CPU-s|CPU-µs|CPU-ms|core-s|millicores|cores?|ms|µs|us|s|min|minutes?|hours?|%|GiB|GB|MiB|MB|KiB|kB"
    r"|TiB|TB|lines/s|samples/s|docs/s|requests/s)"
)
FIGURE = re.compile(rf"~?{NUMBER}\s?{UNIT}(?![\w/-])")
FOOTNOTE_REF = re.compile(r"\[\^([\w-]+)\](?!:)")
FOOTNOTE_DEF = re.compile(r"^\[\^([\w-]+)\]:\s*(.*)$")
MEASURED = re.compile(r"measured (?:[^`]*?)?(\d{4}-\d{2}-\d{2})", re.IGNORECASE)


def readme_blocks() -> Iterator[tuple[int, str]]:
    """README's paragraphs, list items and table rows (each with its first line), outside fenced blocks,
    headings and footnote definitions."""
    lines = README.read_text().splitlines()
    in_fence = False
    block: list[str] = []
    start = 0

    def flush() -> Iterator[tuple[int, str]]:
        if block:
            yield start, " ".join(block)
        block.clear()

    for number, line in enumerate(lines, start=1):
        stripped = line.strip()
        if re.match(r"^(`{3,}|~{3,})", stripped):
            yield from flush()
            in_fence = not in_fence
            continue
        if in_fence:
            continue
        new_block = (
            not stripped
            or stripped.startswith(("#", "|", "- ", "* "))
            or re.match(r"^\d+\. ", stripped)
            or FOOTNOTE_DEF.match(stripped)
            or (block and block[0].startswith("|"))
        )
        if new_block:
            yield from flush()
        if not stripped or stripped.startswith("#") or re.match(r"^\|[\s|:-]+\|$", stripped):
            continue
        if not block:
            start = number
        block.append(stripped)
    yield from flush()


def footnotes() -> dict[str, tuple[int, str]]:
    """README's footnote definitions: name -> (line, text with its indented continuation lines)."""
    found: dict[str, tuple[int, str]] = {}
    current: str | None = None
    for number, line in enumerate(README.read_text().splitlines(), start=1):
        definition = FOOTNOTE_DEF.match(line)
        if definition:
            current = definition.group(1)
            found[current] = (number, definition.group(2))
        elif current and line.startswith(("  ", "\t")) and line.strip():
            first, text = found[current]
            found[current] = (first, f"{text} {line.strip()}")
        else:
            current = None
    return found


def prose(block: str) -> str:
    """A block without its code spans, link targets and bare URLs: figures are read from what it says."""
    block = re.sub(r"(`+).+?\1", " ", block)
    block = re.sub(r"\]\([^)]*\)", "]", block)
    return re.sub(r"<?https?://\S+", " ", block)


def test_every_readme_figure_cites_when_and_how_it_was_measured() -> None:
    notes = footnotes()
    problems = []
    for line, block in readme_blocks():
        if FOOTNOTE_DEF.match(block):
            continue
        figures = FIGURE.findall(prose(block))
        refs = FOOTNOTE_REF.findall(block)
        for ref in refs:
            if ref not in notes:
                problems.append(f"README.md:{line}: footnote [^{ref}] is cited but not defined")
        if figures and not refs:
            shown = ", ".join(dict.fromkeys(f.strip() for f in figures))
            problems.append(
                f"README.md:{line}: reports {shown} but cites no footnote [^name] saying when "
                "and with which command it was measured"
            )
    cited = set(FOOTNOTE_REF.findall(README.read_text()))
    for name, (line, text) in notes.items():
        if name not in cited:
            problems.append(f"README.md:{line}: footnote [^{name}] is defined but cited nowhere")
        if not MEASURED.search(text):
            problems.append(f"README.md:{line}: footnote [^{name}] has no 'measured YYYY-MM-DD'")
        commands = [span for span in re.findall(r"`([^`]+)`", text) if is_command(span)]
        if not commands:
            problems.append(f"README.md:{line}: footnote [^{name}] names no command (in a code span)")
    assert not problems, "README figures without their provenance:\n" + "\n".join(problems)


def is_command(span: str) -> bool:
    """A code span that runs something: make, a CI script, fleetsight, python, pytest or a bench script."""
    for segment in segments(span):
        words = command_words(words_of(segment))
        if words and (
            words[0] in {"make", ".ci/run", "pytest"}
            or program_arguments(words, "fleetsight") is not None
            or program_arguments(words, "bench") is not None
            or PYTHON.match(Path(words[0]).name)
            or words[0].startswith(".venv/bin/")
        ):
            return True
    return False


@pytest.mark.parametrize(
    ("text", "kind", "expected"),
    [
        (
            "nice -n 5 .venv/bin/python bench/anomaly_100k.py --nodes 1 --modes recorded",
            "bench",
            ["bench/anomaly_100k.py", "--nodes", "1", "--modes", "recorded"],
        ),
        ("FLEETSIGHT_PORT_BASE=29000 fleetsight up", "fleetsight", ["up"]),
        (".venv/bin/python -m fleetsight.cli health nodes", "fleetsight", ["health", "nodes"]),
        ("kubectl -n fleetsight delete pvc fleetsight-health", "fleetsight", None),
        ("/opt/fleetsight/bin/fleetsight checks run", "fleetsight", ["checks", "run"]),
    ],
)
def test_commands_are_recognised(text: str, kind: str, expected: list[str] | None) -> None:
    """The reader of quoted commands itself: wrappers, assignments and paths of the program."""
    words = command_words(words_of(next(segments(text))))
    assert program_arguments(words, kind) == expected


def test_figures_are_recognised() -> None:
    """What counts as a measured figure: numbers with units, not sizes of the machine's cores in words
    like "2-core" nor hours in "12-hour averages"."""
    assert FIGURE.findall("a cycle takes 3.9 s and 1.64 CPU-s, 8.1 GiB, ~4.5 kB, 17,000-18,700 lines/s")
    assert not FIGURE.findall("a fresh 2-core machine, 12-hour averages, hit@1 0.883, 20 alerts")
