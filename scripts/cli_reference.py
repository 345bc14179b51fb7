"""Write docs/cli.md, the CLI reference, from the click commands themselves (``--check``: fail if it is stale).

    .venv/bin/python scripts/cli_reference.py           # regenerate docs/cli.md
    .venv/bin/python scripts/cli_reference.py --check   # exit 1 when docs/cli.md differs (tests run this)
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

REFERENCE = Path(__file__).resolve().parent.parent / "docs" / "cli.md"
WIDTH = 100


def _walk(command: click.Command, path: list[str], parent: click.Context | None):  # type: ignore[no-untyped-def]
    ctx = click.Context(command, info_name=path[-1], parent=parent, terminal_width=WIDTH, max_content_width=WIDTH)
    yield " ".join(path), command.get_help(ctx)
    if isinstance(command, click.Group):
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            if sub is not None and not sub.hidden:
                yield from _walk(sub, [*path, name], ctx)


def render() -> str:
    """The whole reference as Markdown: every command and subcommand with its ``--help``."""
    from edgesdk.cli import cli as edgesdk_cli

    parts = ["# edgesdk command-line reference\n",
             "Generated from the commands' own `--help` by `scripts/cli_reference.py`; a test fails when it is stale.",
             "Exit codes are those of `edgesdk.errors` (see [troubleshooting](troubleshooting.md)).\n"]
    sections = list(_walk(edgesdk_cli, ["edgesdk"], None))
    parts.append("\n".join(f"- [`{name}`](#{name.replace(' ', '-')})" for name, _ in sections) + "\n")
    for name, text in sections:
        parts.append(f'<a id="{name.replace(" ", "-")}"></a>\n## `{name}`\n\n```text\n{text.rstrip()}\n```\n')
    return "\n".join(parts)


def main() -> int:
    """Regenerate the reference, or with ``--check`` report whether it is stale."""
    text = render()
    if "--check" in sys.argv[1:]:
        if not REFERENCE.exists() or REFERENCE.read_text() != text:
            print(f"{REFERENCE} is stale: run .venv/bin/python scripts/cli_reference.py", file=sys.stderr)
            return 1
        return 0
    REFERENCE.parent.mkdir(exist_ok=True)
    REFERENCE.write_text(text)
    print(f"wrote {REFERENCE}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
