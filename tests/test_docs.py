"""Every command in README.md and docs/*.md runs as written.

Each fenced code block in those files carries an HTML comment on the line just before its
opening fence, which says what this test does with it:

* ``<!-- run -->``: the test runs it. A shell block (```` ```sh ````, ``bash``, ``shell``)
  runs with ``bash -e FILE`` in the repository's root. A Python block (```` ```python ````)
  runs on two ranks, ``.venv/bin/mpiexec -n 2 .venv/bin/python -m mpi4py FILE`` (mpi4py's
  runner, so an exception on one rank ends both instead of leaving the other waiting).
* ``<!-- run: one process -->``: a Python block run as one process, ``.venv/bin/python FILE``.
* ``<!-- show: REASON -->``: a block of commands or code the test cannot run (REASON says
  why: a Slurm cluster, a GPU, root and a long lab run, a site's settings). What can be
  checked without running it is: a shell block passes ``bash -n``, every script it names
  (``*.sh``, ``*.sbatch``, globs too) exists and passes ``bash -n``, and every
  ``-m MODULE`` it names is importable; a Python block compiles.
* ``<!-- output -->``: not commands: a sample of output or a file's contents (``text``,
  ``json`` or no language).
* ``<!-- setup:install -->`` and ``<!-- setup:test -->`` (README.md only): the two set-up
  commands, which ``.ci/run`` reads (the first line of the block) and runs. Not run here:
  the second would run pytest inside pytest; the test only checks that each is one line.

A block without one of these markers fails the test, and so does a relative link in these
files to a file that does not exist, or a docs page the README does not link to.

The ``run`` blocks of each file run in order, top to bottom, in a fresh checkout of the
working tree in a temporary folder (the files ``git ls-files --cached --others
--exclude-standard`` lists, so uncommitted work counts), with this test's venv linked there as
``.venv``; a block may use the files an earlier block of the same file wrote (into the
checkout, which is thrown away). Each block has :data:`TIMEOUT` seconds; a failure names the
block's file and line and shows its output. ``ALLREDUCE_*`` variables of the caller are
dropped, so the blocks run with the documented defaults.
"""

import importlib.util
import os
import re
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT = 120  # seconds per run block
SHELL = {"sh", "bash", "shell"}
PYTHON = {"python", "py"}
OUTPUT = {"", "text", "json", "console-output"}
MARKER = re.compile(r"^\s*<!--\s*(.*?)\s*-->\s*$")
FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([\w+-]*)\s*$")
SCRIPT = re.compile(r"(?<![\w./-])((?:\./)?(?:[\w*.-]+/)*[\w*.-]+\.(?:sh|sbatch))(?![\w-])")
MODULE = re.compile(r"(?<!\S)-m\s+([A-Za-z_][\w.]*)")
RANKS = re.compile(r"mpiexec\s+(?:-\S+\s+)*?-n\s+(\d+)")
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^\s*\[[^\]]+\]:\s*(\S+)", re.M)


@dataclass
class Block:
    path: str  # relative to the repository's root
    line: int  # 1-based line of the opening fence
    lang: str
    marker: str  # the comment's text, or None
    code: str

    @property
    def where(self):
        return f"{self.path}:{self.line}"

    @property
    def kind(self):
        """run, show, output or setup (the marker's first word), or None."""
        return None if self.marker is None else self.marker.split(":", 1)[0].strip()


def pages():
    """README.md and every docs page, relative to the root."""
    return ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))]


def blocks(path):
    """The fenced code blocks of ``path`` with the marker on the line before each."""
    lines = (ROOT / path).read_text().splitlines()
    found, i = [], 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        indent, fence, lang = opening.groups()
        end = i + 1
        while end < len(lines) and not (lines[end].strip().startswith(fence[0] * len(fence))
                                         and lines[end].strip().strip(fence[0]) == ""):
            end += 1
        before = MARKER.match(lines[i - 1]) if i > 0 else None
        body = [line[len(indent):] if line.startswith(indent) else line.lstrip() for line in lines[i + 1:end]]
        found.append(Block(path, i + 1, lang.lower(), before.group(1) if before else None, "\n".join(body) + "\n"))
        i = end + 1
    return found


