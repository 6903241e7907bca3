"""The README stays a front door and the user guide stays whole: README.md is at most 150 lines, keeps the two
commands, and its relative links (and their #anchors) resolve; every docs/*.md page is in mkdocs.yml's nav and every
page the nav names exists. CI's `mkdocs build --strict` checks the links inside docs/; this runs in a second,
without mkdocs installed."""
import re
import unicodedata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
MAX_README_LINES = 150
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def _nav_pages():
    """The .md files mkdocs.yml's nav names (entries such as `- Title: page.md` or `- page.md`)."""
    text = (ROOT / "mkdocs.yml").read_text()
    nav = text[text.index("\nnav:"):]
    return re.findall(r"^\s*-\s+(?:[^:\n]+:\s+)?([\w./-]+\.md)\s*$", nav, re.M)


def _slug(heading):
    """The anchor Python-Markdown's toc gives a heading (its default slugify, on the heading's text)."""
    text = re.sub(r"[`*_]", "", heading).strip()
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def _anchors(page):
    in_fence = False
    found = set()
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            in_fence = not in_fence
        elif not in_fence and re.match(r"#{1,6} ", line):
            found.add(_slug(line.lstrip("#")))
    return found


def test_readme_is_short():
    lines = README.read_text().splitlines()
    assert len(lines) <= MAX_README_LINES, \
        "README.md has %d lines, at most %d: move the detail into docs/" % (len(lines), MAX_README_LINES)


def test_readme_keeps_the_two_commands():
    text = README.read_text()
    for command in ("./tools/run_tests.sh", "./tools/run_main.sh"):
        assert "\n    %s\n" % command in text, "README.md lost the command %s" % command
        assert (ROOT / command).is_file()


def test_every_docs_page_is_in_the_nav():
    nav = _nav_pages()
    pages = sorted(path.relative_to(DOCS).as_posix() for path in DOCS.rglob("*.md"))
    assert "index.md" in nav and "architecture.md" in nav
    assert sorted(set(pages) - set(nav)) == [], "docs pages missing from mkdocs.yml's nav"
    assert sorted(set(nav) - set(pages)) == [], "mkdocs.yml's nav names pages that do not exist"
    assert len(nav) == len(set(nav)), "a page is in the nav twice"


def test_readme_links_resolve():
    checked = 0
    for target in LINK.findall(README.read_text()):
        if re.match(r"[a-z]+:", target):           # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        resolved = (ROOT / path).resolve() if path else README
        assert resolved.exists(), "README.md links to %s, which does not exist" % target
        if anchor:
            assert resolved.suffix == ".md", target
            assert anchor in _anchors(resolved), "README.md links to %s: %s has no heading #%s" % (
                target, path, anchor)
        checked += 1
    assert checked >= 10, "README.md should link into the guide (found %d relative links)" % checked


def test_slug_matches_python_markdown():
    assert _slug(" Sandblaster L-BFGS (`--mode sandblaster`)") == "sandblaster-l-bfgs-mode-sandblaster"
    assert _slug("Which mode when") == "which-mode-when"
    assert _slug("Scaling on 16 cores") == "scaling-on-16-cores"
