"""Fenced code blocks of a Markdown page, with the ``<!-- doctest: ... -->`` directive above each.

A directive is an HTML comment (invisible on GitHub) on the line right before a fence:

    <!-- doctest: only=1 the second command is the one running this test -->

``only=N`` runs only the block's first N commands and must say why; nothing else is
recognised, so a typo fails the test instead of silently skipping a block.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Block", "code_blocks", "RUNNABLE", "commands"]

#: Fence languages the runner executes; every other block must name a non-shell language (text, yaml, ...).
RUNNABLE = {"bash": "bash", "sh": "bash", "shell": "bash", "python": "python"}

_FENCE = re.compile(r"^```(\S*)\s*$")
_DIRECTIVE = re.compile(r"^<!--\s*doctest:\s*(.*?)\s*-->\s*$")
_ONLY = re.compile(r"^only=(\d+)\s+(\S.*)$")


@dataclass(frozen=True)
class Block:
    """One fenced block: where it is, its language, its code and how to run it.

    ``page`` names the page in test ids (its path below the checkout, e.g. ``docs/guides/fleet.md``);
    the file name when not given.
    """

    path: Path
    line: int
    lang: str
    code: str
    only: int | None = None
    reason: str = ""
    page: str = ""

    @property
    def id(self) -> str:
        return f"{self.page or self.path.name}:{self.line}:{self.lang or 'plain'}"


def code_blocks(path: Path, page: str = "") -> list[Block]:
    """Every fenced block of ``path`` in page order (``page``: its name in ids); raises ValueError on an unknown
    directive."""
    lines = path.read_text().splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        match = _FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        start, lang = i, match.group(1)
        directive = _DIRECTIVE.match(lines[start - 1]) if start else None
        only, reason = None, ""
        if directive:
            parsed = _ONLY.match(directive.group(1))
            if not parsed:
                raise ValueError(f"{path}:{start}: unknown doctest directive {directive.group(1)!r}; "
                                 "use 'only=N REASON'")
            only, reason = int(parsed.group(1)), parsed.group(2)
        end = start + 1
        while end < len(lines) and lines[end].rstrip() != "```":
            end += 1
        if end == len(lines):
            raise ValueError(f"{path}:{start + 1}: code fence is never closed")
        blocks.append(Block(path, start + 1, lang, "\n".join(lines[start + 1:end]) + "\n", only, reason, page))
        i = end + 1
    return blocks


def commands(code: str) -> list[str]:
    """A shell block's commands: continuation lines joined, blank lines and whole-line comments dropped."""
    out: list[str] = []
    pending = ""
    for raw in code.splitlines():
        line = raw.rstrip()
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        out.append(pending + line)
        pending = ""
    if pending:
        out.append(pending.rstrip())
    return out
