"""Griffe extension: the docstrings' reST markup reads as Markdown in the API reference.

edgesdk's docstrings are written for ``help()`` and Sphinx habits: roles such as :class:`DeviceProfile` and
literal blocks announced by a trailing ``::``, and doctest examples. Without this the site would show
``:class: DeviceProfile``, and a ``>>>`` example as a quotation. A role becomes inline code (``~`` keeps the last
name, as in Sphinx), ``Example::`` becomes ``Example:`` (the indented block after it is already a Markdown code
block), and a doctest example a fenced ``pycon`` block without its ``# doctest:`` flags.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:class|meth|func|mod|attr|data|exc|obj|const|py:\w+):`([^`]+)`")
_LITERAL = re.compile(r"(?<=\S)::$", flags=re.M)
_BARE_LITERAL = re.compile(r"^[ \t]*::[ \t]*$", flags=re.M)
#: A doctest example: a ``>>>`` line, then its ``...`` continuations and output, up to a blank line.
_DOCTEST = re.compile(r"^([ \t]*)(>>> .*(?:\n\1(?!\s*$).*)*)", flags=re.M)
_FLAGS = re.compile(r"[ \t]*# doctest:.*$", flags=re.M)


def _role(match: re.Match[str]) -> str:
    target = match.group(1)
    if target.startswith("~"):
        target = target[1:].rsplit(".", 1)[-1]
    return f"`{target}`"


def _doctest(match: re.Match[str]) -> str:
    indent, example = match.group(1), _FLAGS.sub("", match.group(2))
    lines = [line.removeprefix(indent) for line in example.splitlines()]
    return "```pycon\n" + "\n".join(lines) + "\n```"


def markdown(text: str) -> str:
    """``text`` with reST roles as inline code, ``::`` literal-block markers as a colon (or nothing) and doctest
    examples fenced."""
    text = _BARE_LITERAL.sub("", _LITERAL.sub(":", _ROLE.sub(_role, text)))
    return _DOCTEST.sub(_doctest, text)


class RestToMarkdown(griffe.Extension):
    """Rewrites every docstring as it is loaded."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = markdown(obj.docstring.value)
