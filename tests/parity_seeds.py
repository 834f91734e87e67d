"""The items of the seed pages (TensorFlow's ``Supervisor`` and ``MonitoredSession`` API pages), as
``docs/parity.md`` names them: a small parser of the four seed files, used by ``test_parity.py``.

Pure: reads text files only. Each item is a string in the table's item syntax:

* ``Supervisor`` (a class), ``MonitoredSession.StepContext`` (a class a class holds);
* ``Supervisor(graph=)`` (a constructor argument), ``Supervisor.loop(target=)`` (a method's);
* ``Supervisor.loop()`` (a method), ``Supervisor.coord`` (a property or field);
* ``"Use for a single program"`` (a quoted section heading or bullet of a page: a documented
  behaviour, or a code example; some row of the table quotes it).

The seeds are: 000, the .NET binding's page (full method signatures; its ``*_dyn`` and ``NewDyn``
twins are the same items); 001, tensorflow.org's page (its method blocks lost their names: each is
known by its first sentence, :data:`UNNAMED_BLOCKS`); 002, a translated page (the constructor's
signature, the properties); 003, the MonitoredSession page.
"""

from __future__ import annotations

import keyword
import os
import re
from pathlib import Path
from typing import Iterable, Optional

REPO = Path(__file__).resolve().parent.parent
ITEMS_FILE = Path(__file__).resolve().parent / "parity_seed_items.txt"

# tensorflow.org's page (seed 001) lost the method names above its "View source" blocks: each block
# is known by its first sentence. A block whose sentence is not here fails the parse (a new item).
UNNAMED_BLOCKS = {
    "Start a LooperThread that calls a function periodically.": "loop",
    "Make sure the model is ready to be used.": "prepare_or_wait_for_session",
    "Request that the coordinator stop the threads.": "request_stop",
    "Check if the coordinator was told to stop.": "should_stop",
    "Start threads for QueueRunners.": "start_queue_runners",
    "Start the standard services for 'sess'.": "start_standard_services",
}
# objects the MonitoredSession page calls methods on, and their classes
RECEIVERS = {"hook": "SessionRunHook", "scaffold": "Scaffold", "step_context": "StepContext"}
# the train API's classes the pages name (in prose or code)
_CLASS_NAME = re.compile(r"\b((?:MonitoredTraining|Monitored|Singular)Session|\w+SessionCreator|Scaffold|"
                         r"\w+Hook|SessionManager|Coordinator|Supervisor|Saver|LooperThread)\b")
_BULLET = re.compile(r"^\s*[•\-]\s+(.*\S)\s*$")


def seeds_dir() -> Optional[Path]:
    """The seed pages: ``$PROCSV_SEEDS``, else ``../shared/seeds`` beside the repository; None if absent."""
    for candidate in (os.environ.get("PROCSV_SEEDS"), REPO.parent / "shared" / "seeds"):
        if candidate and Path(candidate).is_dir() and sorted(Path(candidate).glob("*.txt")):
            return Path(candidate)
    return None


def _seed(folder: Path, prefix: str) -> str:
    (path,) = sorted(folder.glob(f"{prefix}_*.txt"))
    return path.read_text(encoding="utf-8")


def _strip_dyn(name: str) -> str:
    return name[:-4] if name.endswith("_dyn") else name


def _params(text: str) -> list[str]:
    """``object a, IEnumerable<object> b`` -> [a, b] (a .NET parameter list)."""
    return [p.split()[-1] for p in re.split(r",\s*(?![^<]*>)", text) if p.strip()]


def dotnet_page(text: str) -> set[str]:
    """Seed 000: methods and their parameters, the constructor (``NewDyn``), properties, fields."""
    items: set[str] = set()
    section = ""
    for line in text.splitlines():
        if line.startswith("Public "):
            section = line
            continue
        sig = re.match(r"^[\w.]+(?:<[^>]*>)? (\w+)\((.*)\)\s*$", line)
        if sig and section == "Public instance methods":
            name = _strip_dyn(sig.group(1))
            items.add(f"Supervisor.{name}()")
            items.update(f"Supervisor.{name}({p}=)" for p in _params(sig.group(2)))
        elif sig and section == "Public static methods" and sig.group(1) == "NewDyn":
            items.add("Supervisor")
            items.update(f"Supervisor({p}=)" for p in _params(sig.group(2)))
        prop = re.match(r"^[\w.]+(?:<[^>]*>)? (\w+) get;", line)
        if prop and section == "Public properties" and prop.group(1) != "PythonObject":
            items.add(f"Supervisor.{_strip_dyn(prop.group(1))}")
        field = re.match(r"^int (\w+)$", line)
        if field and section == "Public fields":
            items.add(f"Supervisor.{field.group(1)}")
    return items


def _first_words(lines: Iterable[str]) -> list[str]:
    """The parameter names of a "name Description" table: each line's first word if it is a
    lowercase identifier (not a Python keyword, not an assignment: example code is skipped)."""
    out = []
    for line in lines:
        m = re.match(r"^([a-z_][a-z0-9_]*) (\S+)", line)
        if m and not keyword.iskeyword(m.group(1)) and m.group(2) != "=":
            out.append(m.group(1))
    return out