def all_blocks():
    return [block for page in pages() for block in blocks(page)]


def marker_problem(block):
    """Why ``block``'s marker is missing or does not fit it, or None."""
    m, lang = block.marker, block.lang
    if m is None:
        return "no marker on the line before it (<!-- run -->, <!-- show: REASON -->, <!-- output -->)"
    if m == "run":
        return None if lang in SHELL | PYTHON else f"'run' on a {lang or 'plain'} block: only shell or Python runs"
    if m == "run: one process":
        return None if lang in PYTHON else "'run: one process' is for Python blocks"
    if m.startswith("show:"):
        if not m[len("show:"):].strip():
            return "'show:' needs a reason"
        return None if lang in SHELL | PYTHON else f"'show' on a {lang or 'plain'} block: use <!-- output -->"
    if m == "output":
        return None if lang in OUTPUT else f"'output' on a {lang} block: commands are run or shown"
    if m in ("setup:install", "setup:test"):
        if block.path != "README.md":
            return f"{m} belongs in README.md only"
        return None if lang in SHELL else "a setup block is a shell block"
    return f"unknown marker <!-- {m} -->"


def test_every_code_block_has_a_marker():
    problems = [f"{b.where}: {marker_problem(b)}" for b in all_blocks() if marker_problem(b)]
    assert not problems, "\n".join(problems)


def test_the_setup_blocks_are_one_command_each():
    setup = [b for b in blocks("README.md") if b.kind == "setup"]
    assert sorted(b.marker for b in setup) == ["setup:install", "setup:test"], [b.where for b in setup]
    for b in setup:
        assert len(b.code.strip().splitlines()) == 1, f"{b.where}: .ci/run runs the first line only"


def test_run_blocks_use_at_most_two_ranks():
    """The test (and a reader's 2-core machine) never runs more ranks than cores."""
    many = [f"{b.where}: mpiexec -n {n}" for b in all_blocks() if b.kind in ("run", "setup")
            for n in RANKS.findall(b.code) if int(n) > 2]
    assert not many, "\n".join(many)


def _unfenced(text):
    """``text`` without its fenced blocks."""
    return re.sub(r"(?ms)^\s*(```|~~~).*?^\s*\1\s*$", "", text)


def _prose(text):
    """``text`` without its fenced blocks and inline code, where links are not links."""
    return re.sub(r"`[^`\n]*`", "", _unfenced(text))


def anchors(path):
    """The anchors GitHub makes of the headings of a Markdown file: lower case, punctuation
    dropped, spaces as hyphens, "-1", "-2" after repeats."""
    seen, found = {}, set()
    for heading in re.findall(r"(?m)^#{1,6}\s+(.*?)\s*#*\s*$", _unfenced(path.read_text())):
        slug = re.sub(r"[^\w\- ]", "", heading.replace("`", "").strip().lower()).replace(" ", "-")
        found.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
        seen[slug] = seen.get(slug, 0) + 1
    return found


def test_relative_links_point_to_files_that_exist():
    """Every relative link names a file that exists, and a heading of it after '#'."""
    broken = []
    for page in pages():
        prose = _prose((ROOT / page).read_text())
        for target in LINK.findall(prose) + REFERENCE.findall(prose):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):
                continue
            file, _, anchor = target.partition("#")
            linked = (ROOT / page).parent.joinpath(file) if file else ROOT / page
            if not linked.exists():
                broken.append(f"{page}: {target}: no such file")
            elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
                broken.append(f"{page}: {target}: no heading #{anchor} in {file or page}")
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_the_readme_links_every_docs_page():
    prose = _prose((ROOT / "README.md").read_text())
    linked = {os.path.normpath(t.split("#", 1)[0]) for t in LINK.findall(prose)}
    missing = [p for p in pages()[1:] if p not in linked]
    assert not missing, f"README.md does not link {', '.join(missing)}"


