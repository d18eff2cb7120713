"""The README executed as a user runs it: every command of every shell block (```bash, ```sh,
```console) and every ```python block of README.md and docs/*.md, each in a fresh process with a
clean environment (a Python block whole, as a script the virtualenv's python runs).

The environment is built from scratch, nothing inherited from the suite (no XLA_FLAGS, no JAX_* or
JAXRL_FRAG_* variable): PATH with .venv/bin first, a temporary HOME and XDG_CACHE_HOME, and one knob,
``JAXRL_FRAG_MAX_STEPS`` (the README's testing paragraph), which caps the environment steps of every
``train`` and ``resume`` run, so that the commands run small. Each document's commands run in order in a
temporary working directory of their own (links to the repository's .venv, Makefile, pyproject.toml,
launch/ and benchmarks/), so a command that reads what an earlier one wrote finds it: a placeholder such
as ``runs/ppo-CartPole-v1-<time>`` stands for the newest path it matches there. Every command must exit
with status 0, and a ```text block after a shell block (what the README says it prints) must be found in
that block's output, in order, numbers and ``<placeholders>`` matching any value, a line matching from
its start (``...`` stands for lines left out).

A command that cannot run here is marked so in the document itself, in an HTML comment right before its
block: ``<!-- not run by the suite: REASON -->`` for the whole block, or
``<!-- not run by the suite, `PART`: REASON -->`` for the block's commands that hold PART; one that
takes 15 s or more even capped (several processes, populations, boosting, Atari, SMAX, MABrax) is marked
``<!-- run by make test-long only: REASON -->`` (the same forms), and the test marked ``long`` runs those.
The test lists what it skips with the reason, and fails on a command that is neither runnable (its
program exists here) nor marked. A command already run from an earlier document is not run again. Every
``train`` and ``resume`` must say on stderr that it capped its steps (but one that shows its own refusal,
``... || echo "exit status $?"``). The commands of ``make test`` take
about 4 to 5 minutes on 2 cores once their programs are cached, those of ``make test-long`` about 7.

``make train`` runs with ``--old-file=.venv/.installed``: the test never reinstalls the virtualenv.
XLA's compiled programs go to a cache of this test's own beside the suite's (linked from the temporary
XDG_CACHE_HOME), so a second run of the suite compiles none of them again.
"""

from __future__ import annotations

import dataclasses
import glob
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import prune

pytestmark = pytest.mark.slow  # real processes, one per command: minutes

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))
MAX_STEPS = 2048  # JAXRL_FRAG_MAX_STEPS: the environment steps of any train or resume run
LINKED = (".venv", "Makefile", "pyproject.toml", "launch", "benchmarks")  # what the commands reach by relative paths
REWRITES = {"make train": "make --old-file=.venv/.installed train"}  # never reinstall .venv from a test
TIMEOUT = 600  # seconds per command
CACHE_BYTES = 2**30  # this test's compilation cache; past this the oldest entries go

_FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```[ \t]*$", re.M | re.S)
_SHELL = ("bash", "sh", "console")
PYTHON = "python"
_MARK = re.compile(r"<!--\s*(not run by the suite|run by make test-long only)(?:,\s*`([^`]+)`)?:\s*(.*?)\s*-->", re.S)
NEVER, LONG = "not run by the suite", "run by make test-long only"  # the marks' kinds
_NUMBER = re.compile(r"[-+]?(?:\d[\d,]*\.?\d*|\.\d+)(?:[eE][-+]?\d+)?%?")
_PLACEHOLDER = re.compile(r"<[A-Za-z_][\w -]*>")


@dataclasses.dataclass
class Command:
    document: Path
    line: int  # where it starts in the document
    text: str  # as the document writes it (continuation lines joined; a Python block's whole source)
    mark: str | None = None  # NEVER or LONG, where the document marks it so
    reason: str = ""  # the mark's
    python: bool = False  # a Python block, run as a script

    @property
    def where(self) -> str:
        return f"{self.document.relative_to(ROOT)}:{self.line}"

    @property
    def shown(self) -> str:
        """The command, or a Python block by its length, for a line of the report."""
        return f"a Python block of {self.text.count(chr(10))} lines" if self.python else self.text


@dataclasses.dataclass
class Block:
    document: Path
    line: int
    language: str
    body: str
    marks: list[tuple[str, str | None, str]]  # (kind, part of the commands it marks or None for all, reason)
    commands: list[Command] = dataclasses.field(default_factory=list)


def blocks(document: Path) -> list[Block]:
    """The fenced blocks of ``document`` (shell, Python and text ones), with the marks right before each."""
    text = document.read_text()
    found = []
    end = 0
    for match in _FENCE.finditer(text):
        language = match.group(1)
        line = text.count("\n", 0, match.start()) + 1
        before = text[end:match.start()]
        end = match.end()
        if language not in (*_SHELL, PYTHON, "text"):
            continue
        # the HTML comments between the block and the paragraph's last line of prose
        marks = []
        tail = before.rstrip()
        while tail.endswith("-->"):
            start = tail.rfind("<!--")
            mark = _MARK.fullmatch(tail[start:])
            if start < 0 or mark is None:
                break
            marks.insert(0, (mark.group(1), mark.group(2), " ".join(mark.group(3).split())))
            tail = tail[:start].rstrip()
        block = Block(document, line, language, match.group(2), marks)
        if language in _SHELL:
            block.commands = _commands(block)
        elif language == PYTHON:
            block.commands = [_marked(block, Command(document, line + 1, match.group(2), python=True))]
        found.append(block)
    return found


def _commands(block: Block) -> list[Command]:
    commands: list[Command] = []
    pending, start = "", 0
    for offset, raw in enumerate(block.body.splitlines()):
        if not pending:
            start = block.line + 1 + offset
        line = raw.strip()
        if block.language == "console" and line.startswith("$ "):
            line = line[2:]
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        text = " ".join((pending + line).split())
        pending = ""
        commands.append(_marked(block, Command(block.document, start, text)))
    return commands


def _marked(block: Block, command: Command) -> Command:
    """``command`` with the mark of ``block`` that applies to it."""
    for kind, prefix, reason in block.marks:
        if prefix is None or prefix in command.text:
            command.mark, command.reason = kind, reason
    return command


def clean_env(home: Path) -> dict[str, str]:
    """A user's environment, built from scratch: nothing of the suite's (XLA_FLAGS, JAX_*, JAXRL_FRAG_*)."""
    path = [str(ROOT / ".venv" / "bin"), "/usr/local/bin", "/usr/bin", "/bin"]
    return {"PATH": os.pathsep.join(path), "HOME": str(home), "XDG_CACHE_HOME": str(home / ".cache"),
            "LANG": "C.UTF-8", "TMPDIR": str(home / "tmp"), "JAXRL_FRAG_MAX_STEPS": str(MAX_STEPS)}


def _program(command: str) -> str:
    """The program ``command`` runs, past the ``NAME=value`` settings before it."""
    words = shlex.split(command, comments=True)
    while words and re.fullmatch(r"[A-Za-z_]\w*=.*", words[0]):
        words = words[1:]
    return words[0] if words else ""


def runnable(command: str, cwd: Path, env: dict[str, str]) -> bool:
    """Whether the program ``command`` starts exists here."""
    program = _program(command)
    if "/" in program:
        return (cwd / program).exists()
    return shutil.which(program, path=env["PATH"]) is not None


def resolve(command: str, cwd: Path) -> str:
    """``command`` with each path holding a ``<placeholder>`` replaced by the newest path it matches in ``cwd``."""
    def newest(match: re.Match[str]) -> str:
        pattern = _PLACEHOLDER.sub("*", match.group(0))
        paths = sorted(glob.glob(pattern, root_dir=cwd), key=lambda p: (cwd / p).stat().st_mtime)
        assert paths, f"{match.group(0)!r}: nothing matches {pattern!r} after the commands before it"
        return paths[-1]

    return re.sub(r"[^\s'\"]*<[A-Za-z_][\w -]*>[^\s'\"]*", newest, command)


def without_comment(command: str) -> str:
    return re.split(r"\s#", command, maxsplit=1)[0].strip()


def expected_lines(text: str) -> list[re.Pattern[str] | None]:
    """A text block's lines as patterns (numbers and placeholders match any value, a line matches an output
    line from its start, whitespace as any whitespace); ``None`` for a ``...`` line."""
    patterns: list[re.Pattern[str] | None] = []
    for line in text.splitlines():
        line = " ".join(line.split())
        if not line:
            continue
        if line in ("...", "…"):
            patterns.append(None)
            continue
        pattern, pos = "", 0
        for match in re.finditer(f"{_PLACEHOLDER.pattern}|{_NUMBER.pattern}", line):
            pattern += re.escape(line[pos:match.start()])
            pattern += r"\S+?" if match.group(0).startswith("<") else _NUMBER.pattern
            pos = match.end()
        pattern += re.escape(line[pos:])
        patterns.append(re.compile(pattern.replace(r"\ ", r"\s+").replace(" ", r"\s+")))
    return patterns


def check_quoted(text: str, output: str) -> str | None:
    """Where ``output`` lacks the lines of ``text`` in order (``None`` where it has them)."""
    lines = [" ".join(line.split()) for line in output.splitlines()]
    position = 0
    for pattern in expected_lines(text):
        if pattern is None:
            continue
        for index in range(position, len(lines)):
            if pattern.match(lines[index]):
                position = index + 1
                break
        else:
            return f"no line matching {pattern.pattern!r} (after output line {position})"
    return None


def _suite_cache() -> Path:
    """This test's compilation cache, beside the suite's (tests/conftest.py)."""
    suite = os.environ.get("JAXRL_FRAG_CACHE_DIR")
    base = Path(suite).parent if suite else Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "jaxrl_frag"
    return base / "readme-xla"


@dataclasses.dataclass
class Outcome:
    command: Command
    status: str  # "ran", "skipped", "repeated"
    detail: str = ""


def run_documents(documents: tuple[Path, ...], tmp: Path, long: bool = False, cache: Path | None = None,
                  report: Callable[[str], object] = print) -> tuple[list[Outcome], list[str]]:
    """Run the commands of ``documents`` (each document in a working directory of its own under ``tmp``): those
    marked LONG with ``long``, else those not marked; returns what became of each command and the failures."""
    cache = _suite_cache() if cache is None else cache
    cache.mkdir(parents=True, exist_ok=True)
    prune(cache, CACHE_BYTES)
    home = tmp / "home"
    (home / ".cache" / "jaxrl_frag").mkdir(parents=True, exist_ok=True)
    (home / "tmp").mkdir(exist_ok=True)
    link = home / ".cache" / "jaxrl_frag" / "xla"
    if not link.exists():
        link.symlink_to(cache, target_is_directory=True)
    env = clean_env(home)
    outcomes: list[Outcome] = []
    failures: list[str] = []
    done: dict[str, Command] = {}  # by the command without its comment
    for document in documents:
        cwd = tmp / document.stem
        cwd.mkdir()
        for name in LINKED:
            (cwd / name).symlink_to(ROOT / name)
        output = None  # the output of the last shell block, for the text block after it
        for block in blocks(document):
            if block.language == "text":
                where = f"{document.relative_to(ROOT)}:{block.line}"
                if output is None:
                    report(f"  {where}: text block not checked (the shell block before it did not run here)")
                    continue
                problem = check_quoted(block.body, output)
                if problem is not None:
                    failures.append(f"{where}: the output of the block before it does not hold this text block: "
                                    f"{problem}; the output was:\n{output}")
                output = None
                continue
            output = ""
            for command in block.commands:
                if command.mark != (LONG if long else None):
                    if command.mark == NEVER or (command.mark == LONG and not long):
                        why = f"{command.mark}: {command.reason}" if command.mark == LONG else command.reason
                        outcomes.append(Outcome(command, "skipped", why))
                        report(f"  {command.where}: skipped ({why}): {command.shown}")
                    output = None
                    continue
                code = command.text if command.python else without_comment(command.text)
                if code in done:
                    outcomes.append(Outcome(command, "repeated", done[code].where))
                    report(f"  {command.where}: run before, at {done[code].where}: {command.shown}")
                    output = None
                    continue
                if not command.python and not runnable(command.text, cwd, env):
                    failures.append(f"{command.where}: `{command.text}`: {_program(command.text)!r} does not exist "
                                    "here; run it, or mark it in the document: <!-- not run by the suite: REASON --> "
                                    "right before its block")
                    output = None
                    continue
                line = code if command.python else resolve(REWRITES.get(code, code), cwd)
                argv = [str(cwd / ".venv" / "bin" / "python"), "-c", line] if command.python else ["bash", "-c", line]
                start = time.monotonic()
                try:
                    result = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=TIMEOUT,
                                            stdin=subprocess.DEVNULL)
                except subprocess.TimeoutExpired as error:
                    failures.append(f"{command.where}: `{line}` ran past {TIMEOUT} s:\n{error.stdout}\n{error.stderr}")
                    output = None
                    continue
                seconds = time.monotonic() - start
                done[code] = command
                outcomes.append(Outcome(command, "ran", f"{seconds:.1f} s"))
                shown = command.shown if command.python else line
                report(f"  {command.where}: exit {result.returncode} in {seconds:.1f} s: {shown}")
                if result.returncode != 0:
                    failures.append(f"{command.where}: `{shown}` exited with status {result.returncode}:\n"
                                    f"{result.stdout[-4000:]}\n{result.stderr[-4000:]}")
                    output = None
                    continue
                # a command that shows its own refusal (`... || echo "exit status $?"`) trains nothing
                trains = not command.python and (re.search(r"(^make train$|jaxrl-frag (train|resume) )", code)
                          and not re.search(r"--help|--print-config|\|\|", code))
                if trains and f"JAXRL_FRAG_MAX_STEPS={MAX_STEPS}: training for" not in result.stderr:
                    failures.append(f"{command.where}: `{line}` did not say that it capped its steps:\n{result.stderr}")
                if output is not None:
                    output += result.stdout + result.stderr
    return outcomes, failures


