"""The block reader the docs checks stand on."""

from __future__ import annotations

from pathlib import Path

import pytest
from mdblocks import Block, blocks, words


def _page(tmp_path: Path, text: str) -> Path:
    page = tmp_path / "page.md"
    page.write_text(text)
    return page


def test_blocks_carry_the_marker_directly_above(tmp_path: Path) -> None:
    page = _page(
        tmp_path,
        "# T\n\n<!-- docs-check: run -->\n```sh\necho a \\\n  b\n# note\n\nls\n```\n\n"
        "<!-- docs-check: cluster-only -->\n\n```sh\nkubectl get pods\n```\n"
        "````yaml\na: 1\n```\nnested\n````\n",
    )
    first, second, third = blocks(page)
    assert (first.line, first.lang, first.marker) == (4, "sh", "run")
    assert first.commands() == ["echo a    b", "ls"]
    # A blank line between marker and fence breaks the link: the block is unmarked.
    assert second.marker is None
    assert (third.lang, third.text) == ("yaml", "a: 1\n```\nnested\n")


def test_unclosed_fence_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"page\.md:2: unclosed code fence"):
        blocks(_page(tmp_path, "x\n```sh\nls\n"))


def test_words_stop_at_pipes_and_redirects() -> None:
    assert words("kubectl apply -k deploy/overlays/grouped | grep x") == [
        "kubectl", "apply", "-k", "deploy/overlays/grouped",
    ]  # fmt: skip
    assert words("dracpu gatherinfo --stdout > node.yaml") == ["dracpu", "gatherinfo", "--stdout"]
    assert words("curl -s http://x # comment") == ["curl", "-s", "http://x"]


def test_where_is_relative_to_the_repository() -> None:
    from mdblocks import DOCS

    block = Block(DOCS / "quickstart.md", 3, "sh", "run", "ls\n")
    assert block.where == "docs/quickstart.md:3"
