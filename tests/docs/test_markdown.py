"""The block extractor the docs runner relies on: a directive typo or an unclosed fence is an error, not a skip."""

from __future__ import annotations

import pytest

from tests.docs.markdown import code_blocks, commands


def test_blocks_keep_language_line_and_directive(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("text\n\n<!-- doctest: only=1 the rest needs a board -->\n```bash\necho a\necho b\n```\n"
                    "```text\nsynopsis\n```\n")
    first, second = code_blocks(page)
    assert (first.lang, first.line, first.only, first.reason) == ("bash", 4, 1, "the rest needs a board")
    assert first.code == "echo a\necho b\n"
    assert (second.lang, second.only) == ("text", None)


@pytest.mark.parametrize("text", ["<!-- doctest: skip -->\n```bash\necho\n```\n",
                                  "<!-- doctest: only=1 -->\n```bash\necho\n```\n",
                                  "```bash\necho\n"])
def test_a_typo_or_an_open_fence_is_refused(tmp_path, text):
    page = tmp_path / "page.md"
    page.write_text(text)
    with pytest.raises(ValueError):
        code_blocks(page)


def test_commands_join_continuations_and_drop_comments():
    code = "# a comment\nedgesdk convert m.onnx \\\n    --out out/  # trailing\n\nmosquitto -c c.conf &\n"
    assert commands(code) == ["edgesdk convert m.onnx      --out out/  # trailing", "mosquitto -c c.conf &"]
