"""The documentation site builds with ``mkdocs build --strict``: a broken link or anchor, a page missing from the
navigation, or an API object the reference names that no longer exists fails the suite."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from markdown.extensions.toc import slugify

ROOT = Path(__file__).resolve().parents[2]


def test_the_site_builds_without_a_warning(tmp_path):
    site = tmp_path / "site"
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)], cwd=ROOT,
                            env={**os.environ, "NO_MKDOCS_2_WARNING": "1"}, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "WARNING" not in result.stderr, result.stderr
    start = (site / "index.html").read_text()
    assert "assets/stylesheets/main" in start, "the start page is not rendered with the Material theme"
    reference = (site / "reference" / "converters" / "index.html").read_text()
    assert "ConversionRequest" in reference and "QuantizationConfig" in reference



def test_the_readmes_links_reach_pages_and_their_anchors():
    """The README is not part of the site, so mkdocs does not check its links to the pages: this does."""
    for target in re.findall(r"\]\((?!https?://|#)([^)\s]+)\)", (ROOT / "README.md").read_text()):
        path, _, anchor = target.partition("#")
        assert (ROOT / path).exists(), f"README links to {path}, which does not exist"
        if anchor:
            headings = re.findall(r"^#+ (.+)$", (ROOT / path).read_text(), flags=re.M)
            assert anchor in {slugify(h, "-") for h in headings}, f"README links to {target}: no such heading"