def _headings(text: str) -> list[str]:
    """A page's section headings: short lines of words followed by a blank line, no final punctuation."""
    lines = text.splitlines()
    out = []
    for i, line in enumerate(lines):
        s = line.strip()
        alone = i + 1 == len(lines) or not lines[i + 1].strip()
        if (alone and s and s == line and s[0].isupper() and len(s) <= 40 and not re.search(r"[.:,;()=#`'_]$", s)
                and not s.startswith("View source") and re.fullmatch(r"[A-Za-z ]+", s)):
            out.append(s)
    return out


def tensorflow_org_page(text: str) -> set[str]:
    """Seed 001: the section headings, the constructor's arguments, the properties, and the
    unnamed method blocks (:data:`UNNAMED_BLOCKS`) with their arguments."""
    items = {f'"{h}"' for h in _headings(text)}
    items.update(m.group(1) for m in _CLASS_NAME.finditer(text))
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("graph A Graph."))
    end = next(i for i in range(start, len(lines)) if not lines[i].strip())
    items.update(f"Supervisor({name}=)" for name in _first_words(lines[start:end]))
    items.update(f"Supervisor.{m.group(1)}" for m in re.finditer(r"^(\w+) Return ", text, re.M))
    blocks = text.split("\nView source\n")[1:]
    for block in blocks:
        body = [line for line in block.splitlines() if line.strip()]
        if not body:
            continue
        if body[0] not in UNNAMED_BLOCKS:
            raise ValueError(f"seed 001: a method block not in UNNAMED_BLOCKS: {body[0]!r}")
        name = UNNAMED_BLOCKS[body[0]]
        items.add(f"Supervisor.{name}()")
        items.update(f"Supervisor.{name}({p}=)" for p in _first_words(body[1:]))
    return items


def translated_page(text: str) -> set[str]:
    """Seed 002: the constructor's signature and the property list."""
    sig = re.search(r"tf\.compat\.v1\.train\.Supervisor\(\s*(.*?)\n\)", text, re.S)
    assert sig, "seed 002: no constructor signature"
    items = {f"Supervisor({m.group(1)}=)" for m in re.finditer(r"(\w+)=", sig.group(1))}
    props = text.split("属性", 1)[1].split("此类已弃用", 1)[0]
    items.update(f"Supervisor.{m.group(1)}" for m in re.finditer(r"^\s*•\s+(\w+)", props, re.M))
    return items


def monitored_session_page(text: str) -> set[str]:
    """Seed 003: every bullet (quoted), the classes named, the receivers' methods, the constructor's
    arguments, the ``graph`` property, the methods and their ``Args`` tables, the child class."""
    items = {f'"{m.group(1)}"' for line in text.splitlines() if (m := _BULLET.match(line))}
    items.update(m.group(1) for m in _CLASS_NAME.finditer(text))
    for m in re.finditer(r"\b(hook|scaffold|step_context)\.(\w+)(\()?", text):
        cls = RECEIVERS[m.group(1)]
        items.add(f"{cls}.{m.group(2)}()" if m.group(3) else f"{cls}.{m.group(2)}")
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("session_creator "))
    end = next(i for i in range(start, len(lines)) if not lines[i].strip())
    items.update(f"MonitoredSession({name}=)" for name in _first_words(lines[start:end]))
    if re.search(r"^graph The graph", text, re.M):
        items.add("MonitoredSession.graph")
    items.update(f"MonitoredSession.{m.group(1)}" for m in re.finditer(r"^class (\w+)$", text, re.M))
    methods = text.split("\nMethods\n", 1)[1]
    chunks = re.split(r"^(\w+)\n\nView source$", methods, flags=re.M)
    for name, body in zip(chunks[1::2], chunks[2::2]):
        items.add(f"MonitoredSession.{name}()")
        if "\nArgs\n" in body:
            table = body.split("\nArgs\n", 1)[1].split("\nReturns\n", 1)[0].splitlines()
            items.update(f"MonitoredSession.{name}({p}=)" for p in _first_words(table))
    return items


def extract(folder: Path) -> set[str]:
    """Every item of the four seed pages."""
    return (dotnet_page(_seed(folder, "000")) | tensorflow_org_page(_seed(folder, "001"))
            | translated_page(_seed(folder, "002")) | monitored_session_page(_seed(folder, "003")))


def checked_in() -> set[str]:
    """The extraction as checked in (``tests/parity_seed_items.txt``), for runs without the seeds."""
    return {line for line in ITEMS_FILE.read_text(encoding="utf-8").splitlines() if line and not line.startswith("#")}


if __name__ == "__main__":  # print the extraction (to refresh tests/parity_seed_items.txt)
    found = seeds_dir()
    assert found is not None, "no seed pages: set PROCSV_SEEDS"
    print("\n".join(sorted(extract(found))))
