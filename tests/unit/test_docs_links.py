"""The docs index links every page, the README links the index, and no relative link in the docs points nowhere."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def links(page: Path) -> set[str]:
    return {target for target in LINK.findall(page.read_text(encoding="utf-8")) if "://" not in target}


def test_the_index_links_every_page_and_the_readme_links_the_index():
    pages = {p.name for p in DOCS.glob("*.md")} - {"README.md"}
    assert pages <= links(DOCS / "README.md"), pages - links(DOCS / "README.md")
    assert "docs/README.md" in links(ROOT / "README.md")


def test_relative_links_resolve():
    broken = [f"{page.relative_to(ROOT)} -> {target}" for page in [ROOT / "README.md", *DOCS.glob("*.md")]
              for target in links(page) if not (page.parent / target).exists()]
    assert broken == []
