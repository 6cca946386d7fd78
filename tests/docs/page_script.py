"""A documentation page run as one script, as a reader who copies its blocks in order would.

:func:`run_page` writes the page's Python blocks into one script and runs it in a fresh
interpreter, in a folder of its own (the blocks save files where they stand). The blocks share
one namespace, in page order; ``>>>`` sessions run as doctests in that namespace, their output
compared. Each block is compiled under the page's path at its own line, so a traceback names the
page and the line, and a failing block ends the script with a line naming the page, the block
and its line. Blocks whose caption says they need more (``Needs ...``, see
:mod:`tests.docs.code_blocks`) are left out.

What each block printed comes back, to be compared with the page: :func:`mismatches` checks the
``:class: output`` block after a Python block, and every number a ``print(...)  # ...`` comment
claims.
"""

from __future__ import annotations

import json
import os
import re
import resource
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from tests.docs.code_blocks import Block, blocks

__all__ = ["PageRun", "claims", "matches", "mismatches", "run_page", "runnable"]

# The script: the blocks as data, run one by one; stdout is copied per block into RESULT.
_DRIVER = """\
import contextlib, doctest, io, json, sys, traceback

BLOCKS = json.loads({blocks!r})
RESULT = {result!r}


class Tee(io.TextIOBase):
    def __init__(self, *streams):
        self.streams = streams

    def write(self, text):
        for stream in self.streams:
            stream.write(text)
        return len(text)

    def flush(self):
        for stream in self.streams:
            stream.flush()


def run(block, namespace):
    source = "\\n" * (block["line"] - 1) + block["code"]
    if not block["doctest"]:
        exec(compile(source, block["page"], "exec"), namespace)
        return
    flags = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
    test = doctest.DocTestParser().get_doctest(
        block["code"], namespace, block["page"], block["page"], block["line"] - 1
    )
    runner = doctest.DocTestRunner(optionflags=flags)
    runner.run(test, clear_globs=False)
    namespace.update(test.globs)  # the names a session defines are the script's too
    if runner.failures:
        raise AssertionError(f"{{runner.failures}} of the examples printed other than shown")


namespace = {{"__name__": "__main__"}}
printed = []
for block in BLOCKS:
    captured = io.StringIO()
    try:
        with contextlib.redirect_stdout(Tee(sys.stdout, captured)):
            run(block, namespace)
    except BaseException:
        traceback.print_exc()
        print(f"FAILED: {{block['name']}}, block {{block['index']}} (line {{block['line']}})",
              file=sys.stderr)
        sys.exit(1)
    finally:
        printed.append(captured.getvalue())
        with open(RESULT, "w") as file:
            json.dump(printed, file)
"""


def runnable(page: Path) -> list[tuple[int, Block]]:
    """``(index among the page's blocks, block)`` of the Python blocks a script runs."""
    return [
        (index, block)
        for index, block in enumerate(blocks(page))
        if block.language in ("python", "pycon") and block.needs is None
    ]


@dataclass(frozen=True)
class PageRun:
    """What running a page printed.

    Attributes:
        page: The page.
        returncode: The script's exit status (0: every block ran).
        log: Its stdout and stderr, the traceback of a failing block included.
        printed: What each block that ran printed, by its index among the page's blocks.
        cpu_seconds: The CPU time the script took (user and system, every thread).
    """

    page: Path
    returncode: int
    log: str
    printed: dict[int, str]
    cpu_seconds: float


def run_page(page: Path, folder: Path, timeout: float = 600) -> PageRun:
    """Run the Python blocks of ``page`` as one script in a fresh interpreter, in ``folder``."""
    chosen = runnable(page)
    data = [
        {
            "page": str(page),
            "name": f"docs/{page.name}",
            "index": index,
            "line": block.line,
            "code": block.code,
            "doctest": block.is_doctest,
        }
        for index, block in chosen
    ]
    result = folder / "printed.json"
    script = folder / f"{page.stem}_page.py"
    script.write_text(_DRIVER.format(blocks=json.dumps(data), result=str(result)))
    # One torch thread: pages run side by side (pytest -n 2), and threads waiting for each other
    # on shared cores cost many times the work itself.
    env = {**os.environ, "MPLBACKEND": "Agg", "PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(
        [sys.executable, script.name],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    printed = json.loads(result.read_text()) if result.is_file() else []
    return PageRun(
        page,
        done.returncode,
        done.stdout + done.stderr,
        {index: text for (index, _), text in zip(chosen, printed, strict=False)},
        after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime,
    )


def matches(expected: str, printed: str) -> bool:
    """Whether the lines ``expected`` shows are printed, one after the other, trailing spaces aside.

    Other lines may come before and after them (a progress bar, a framework's log). ``...`` in a
    line stands for any text within the line; a line that is ``...`` alone for any lines (none
    included).

    Example:
        >>> matches("a\\n...\\nd 1...", "log\\na\\nb\\nc\\nd 12 (x)\\nlog")
        True
        >>> matches("a\\nb", "a\\nc\\nb")
        False
    """
    pattern = []
    for line in expected.rstrip().splitlines():
        if line.strip() == "...":
            pattern.append(r"(?:.*\n)*?")
        else:
            text = ".*".join(re.escape(part) for part in line.rstrip().split("..."))
            pattern.append(text + r"[ \t]*\n")
    lines = "".join(line.rstrip() + "\n" for line in printed.rstrip().splitlines())
    return re.search(r"(?:^|(?<=\n))" + "".join(pattern), lines) is not None


# ``print(...)  # 90.00%``: a comment on a print line that starts with a number, a sign, a
# bracket or True/False claims what the line prints; the claim ends before " (" or ";".
_CLAIM = re.compile(r"^\s*print\(.*\)\s+#\s*((?:[-+]?[\d.]|[\[(]|True|False).*)$")


def claims(code: str) -> list[str]:
    """What the ``print`` lines of ``code`` claim, in order.

    Example:
        >>> claims("print(s)  # 90.00% (the target)\\nprint(t)  # the report\\nprint(n)  # 64")
        ['90.00%', '64']
    """
    found = []
    for line in code.splitlines():
        if claim := _CLAIM.match(line):
            found.append(re.split(r" \(|;", claim.group(1))[0].strip())
    return found


def mismatches(run: PageRun) -> list[str]:
    """Where what the blocks printed differs from what the page shows, one line each."""
    page_blocks = blocks(run.page)
    found = []
    for index, printed in run.printed.items():
        where = f"docs/{run.page.name}, block {index} (line {page_blocks[index].line})"
        following = page_blocks[index + 1] if index + 1 < len(page_blocks) else None
        if following is not None and following.is_output and not matches(following.code, printed):
            found.append(f"{where} printed\n{printed}\nwhere the page shows\n{following.code}")
        position = 0
        for claim in claims(page_blocks[index].code):
            at = printed.find(claim, position)
            if at < 0:
                found.append(f"{where} claims {claim!r} in a comment, but printed\n{printed}")
                break
            position = at + len(claim)
    return found