def _bash_n(path_or_code, where):
    args = ["bash", "-n", str(path_or_code)] if isinstance(path_or_code, Path) else ["bash", "-n", "-c", path_or_code]
    proc = subprocess.run(args, capture_output=True, text=True)
    return None if proc.returncode == 0 else f"{where}: bash -n: {proc.stderr.strip()}"


def show_problems(block):
    """What is wrong with a ``show`` block, found without running it."""
    if block.lang in PYTHON:
        try:
            compile(block.code, block.where, "exec")
        except SyntaxError as exc:
            return [f"{block.where}: {exc}"]
        return []
    problems = [p for p in [_bash_n(block.code, block.where)] if p]
    for named in SCRIPT.findall(block.code):
        matches = sorted(ROOT.glob(named.removeprefix("./"))) if "*" in named else [ROOT / named]
        if not matches or not all(m.is_file() for m in matches):
            problems.append(f"{block.where}: {named} does not exist")
        problems += [p for m in matches if m.is_file() for p in [_bash_n(m, f"{block.where}: {named}")] if p]
    for module in MODULE.findall(block.code):
        try:
            found = importlib.util.find_spec(module) is not None
        except ImportError:
            found = False
        if not found:
            problems.append(f"{block.where}: python -m {module}: no such module")
    return problems


def test_show_blocks_name_scripts_and_modules_that_exist():
    shown = [b for b in all_blocks() if b.kind == "show"]
    problems = [p for b in shown for p in show_problems(b)]
    assert not problems, "\n".join(problems)


@pytest.fixture
def checkout(tmp_path):
    """A fresh copy of the working tree (tracked and untracked files, not ignored ones), with
    this Python's venv as its ``.venv``."""
    venv = Path(sys.prefix)
    if not (venv / "bin" / "mpiexec").exists():
        pytest.fail(f"run this test with the venv's Python: {venv}/bin/mpiexec does not exist")
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, check=True).stdout.decode().split("\0")
    root = tmp_path / "checkout"
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file() or source.is_symlink():  # a file deleted in the working tree is left out
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, root / name, follow_symlinks=False)
    (root / ".venv").symlink_to(venv)
    return root


def run_block(block, root, number):
    """Run one ``run`` block in ``root``; (exit status, output)."""
    folder = root / ".doc-blocks"
    folder.mkdir(exist_ok=True)
    stem = f"{number:02d}-{block.path.replace('/', '-').removesuffix('.md')}-L{block.line}"
    if block.lang in SHELL:
        script = folder / f"{stem}.sh"
        command = ["bash", "-e", str(script)]
    else:
        script = folder / f"{stem}.py"
        python = str(root / ".venv" / "bin" / "python")
        command = ([python, str(script)] if block.marker == "run: one process"
                   else [str(root / ".venv" / "bin" / "mpiexec"), "-n", "2", python, "-m", "mpi4py", str(script)])
    script.write_text(block.code)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ALLREDUCE_")}
    env["PYTHONPATH"] = os.pathsep.join([str(root), *filter(None, [env.get("PYTHONPATH")])])
    proc = subprocess.Popen(command, cwd=root, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        return "timeout", f"{output}\n[killed after {TIMEOUT} s]"
    return proc.returncode, output


RUNNABLE = [page for page in pages() if any(b.kind == "run" for b in blocks(page))]


@pytest.mark.parametrize("page", RUNNABLE)
def test_run_blocks_run_as_written(page, checkout):
    runs = [b for b in blocks(page) if b.kind == "run"]
    for number, block in enumerate(runs, 1):
        status, output = run_block(block, checkout, number)
        if status != 0:
            tail = output[-8000:]
            pytest.fail(f"{block.where}: the block exited {status}\n--- block\n{block.code}--- output\n{tail}",
                        pytrace=False)
