"""``docs/parity.md`` tells the truth about itself: its table is parsed and checked.

Pure and fast: reads the markdown, the test files and the seed items; imports ``procsv.train`` to
look names up (TensorFlow is imported, eager; nothing runs in graph mode, no service starts).

* (a) every item a row names under procsv exists: ``procsv.train.<Class>``, ``<Class>.<method>()``,
  ``<Class>.<property>``, a constructor's or method's argument in its signature (a MISSING row may
  name what procsv does not have);
* (b) no row is IMPLEMENTED without a test, and every test a row names exists: the file, and a
  top-level ``def test_<name>(`` in it (``name[id]`` for a parametrized case: the test is
  parametrized and each part of the id is in the file);
* (c) the counts at the top of the page are the rows' counts (per section and in all);
* (d) every item of the seed pages (``tests/parity_seed_items.txt``, which is checked against a
  fresh parse of the seed pages when they are present) has a row.

Each check is a function returning the problems it finds, so that
:func:`test_each_check_finds_a_broken_table` can show that each one fails on a broken copy.

``python tests/test_parity.py --renumber`` rewrites the page's ``#`` column (1..N in order) and its
counts table from the rows, after rows were added or their status changed; it changes nothing else.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import tempfile
from pathlib import Path
from typing import Any, Callable, Optional

import pytest

import parity_seeds

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "parity.md"
HEADER = "| # | item | kind | status | test | note |"
STATUSES = ("IMPLEMENTED", "PARTIAL", "MISSING")
NAMED_KINDS = {"class", "function", "exception", "argument", "method", "property", "field"}
KINDS = NAMED_KINDS | {"behaviour", "example"}
COUNTS_MARK = "<!-- parity-counts -->"
_TEST_REF = re.compile(r"(tests/[\w/]+\.py)::(\w+)(?:\[([^\]\s]+)\])?")
_SPEC = re.compile(r"(?P<owner>\w+)(?:\.(?P<attr>\w+))?(?:\((?:(?P<arg>\w+)=)?\))?")


@dataclasses.dataclass(frozen=True)
class Row:
    number: int
    item: str
    kind: str
    status: str
    tests: tuple[tuple[str, str, Optional[str]], ...]
    test_cell: str
    note: str
    section: str
    line: int

    @property
    def spec(self) -> Optional[str]:
        """The procsv name a named row's item gives (its code span), else None."""
        m = re.fullmatch(r"`([^`]+)`", self.item)
        return m.group(1) if m else None


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def parse_rows(text: str) -> tuple[list[Row], list[str]]:
    """The rows of every table with :data:`HEADER`, each in the section (``###`` heading) above it."""
    rows: list[Row] = []
    problems: list[str] = []
    section = ""
    in_table = False
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith("### "):
            section = line[4:].strip()
        if line.strip() == HEADER:
            in_table = True
            continue
        if in_table and not line.startswith("|"):
            in_table = False
        if not in_table:
            if line.startswith("|") and _cells(line)[0].isdigit():
                problems.append(f"line {number}: a row outside a table (a blank line ends a table)")
            continue
        if set(line.replace("|", "").strip()) <= {"-", " "}:
            continue  # the separator row
        cells = _cells(line)
        if len(cells) != 6 or not cells[0].isdigit():
            problems.append(f"line {number}: a row needs 6 cells and a number: {line!r}")
            continue
        refs = tuple((m.group(1), m.group(2), m.group(3)) for m in _TEST_REF.finditer(cells[4]))
        rows.append(Row(int(cells[0]), cells[1], cells[2], cells[3], refs, cells[4], cells[5], section, number))
    return rows, problems


