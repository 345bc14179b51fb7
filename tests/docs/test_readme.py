"""The README and every page of the documentation site (``docs/``, subfolders too) run as pasted: each shell and
Python block of a page, in order, in one session of its own.

See tests/docs/session.py for what a session keeps between blocks and the few things it
changes (free ports instead of 1883/8080, a temp HOME, waiting for background services).
Each page is a test class, so ``--dist loadscope`` keeps a page's blocks on one worker, in order,
while different pages run on different workers; a page's session (and every server its blocks
started) closes when its last block has run.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from edgesdk.ota_server.broker import free_port
from tests.docs.markdown import RUNNABLE, Block, code_blocks
from tests.docs.session import DocSession
from tests.wheelhouse import wheelhouse

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
#: Fence languages for what is not meant to be run: synopses, trees, file contents.
NOT_RUN = {"text", "yaml", "json", "ini", "toml", "diff"}
BLOCKS = {page: [b for b in code_blocks(page, page.relative_to(ROOT).as_posix()) if b.lang in RUNNABLE]
          for page in PAGES}


def test_every_block_says_whether_it_runs():
    """A block without a language, or with one the runner does not know, would silently go untested."""
    unknown = [b.id for page in PAGES for b in code_blocks(page, page.relative_to(ROOT).as_posix())
               if b.lang not in RUNNABLE and b.lang not in NOT_RUN]
    assert not unknown, f"label these fences with bash/python (run) or text/yaml/json (not run): {unknown}"
    assert any(BLOCKS.values()), "no runnable block found"


def page_env(page: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """What a page's session adds to the environment: the deployment page's ``pip install edgesdk`` takes this
    checkout's wheel and its dependencies from the run's wheelhouse (the package index's ``edgesdk`` is not
    this project), as a device pointed at a private index would."""
    if page.name != "deploy.md":
        return {}
    return {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(wheelhouse(tmp_path_factory))}


class _PageSession:
    """One page's session, opened at its first block, and the block that failed first (later ones do not run)."""

    def __init__(self, page: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
        self.page, self.tmp_path_factory = page, tmp_path_factory
        self.session: DocSession | None = None
        self.failed: str | None = None

    def open(self) -> DocSession:
        if self.session is None:
            stem = re.sub(r"\W+", "-", self.page.relative_to(ROOT).with_suffix("").as_posix())
            self.session = DocSession(cwd=ROOT, home=self.tmp_path_factory.mktemp(f"home-{stem}"),
                                      broker_port=free_port(), http_port=free_port(),
                                      env=page_env(self.page, self.tmp_path_factory))
        return self.session


@pytest.fixture(scope="class")
def page_session(request, tmp_path_factory) -> Iterator[_PageSession]:
    """The session of the page the test class runs (``PAGE``), closed after the page's last block."""
    opened = _PageSession(request.cls.PAGE, tmp_path_factory)
    yield opened
    if opened.session is not None:
        opened.session.close()


def _page_tests(page: Path, blocks: list[Block]) -> type:
    """The test class of one page: its blocks in page order, in one session."""

    class PageBlocks:
        PAGE = page

        @pytest.mark.timeout(1800)
        @pytest.mark.parametrize("block", blocks, ids=[b.id for b in blocks])
        def test_block_runs_as_pasted(self, block: Block, page_session: _PageSession) -> None:
            if page_session.failed:
                pytest.fail(f"not run: block {page_session.failed} of this page failed first")
            session = page_session.open()
            result = session.run(block)
            if result.returncode != 0:
                page_session.failed = block.id
                pytest.fail(f"{block.id} exited {result.returncode}:\n{block.code}\n--- output\n{result.output[-8000:]}\n"
                            f"--- background logs\n{session.logs()}", pytrace=False)

    name = "Test_" + re.sub(r"\W+", "_", page.relative_to(ROOT).with_suffix("").as_posix())
    PageBlocks.__name__ = PageBlocks.__qualname__ = name
    PageBlocks.__doc__ = f"{page.relative_to(ROOT)}, block by block."
    return PageBlocks


for _page, _blocks in BLOCKS.items():
    if _blocks:
        _cls = _page_tests(_page, _blocks)
        globals()[_cls.__name__] = _cls