def test_documents_have_commands_and_marks_that_parse() -> None:
    """The block reader itself: every document's shell blocks yield commands, and the part a mark names
    is in a command of its block."""
    for document in DOCUMENTS:
        for block in blocks(document):
            for _, prefix, reason in block.marks:
                assert reason, f"{document.name}:{block.line}: a mark without its reason"
                assert prefix is None or any(prefix in c.text for c in block.commands), (
                    f"{document.name}:{block.line}: the mark names `{prefix}`, which no command of the block holds")
    assert sum(len(b.commands) for document in DOCUMENTS for b in blocks(document)) > 30
    assert sum(len(b.commands) for b in blocks(ROOT / "README.md")) >= 3
    assert sum(c.python for document in DOCUMENTS for b in blocks(document) for c in b.commands) >= 5


def test_the_readme_is_a_page_and_the_guides_are_the_docs_sites() -> None:
    """The README shows the set-up, a Python and a command-line example and where to read on (at most 12 KB);
    every guide it links is a page of the docs site's navigation, and every page of docs/ is in it."""
    readme = (ROOT / "README.md").read_text()
    assert len(readme.encode()) <= 12 * 1024
    linked = set(re.findall(r"\]\(docs/([\w-]+\.md)\)", readme))
    navigation = set(re.findall(r"^\s+- [^:]+: ([\w-]+\.md)$", (ROOT / "mkdocs.yml").read_text(), re.M))
    assert linked and linked <= navigation, linked - navigation
    assert {page.name for page in (ROOT / "docs").glob("*.md")} <= navigation