def check_rows(rows: list[Row]) -> list[str]:
    """Numbering, kinds, statuses, the item syntax of named rows, and a note where one is owed."""
    problems = []
    if [r.number for r in rows] != list(range(1, len(rows) + 1)):
        problems.append("rows are not numbered 1..N in order")
    seen: dict[str, int] = {}
    for r in rows:
        where = f"row {r.number} ({r.item})"
        if r.item in seen:
            problems.append(f"{where}: the same item as row {seen[r.item]}")
        seen[r.item] = r.number
        if r.status not in STATUSES:
            problems.append(f"{where}: status {r.status!r} is not one of {STATUSES}")
        if r.kind not in KINDS:
            problems.append(f"{where}: kind {r.kind!r} is not one of {sorted(KINDS)}")
        if r.kind in NAMED_KINDS:
            m = _SPEC.fullmatch(r.spec or "")
            if m is None:
                problems.append(f"{where}: a {r.kind} row's item is one code span: `Class`, `Class.name`, "
                                "`Class.method()`, `Class(arg=)` or `Class.method(arg=)`")
            else:
                shape = ("argument" if m.group("arg") else "method" if r.spec and r.spec.endswith("()")
                         else "member" if m.group("attr") else "top")
                allowed = {"argument": {"argument"}, "method": {"method"}, "member": {"property", "field", "class"},
                           "top": {"class", "function", "exception"}}[shape]
                if r.kind not in allowed:
                    problems.append(f"{where}: kind {r.kind} does not match the item's form ({shape})")
        if r.status != "IMPLEMENTED" and not r.note:
            problems.append(f"{where}: a {r.status} row says why in its note")
        if r.status == "PARTIAL" and "Missing:" not in r.note:
            problems.append(f"{where}: a PARTIAL row's note says exactly what is missing ('Missing: ...')")
        if "n/a" in r.status.lower() or "n/a" in r.note:
            problems.append(f"{where}: no 'n/a': say why in a sentence")
    return problems


# ------------------------------------------------------------------------------ (a) names exist
def _instances(folder: str) -> dict[str, Callable[[], Any]]:
    """How to make an object of the classes whose properties are set in ``__init__`` (a Supervisor's
    logdir inside ``folder``, which the caller removes: one per name looked up, it left a thousand
    folders in the temp folder a run)."""
    import tensorflow as tf

    from procsv import train

    def supervisor() -> Any:
        return train.Supervisor(logdir=tempfile.mkdtemp(prefix="parity-", dir=folder),
                                checkpoint={"w": tf.Variable(1.0)}, save_model_secs=None)

    return {"Supervisor": supervisor, "Scaffold": train.Scaffold}


def resolve(spec: str, instances: dict[str, Callable[[], Any]]) -> Optional[str]:
    """None if ``spec`` names something procsv has, else why not."""
    from procsv import train

    m = _SPEC.fullmatch(spec)
    if m is None:
        return f"cannot read {spec!r}"
    owner = getattr(train, m.group("owner"), None)
    if owner is None:
        return f"procsv.train has no {m.group('owner')}"
    target = owner
    if m.group("attr"):
        name = m.group("attr")
        if hasattr(owner, name):
            target = getattr(owner, name)
        elif m.group("owner") in instances and hasattr(instances[m.group("owner")](), name):
            target = getattr(instances[m.group("owner")](), name)
        else:
            return f"procsv.train.{m.group('owner')} has no {name}"
    if spec.endswith(")") and not callable(target):
        return f"{spec}: not callable"
    if m.group("arg"):
        try:
            params = inspect.signature(target).parameters
        except (TypeError, ValueError):
            return f"{spec}: no signature to look the argument up in"
        arg = m.group("arg")
        takes_kwargs = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
        # a ``**kwargs`` function takes a keyword its code reads by name (``kwargs.pop("feed_dict")``)
        if arg not in params and not (takes_kwargs and f'"{arg}"' in inspect.getsource(target)):
            return f"{spec}: no argument {arg!r} in {list(params)}"
    return None


def check_names(rows: list[Row], instances: dict[str, Callable[[], Any]]) -> list[str]:
    """(a) A named row that is not MISSING names something procsv has."""
    problems = []
    for r in rows:
        if r.kind in NAMED_KINDS and r.status != "MISSING" and r.spec:
            why = resolve(r.spec, instances)
            if why:
                problems.append(f"row {r.number} ({r.status}): {why}")
    return problems


# ------------------------------------------------------------------------------ (b) tests exist
def check_tests(rows: list[Row], root: Path = ROOT) -> list[str]:
    """(b) IMPLEMENTED rows name a test; every named test exists."""
    problems = []
    for r in rows:
        if r.status == "IMPLEMENTED" and not r.tests:
            problems.append(f"row {r.number} ({r.item}): IMPLEMENTED without a test (tests/<file>.py::<test>)")
        if r.test_cell and r.test_cell.count("::") != len(r.tests):
            problems.append(f"row {r.number}: a test reference that is not tests/<file>.py::<test>: {r.test_cell!r}")
        for path, name, case in r.tests:
            file = root / path
            if not file.is_file():
                problems.append(f"row {r.number}: no file {path}")
                continue
            source = file.read_text(encoding="utf-8")
            found = re.search(rf"^(?:async )?def {re.escape(name)}\(", source, re.M)
            if not found:
                problems.append(f"row {r.number}: no test {name} in {path}")
                continue
            if case is not None:
                before = source[:found.start()].rstrip().splitlines()[-3:]
                if not any("parametrize" in line for line in before) or not all(
                        part in source for part in case.split("-")):
                    problems.append(f"row {r.number}: {name}[{case}] is not a parametrized case of {path}")
    return problems


