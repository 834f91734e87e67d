"""The documentation's links resolve, the README stays short, and its test command is CI's.

Pure and fast: reads ``README.md``, ``docs/*.md`` and ``.ci/run``; imports no TensorFlow.

* Every relative markdown link ``[text](path)`` or ``[text](path#anchor)`` (images too) in the
  README and in every ``docs/*.md`` names a file that exists relative to the linking file, and an
  ``#anchor`` names a heading of the target file under GitHub's slug rules. Links inside code
  (fenced blocks, indented blocks, inline code spans) are not links and are skipped.
* Every ``docs/*.md`` page is linked from the README.
* The README is at most 220 lines.
* The README's test command is the one CI runs: the README says it is "the same commands
  `.ci/run` runs in CI, one per line" and shows them joined with ``&&`` on one line; so the
  commands of ``.ci/run`` (its lines after the ``cd``), joined with `` && ``, must be that line
  exactly. Changing either without the other fails here.
* The README's train module is the one ``docs/python-api.md`` shows in full.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Iterator

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [README, *DOCS]

README_MAX_LINES = 220

# [text](target) or [text](target "title"); the text may hold inline code or an image.
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_FENCE = re.compile(r"^\s{0,3}(```|~~~)")
_HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
_CODE_SPAN = re.compile(r"(`+)(.+?)\1")
_EXTERNAL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")  # http:, https:, mailto:, ...


def _prose_lines(text: str) -> Iterator[tuple[int, str]]:
    """(line number, line) of the lines outside fenced and indented code blocks."""
    in_fence = False
    prev_blank = True
    in_indented = False
    in_list = False
    for number, line in enumerate(text.split("\n"), 1):
        if _FENCE.match(line):
            in_fence = not in_fence
            prev_blank = False
            continue
        if in_fence:
            continue
        blank = not line.strip()
        if re.match(r"^\s*([-*+]|\d+[.)])\s", line):
            in_list = True
        elif blank:
            pass
        elif not line.startswith(" "):
            in_list = False
        # An indented code block starts after a blank line with 4 spaces, outside a list item
        # (inside one, 2-space continuation lines are prose).
        if line.startswith("    ") and (in_indented or (prev_blank and not in_list)):
            in_indented = True
            prev_blank = False
            continue
        if not blank:
            in_indented = False
        prev_blank = blank
        yield number, line


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text: markup dropped, lowercased, punctuation other than
    hyphens and underscores removed, each space a hyphen."""
    text = _CODE_SPAN.sub(lambda m: m.group(2), heading)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link's text stays
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every anchor the headings of ``path`` produce (a repeated slug gets -1, -2, ...)."""
    seen: dict[str, int] = {}
    out = set()
    for _, line in _prose_lines(path.read_text(encoding="utf-8")):
        m = _HEADING.match(line)
        if not m:
            continue
        base = slug(m.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, target) of every markdown link in the prose of ``path``."""
    for number, line in _prose_lines(path.read_text(encoding="utf-8")):
        for m in _LINK.finditer(_CODE_SPAN.sub("", line)):
            yield number, m.group(1)


def broken_links(page: Path) -> list[str]:
    problems = []
    for number, target in links(page):
        if _EXTERNAL.match(target):
            continue
        where = f"{page.relative_to(ROOT)}:{number}: ({target})"
        file_part, _, anchor = target.partition("#")
        dest = (page.parent / file_part).resolve() if file_part else page
        if not dest.exists():
            problems.append(f"{where}: no such file {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest}")
            continue
        if anchor:
            if dest.suffix != ".md":
                problems.append(f"{where}: an anchor into a file that is not markdown")
            elif anchor not in anchors(dest):
                problems.append(f"{where}: no heading of {dest.relative_to(ROOT)} makes #{anchor}")
    return problems


def test_the_slug_rules_are_githubs() -> None:
    assert slug("What is guaranteed") == "what-is-guaranteed"
    assert slug("Keras `model.fit`: `procsv.keras.BackupAndRestore`") == "keras-modelfit-procsvkerasbackupandrestore"
    assert slug("Prometheus metrics (`--metrics-port`)") == "prometheus-metrics---metrics-port"
    assert slug("The seeds' examples (issue #11 §5)") == "the-seeds-examples-issue-11-5"
    assert slug("`procsv/common/`: what every process shares") == "procsvcommon-what-every-process-shares"


def test_code_is_not_searched_for_links_or_headings(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# Title\n\n```python\n# not a heading\nx = a[0](1)\n```\n\n"
                    "    [indented](nowhere.md)\n\nSee `[code](nowhere.md)` and [a](#title).\n"
                    "- a list item\n    [continued](gone.md)\n")
    assert anchors(page) == {"title"}
    assert [t for _, t in links(page)] == ["#title", "gone.md"]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    assert list(links(page)) or page != README, "the README links to nothing: is the link pattern broken?"
    problems = broken_links(page)
    assert not problems, "broken links:\n" + "\n".join(problems)


def test_every_docs_page_is_linked_from_the_readme() -> None:
    linked = {(README.parent / t.partition("#")[0]).resolve() for _, t in links(README)
              if not _EXTERNAL.match(t)}
    missing = [str(p.relative_to(ROOT)) for p in DOCS if p.resolve() not in linked]
    assert not missing, f"docs pages the README does not link to: {missing}"


def test_the_readme_is_short() -> None:
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines <= README_MAX_LINES, (f"README.md has {lines} lines; keep it to {README_MAX_LINES} "
                                       "or fewer and move the rest into docs/")


def _ci_commands() -> list[str]:
    """The commands ``.ci/run`` runs, in order: its non-comment lines after the ``cd`` to the root."""
    lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text(encoding="utf-8").split("\n")]
    lines = [line for line in lines if line and not line.startswith("#")]
    cd = next(i for i, line in enumerate(lines) if line.startswith("cd "))
    return lines[cd + 1:]


def test_the_readmes_test_command_is_what_ci_runs() -> None:
    commands = _ci_commands()
    assert any(re.search(r"\bpytest\b", c) for c in commands), f".ci/run runs no pytest: {commands}"
    text = README.read_text(encoding="utf-8")
    intro = "Set up, type-check and run the tests (the same commands `.ci/run` runs in CI, one per line):"
    assert intro in text, "the README no longer introduces its test command as .ci/run's commands"
    after = text.split(intro, 1)[1].lstrip("\n").split("\n", 1)[0]
    assert after.startswith("    "), f"the line after the README's test-command intro is not a code line: {after!r}"
    assert after[4:] == " && ".join(commands), (
        "the README's test command is not .ci/run's commands joined with ' && ':\n"
        f"  README:   {after[4:]}\n  .ci/run:  {' && '.join(commands)}")


def _python_blocks(path: Path) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", path.read_text(encoding="utf-8"), re.M | re.S)


def test_the_readmes_train_module_is_the_one_python_api_md_shows() -> None:
    readme = _python_blocks(README)
    assert readme, "the README shows no train module"
    assert readme[0] in _python_blocks(ROOT / "docs" / "python-api.md"), (
        "the README's train module differs from docs/python-api.md's (\"Writing a train module\")")