def test_the_command_line_caches_compiled_programs_in_xdg_cache_home(monkeypatch: pytest.MonkeyPatch,
                                                                     tmp_path: Path) -> None:
    from jaxrl_frag.compilation_cache import compilation_cache_dir

    monkeypatch.delenv("JAXRL_FRAG_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert compilation_cache_dir() == tmp_path / "jaxrl_frag" / "xla"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative")  # the XDG specification: a relative path is ignored
    assert compilation_cache_dir() == Path.home() / ".cache" / "jaxrl_frag" / "xla"
    monkeypatch.setenv("JAXRL_FRAG_CACHE_DIR", str(tmp_path / "here"))
    assert compilation_cache_dir() == tmp_path / "here"


def test_quoted_output_matching() -> None:
    quoted = ("greedy policy of runs/x-<time> (iteration 976): mean return 500.00, [500.00, 500.00]\n"
              "...\nwrote runs/x-<time>/e.csv")
    output = ("greedy policy of runs/x-20260101-000000 (iteration 4): mean return 21.30, [18.10, 25.00] over 10\n"
              "other\nwrote runs/x-20260101-000000/e.csv\n")
    assert check_quoted(quoted, output) is None
    assert check_quoted(quoted.replace("greedy", "sample"), output) is not None
    assert check_quoted("wrote runs/x-<time>/e.csv\ngreedy policy", output) is not None


def _run_and_check(tmp_path: Path, long: bool) -> None:
    lines: list[str] = []
    outcomes, failures = run_documents(DOCUMENTS, tmp_path, long=long, report=lines.append)
    print("\n".join(lines))  # shown with -s, or with the failure
    skipped = [o for o in outcomes if o.status == "skipped"]
    print(f"{sum(o.status == 'ran' for o in outcomes)} commands ran, {len(skipped)} skipped:")
    for outcome in skipped:
        print(f"  {outcome.command.where}: {outcome.command.shown}  -- {outcome.detail}")
    assert not failures, "\n\n".join(failures)


def test_readme_commands_run_as_a_user_runs_them(tmp_path: Path) -> None:
    _run_and_check(tmp_path, long=False)


@pytest.mark.long
def test_readme_commands_that_take_minutes(tmp_path: Path) -> None:
    """The commands marked ``run by make test-long only``: a minute or more each even with the steps capped."""
    _run_and_check(tmp_path, long=True)


if __name__ == "__main__":  # python tests/test_readme_commands.py [--long] [DIR]: run them, saying how long each took
    import tempfile

    arguments = [a for a in sys.argv[1:] if a != "--long"]
    with tempfile.TemporaryDirectory() as directory:
        _, problems = run_documents(DOCUMENTS, Path(arguments[0] if arguments else directory), long="--long" in sys.argv,
                                    report=lambda line: print(line, flush=True))
    print("\n\n".join(problems) or "all passed")