# ------------------------------------------------------------------------------ (c) counts
def parse_counts(text: str) -> dict[str, dict[str, int]]:
    """The counts table after :data:`COUNTS_MARK`: {part: {rows, IMPLEMENTED, PARTIAL, MISSING}}."""
    after = text.split(COUNTS_MARK, 1)[1].lstrip().splitlines()
    header = _cells(after[0])
    counts = {}
    for line in after[2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip("*` ") for c in _cells(line)]
        counts[cells[0]] = {h: int(v) for h, v in zip(header[1:], cells[1:])}
    return counts


def recount(rows: list[Row]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for part in [*dict.fromkeys(r.section for r in rows), "all"]:
        mine = [r for r in rows if part in ("all", r.section)]
        out[part] = {"rows": len(mine), **{s: sum(r.status == s for r in mine) for s in STATUSES}}
    return out


def check_counts(text: str, rows: list[Row]) -> list[str]:
    """(c) The page's counts are the rows'."""
    if COUNTS_MARK not in text:
        return [f"no counts table after {COUNTS_MARK}"]
    stated, actual = parse_counts(text), recount(rows)
    if stated != actual:
        return [f"the counts at the top say {stated}, the rows say {actual}"]
    return []


# ------------------------------------------------------------------------------ (d) seed items
def check_seed_items(rows: list[Row], items: set[str]) -> list[str]:
    """(d) Every seed item has a row: a named item is a row's code span, a quoted one is in a row's item."""
    specs = {r.spec for r in rows if r.spec}
    missing = sorted(i for i in items if (i not in specs if not i.startswith('"') else
                                           not any(i in r.item for r in rows)))
    return [f"no row for the seed item {i}" for i in missing]


def all_problems(text: str, instances: dict[str, Callable[[], Any]], items: set[str]) -> list[str]:
    rows, problems = parse_rows(text)
    return (problems + check_rows(rows) + check_names(rows, instances) + check_tests(rows)
            + check_counts(text, rows) + check_seed_items(rows, items))


# ------------------------------------------------------------------------------ the tests
@pytest.fixture(scope="module")
def instances(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Callable[[], Any]]:
    return _instances(str(tmp_path_factory.mktemp("parity")))


@pytest.fixture(scope="module")
def text():
    return DOC.read_text(encoding="utf-8")


def test_the_table_parses_and_its_rows_are_well_formed(text):
    rows, problems = parse_rows(text)
    assert len(rows) > 100
    assert problems + check_rows(rows) == []


def test_every_name_a_row_gives_exists_in_procsv(text, instances):
    import procsv
    from procsv import train

    assert procsv.Supervisor is train.Supervisor  # the Supervisor rows are procsv.Supervisor's too
    rows, _ = parse_rows(text)
    assert check_names(rows, instances) == []


def test_no_row_is_implemented_without_a_test_that_exists(text):
    rows, _ = parse_rows(text)
    assert check_tests(rows) == []


def test_the_counts_at_the_top_are_the_rows_counts(text):
    rows, _ = parse_rows(text)
    assert check_counts(text, rows) == []


def test_every_item_of_the_seed_pages_has_a_row(text):
    rows, _ = parse_rows(text)
    assert check_seed_items(rows, parity_seeds.checked_in()) == []


def test_the_checked_in_seed_items_are_what_the_seed_pages_hold():
    folder = parity_seeds.seeds_dir()
    if folder is None:
        pytest.skip("the seed pages are not here (set PROCSV_SEEDS); tests/parity_seed_items.txt is used")
    assert parity_seeds.extract(folder) == parity_seeds.checked_in()


def test_renumbering_the_page_changes_nothing(text):
    """The page is as ``--renumber`` writes it (so the helper is safe to run after an edit)."""
    assert renumber(text) == text


def _row_line(text: str, item: str) -> str:
    (line,) = [line for line in text.splitlines() if line.startswith("| ") and f"| {item} |" in line]
    return line


def _replace_row(text: str, item: str, old: str, new: str) -> str:
    line = _row_line(text, item)
    assert old in line, (item, old)
    return text.replace(line, line.replace(old, new))


def _break(text: str, breakage: str) -> str:
    """A copy of the page broken one way."""
    if breakage == "unknown name":
        return _replace_row(text, "`Supervisor.loop()`", "`Supervisor.loop()`", "`Supervisor.loop_forever()`")
    if breakage == "unknown argument":
        return _replace_row(text, "`MonitoredSession.run(feed_dict=)`", "feed_dict=", "feed_dicts=")
    if breakage == "implemented without test":  # (an IMPLEMENTED row's test cell emptied)
        line = _row_line(text, "`Supervisor.stop()`")
        cells = _cells(line)
        return text.replace(line, "| " + " | ".join([*cells[:4], "", cells[5]]) + " |")
    if breakage == "no such test":
        return _replace_row(text, "`Supervisor.loop()`", "tests/test_coordinator.py::", "tests/test_coordinator.py::nope_")
    if breakage == "no such case":
        return text.replace("[monitored_training]", "[monitored_trainingX]")
    if breakage == "wrong count":
        all_row = next(line for line in text.split(COUNTS_MARK, 1)[1].splitlines() if line.startswith("| **all**"))
        cells = _cells(all_row)
        return text.replace(all_row, "| " + " | ".join([cells[0], str(int(cells[1].strip("*")) + 1), *cells[2:]]) + " |")
    if breakage == "dropped seed item":
        return text.replace(_row_line(text, "`Supervisor(init_fn=)`") + "\n", "")
    if breakage == "blank line in a table":
        return text.replace(_row_line(text, "`Supervisor(init_fn=)`") + "\n", "\n")
    if breakage == "n/a status":
        return _replace_row(text, "`Supervisor`: master `'local'` requests a session through the RPC master interface",
                            "| PARTIAL |", "| n/a |")
    if breakage == "partial without missing":
        return _replace_row(text, "`Supervisor.saver`", "Missing:", "Lacking:")
    assert breakage == "wrong kind"
    return _replace_row(text, "`Supervisor.loop()`", "| method |", "| property |")


BREAKAGES = {  # each breakage, and what the check that must find it says
    "unknown name": "procsv.train.Supervisor has no loop_forever",
    "unknown argument": "no argument 'feed_dicts'",
    "implemented without test": "IMPLEMENTED without a test",
    "no such test": "no test nope_test_",
    "no such case": "[monitored_trainingX] is not a parametrized case",
    "wrong count": "the counts at the top say",
    "dropped seed item": "no row for the seed item Supervisor(init_fn=)",
    "blank line in a table": "a row outside a table",
    "n/a status": "status 'n/a' is not one of",
    "partial without missing": "says exactly what is missing",
    "wrong kind": "kind property does not match",
}


@pytest.mark.parametrize("breakage", list(BREAKAGES))
def test_each_check_finds_a_broken_table(text, instances, breakage):
    """Each check fails on a copy of the page broken its way (a check that cannot fail is no check)."""
    items = parity_seeds.checked_in()
    assert all_problems(text, instances, items) == []
    broken = _break(text, breakage)
    assert broken != text
    problems = all_problems(broken, instances, items)
    assert any(BREAKAGES[breakage] in p for p in problems), problems


def renumber(text: str) -> str:
    """The page with its rows numbered 1..N in order and its counts table recomputed from the rows."""
    out = []
    number = 0
    in_table = False
    for line in text.split("\n"):
        if line.strip() == HEADER:
            in_table = True
        elif in_table and not line.startswith("|"):
            in_table = False
        elif in_table and _cells(line)[0].isdigit():
            number += 1
            line = re.sub(r"^\|\s*\d+\s*\|", f"| {number} |", line)
        out.append(line)
    text = "\n".join(out)
    rows, _ = parse_rows(text)
    head, rest = text.split(COUNTS_MARK, 1)
    lines = rest.lstrip("\n").split("\n")
    end = next(i for i, line in enumerate(lines) if not line.startswith("|"))
    table = ["| part | rows | " + " | ".join(STATUSES) + " |", "|---|---|---|---|---|"]
    for part, c in recount(rows).items():
        cells = [str(c["rows"]), *(str(c[s]) for s in STATUSES)]
        table.append(f"| {part} | " + " | ".join(cells) + " |" if part != "all" else
                     "| **all** | " + " | ".join(f"**{v}**" for v in cells) + " |")
    return head + COUNTS_MARK + "\n" + "\n".join(table + lines[end:])


if __name__ == "__main__":
    import sys

    if sys.argv[1:] != ["--renumber"]:
        sys.exit("usage: python tests/test_parity.py --renumber")
    DOC.write_text(renumber(DOC.read_text(encoding="utf-8")), encoding="utf-8")
