"""The README (and every page under docs/) runs as pasted: each shell and Python block, in order, in one session.

See tests/docs/session.py for what a session keeps between blocks and the few things it
changes (free ports instead of 1883/8080, a temp HOME, waiting for background services).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from edgesdk.ota_server.broker import free_port
from tests.docs.markdown import RUNNABLE, Block, code_blocks
from tests.docs.session import DocSession
from tests.wheelhouse import wheelhouse

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
#: Fence languages for what is not meant to be run: synopses, trees, file contents.
NOT_RUN = {"text", "yaml", "json", "ini", "toml", "diff"}
BLOCKS = [b for page in PAGES for b in code_blocks(page) if b.lang in RUNNABLE]


def test_every_block_says_whether_it_runs():
    """A block without a language, or with one the runner does not know, would silently go untested."""
    unknown = [b.id for page in PAGES for b in code_blocks(page) if b.lang not in RUNNABLE and b.lang not in NOT_RUN]
    assert not unknown, f"label these fences with bash/python (run) or text/yaml/json (not run): {unknown}"
    assert BLOCKS, "no runnable block found"


def page_env(page: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """What a page's session adds to the environment: the deployment page's ``pip install edgesdk`` takes this
    checkout's wheel and its dependencies from the run's wheelhouse (the package index's ``edgesdk`` is not
    this project), as a device pointed at a private index would."""
    if page.name != "deploy.md":
        return {}
    return {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(wheelhouse(tmp_path_factory))}


@pytest.fixture(scope="module")
def sessions(tmp_path_factory) -> Iterator[dict[Path, DocSession]]:
    opened: dict[Path, DocSession] = {}
    failed: dict[Path, str] = {}

    def session(page: Path) -> DocSession:
        if page not in opened:
            opened[page] = DocSession(cwd=ROOT, home=tmp_path_factory.mktemp(f"home-{page.stem}"),
                                      broker_port=free_port(), http_port=free_port(),
                                      env=page_env(page, tmp_path_factory))
        return opened[page]

    session.failed = failed  # type: ignore[attr-defined]
    yield session  # type: ignore[misc]
    for s in opened.values():
        s.close()


@pytest.mark.timeout(1800)
@pytest.mark.parametrize("block", BLOCKS, ids=[b.id for b in BLOCKS])
def test_block_runs_as_pasted(block: Block, sessions) -> None:
    if block.path in sessions.failed:
        pytest.fail(f"not run: block {sessions.failed[block.path]} of this page failed first")
    session = sessions(block.path)
    result = session.run(block)
    if result.returncode != 0:
        sessions.failed[block.path] = block.id
        pytest.fail(f"{block.id} exited {result.returncode}:\n{block.code}\n--- output\n{result.output[-8000:]}\n"
                    f"--- background logs\n{session.logs()}", pytrace=False)
