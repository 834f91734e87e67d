"""How procsv's objects lean on one another, read from the source (``ast``; pure: nothing of
procsv or TensorFlow is imported). The measures ``test_rooms`` applies to the repository and to
planted trees; each takes ``{installed dotted name: path}`` (``test_rooms.modules``) and returns
what it found, keyed ``"module:what"`` so that a baseline can list it exactly:

* :func:`private_reaches`: ``x._name``, ``getattr(x, "_name")`` (and ``hasattr``, ``setattr``,
  ``delattr``) and ``from m import _name``, where ``x`` is not the object itself (``self``,
  ``cls``, ``super()``, ``type(self)``): code reading or setting another object's private names;
* :func:`field_writes`: ``x.name = ...`` (any store or ``del``, ``setattr(x, "name", ...)``) where
  ``x`` is not the object itself nor an object the same function made (a name bound there to a
  constructor call ``Name(...)``, or a ``def``/``class`` there): code setting another object's state;
* :func:`class_attributes`: what each class keeps (``self.x`` stored in its methods, annotated
  class-level fields, ``__slots__``);
* :func:`mixins`: classes named ``...Mixin``, and half-classes: a class whose methods read a
  ``self.x`` that neither it nor its bases provide (its subclass is to supply it);
* :func:`stubs`: functions whose body is only ``raise NotImplementedError``;
* :func:`long_modules_without_one_concern`: modules over a line count whose docstring has no line
  ``One concern: ...``.
"""

from __future__ import annotations

import ast
import collections
import functools
import pathlib
from typing import Iterator, Optional, Union

Modules = dict[str, pathlib.Path]
FunctionNode = Union[ast.FunctionDef, ast.AsyncFunctionDef]
SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)
ATTRIBUTE_CALLS = {"getattr", "hasattr", "setattr", "delattr"}
ONE_CONCERN = "One concern:"


@functools.lru_cache(maxsize=None)
def _parse(path: pathlib.Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


def _within(mods: Modules, under: Optional[str]) -> Iterator[tuple[str, pathlib.Path]]:
    for name, path in mods.items():
        if under is None or name == under or name.startswith(under + "."):
            yield name, path


def _private(name: str) -> bool:
    """``_x`` and ``__x``, not ``__x__``."""
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _own(node: ast.expr) -> bool:
    """The object itself: ``self``, ``cls``, ``super()``, ``type(self)``."""
    if isinstance(node, ast.Name):
        return node.id in ("self", "cls")
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        if node.func.id == "super":
            return True
        return node.func.id == "type" and len(node.args) == 1 and _own(node.args[0])
    return False


def _named(node: ast.Call) -> Optional[tuple[ast.expr, str]]:
    """``getattr(x, "name", ...)`` and its kin, and ``object.__setattr__(x, "name", v)``: (x, name)."""
    func = node.func
    by_name = isinstance(func, ast.Name) and func.id in ATTRIBUTE_CALLS
    by_object = (isinstance(func, ast.Attribute) and func.attr in ("__setattr__", "__delattr__")
                 and isinstance(func.value, ast.Name) and func.value.id == "object")
    if (by_name or by_object) and len(node.args) >= 2:
        key = node.args[1]
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
            return node.args[0], key.value
    return None


def _writes_by_call(node: ast.Call) -> bool:
    func = node.func
    return ((isinstance(func, ast.Name) and func.id in ("setattr", "delattr"))
            or (isinstance(func, ast.Attribute) and func.attr in ("__setattr__", "__delattr__")))


def _source(name: str, path: pathlib.Path, node: ast.ImportFrom) -> str:
    """The module ``from ... import`` reads, relative imports resolved as Python resolves them."""
    if not node.level:
        return node.module or ""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    parts = package.split(".")
    base = parts[: len(parts) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def private_reaches(mods: Modules, under: Optional[str] = None) -> collections.Counter[str]:
    """Every reach into another object's (or module's) private name in the modules under ``under``:
    ``"module:receiver._name"`` (an import: ``"module:source._name"``) -> how many times."""
    found: collections.Counter[str] = collections.Counter()
    for name, path in _within(mods, under):
        for node in ast.walk(_parse(path)):
            if isinstance(node, ast.Attribute) and _private(node.attr) and not _own(node.value):
                found[f"{name}:{ast.unparse(node.value)}.{node.attr}"] += 1
            elif isinstance(node, ast.Call) and (named := _named(node)) is not None:
                target, attr = named
                if _private(attr) and not _own(target):
                    found[f"{name}:{ast.unparse(target)}.{attr}"] += 1
            elif isinstance(node, ast.ImportFrom):
                source = _source(name, path, node)
                found.update(f"{name}:{source}.{a.name}" for a in node.names if _private(a.name))
    return found


def _scope_nodes(scope: ast.AST) -> Iterator[ast.AST]:
    """The nodes of one scope's own code: not those of the functions and classes inside it."""
    todo = list(ast.iter_child_nodes(scope))
    while todo:
        node = todo.pop()
        yield node
        if not isinstance(node, SCOPES):
            todo.extend(ast.iter_child_nodes(node))


def _made_here(nodes: list[ast.AST]) -> set[str]:
    """The names a scope binds to an object it makes: ``x = Name(...)`` (a constructor, by its
    capital), a ``def`` or a ``class``."""
    made: set[str] = set()
    for node in nodes:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            made.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.Call):
            func = node.value.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if called[:1].isupper():
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                made.update(t.id for t in targets if isinstance(t, ast.Name))
    return made


def _root(node: ast.expr) -> Optional[str]:
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def field_writes(mods: Modules, exempt: frozenset[str] = frozenset()) -> dict[str, list[str]]:
    """Per module (but those in ``exempt``), each store into another object's field, as
    ``"line: target"``; modules with none are left out."""
    found: dict[str, list[str]] = {}
    for name, path in mods.items():
        if name in exempt:
            continue
        tree = _parse(path)
        writes: list[str] = []
        for scope in [tree, *(n for n in ast.walk(tree) if isinstance(n, SCOPES))]:
            nodes = list(_scope_nodes(scope))
            made = _made_here(nodes)
            for node in nodes:
                if isinstance(node, ast.Attribute) and isinstance(node.ctx, (ast.Store, ast.Del)):
                    target, text, line = node.value, ast.unparse(node), node.lineno
                elif isinstance(node, ast.Call) and _writes_by_call(node) and (named := _named(node)):
                    target, text, line = named[0], f"{ast.unparse(named[0])}.{named[1]}", node.lineno
                else:
                    continue
                if not _own(target) and _root(target) not in made:
                    writes.append(f"{line}: {text}")
        if writes:
            found[name] = sorted(writes, key=lambda w: (int(w.split(":")[0]), w))
    return found


def _classes(tree: ast.Module) -> Iterator[tuple[str, ast.ClassDef]]:
    """Every class of a module, by its qualified name (``Outer.Inner``; a class made inside a
    function is named after the function: ``f.Local``)."""
    def visit(node: ast.AST, prefix: str) -> Iterator[tuple[str, ast.ClassDef]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                yield prefix + child.name, child
                yield from visit(child, prefix + child.name + ".")
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield from visit(child, prefix + child.name + ".")
            else:
                yield from visit(child, prefix)
    return visit(tree, "")


def _methods(cls: ast.ClassDef) -> Iterator[tuple[str, FunctionNode]]:
    """Each method with the name its instance goes by (its first argument); static and class
    methods are left out."""
    for node in cls.body:
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        decorators = {getattr(d, "id", getattr(d, "attr", "")) for d in node.decorator_list}
        args = node.args.posonlyargs + node.args.args
        if args and not decorators & {"staticmethod", "classmethod"}:
            yield args[0].arg, node


def _self_names(cls: ast.ClassDef, ctx: type[ast.expr_context]) -> set[str]:
    """The ``self.x`` names the class's methods (and the functions inside them) store or load."""
    names: set[str] = set()
    for me, method in _methods(cls):
        todo: list[ast.AST] = [method]
        while todo:
            node = todo.pop()
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ctx) and isinstance(node.value, ast.Name) \
                    and node.value.id == me:
                names.add(node.attr)
            todo.extend(c for c in ast.iter_child_nodes(node) if not isinstance(c, ast.ClassDef))
    return names


def _dataclass(cls: ast.ClassDef) -> bool:
    for d in cls.decorator_list:
        d = d.func if isinstance(d, ast.Call) else d
        if getattr(d, "id", getattr(d, "attr", "")) == "dataclass":
            return True
    return False


def _fields(cls: ast.ClassDef) -> set[str]:
    """Annotated class-level names (not ``ClassVar``) and ``__slots__``."""
    names: set[str] = set()
    for node in cls.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) \
                and "ClassVar" not in ast.unparse(node.annotation):
            names.add(node.target.id)
        elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__slots__" for t in node.targets):
            names.update(c.value for c in ast.walk(node.value) if isinstance(c, ast.Constant) and isinstance(c.value, str))
    return names


def class_attributes(mods: Modules) -> dict[str, set[str]]:
    """``"module:Class"`` -> the attributes its instances keep: annotated fields, ``__slots__``,
    and every ``self.x`` its methods store."""
    found: dict[str, set[str]] = {}
    for name, path in mods.items():
        for qual, cls in _classes(_parse(path)):
            found[f"{name}:{qual}"] = _fields(cls) | _self_names(cls, ast.Store)
    return found


# bases that provide nothing a subclass's ``self.x`` could be reading
PLAIN_BASES = {"object", "ABC", "Generic"}
# a class deriving from one of these is an interface or a record, not a half of a class
NOT_MIXIN_BASES = {"Protocol", "NamedTuple", "TypedDict"}


class _Index:
    """The module-level classes of a tree, and how each module's names resolve to them (its own
    classes and ``from m import C``)."""

    def __init__(self, mods: Modules) -> None:
        self.classes: dict[str, ast.ClassDef] = {}
        self.names: dict[str, dict[str, str]] = {}
        for name, path in mods.items():
            tree = _parse(path)
            local = self.names.setdefault(name, {})
            for node in tree.body:
                if isinstance(node, ast.ClassDef):
                    self.classes[f"{name}:{node.name}"] = node
                    local[node.name] = f"{name}:{node.name}"
            for imp in ast.walk(tree):
                if isinstance(imp, ast.ImportFrom):
                    source = _source(name, path, imp)
                    for a in imp.names:
                        local.setdefault(a.asname or a.name, f"{source}:{a.name}")

    def base(self, module: str, node: ast.expr) -> Optional[str]:
        """The key of a base class in this tree, ``""`` for a plain base, None when unknown."""
        if isinstance(node, ast.Subscript):
            node = node.value
        last = node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")
        if last in PLAIN_BASES:
            return ""
        if isinstance(node, ast.Name):
            key = self.names.get(module, {}).get(node.id)
            if key is not None and key in self.classes:
                return key
        return None

    def provided(self, key: str, seen: frozenset[str] = frozenset()) -> Optional[set[str]]:
        """What a class and its bases provide to ``self``; None when a base is outside the tree."""
        cls = self.classes[key]
        module = key.split(":")[0]
        names = {n.name for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
        for node in cls.body:
            if isinstance(node, ast.Assign):
                names.update(t.id for t in node.targets if isinstance(t, ast.Name))
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) \
                    and (node.value is not None or _dataclass(cls)):
                names.add(node.target.id)  # a bare annotation declares, it does not provide
        names |= _self_names(cls, ast.Store)
        for b in cls.bases:
            base = self.base(module, b)
            if base is None or base in seen:
                return None
            if base:
                more = self.provided(base, seen | {key})
                if more is None:
                    return None
                names |= more
        return names


def mixins(mods: Modules) -> dict[str, list[str]]:
    """``"module:Class"`` (module-level classes) -> why it is a mixin: its name, or the ``self.x``
    it reads that neither it nor its bases provide. Classes with a base outside the tree (TensorFlow's, Keras's, the
    standard library's but ``object``/``ABC``/``Generic``) cannot be judged and are left out, as are
    protocols and records."""
    index = _Index(mods)
    found: dict[str, list[str]] = {}
    for key, cls in index.classes.items():
        base_names = {getattr(b, "id", getattr(b, "attr", "")) for b in cls.bases}
        if base_names & NOT_MIXIN_BASES:
            continue
        if cls.name.endswith("Mixin"):
            found[key] = ["named a mixin"]
            continue
        provided = index.provided(key)
        if provided is None:
            continue
        wanted = {n for n in _self_names(cls, ast.Load) - provided if not (n.startswith("__") and n.endswith("__"))}
        if wanted:
            found[key] = sorted(f"self.{n} given by a subclass" for n in wanted)
    return found


def _stub(fn: FunctionNode) -> bool:
    body = fn.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        body = body[1:]
    if len(body) != 1 or not isinstance(body[0], ast.Raise) or body[0].exc is None:
        return False
    exc = body[0].exc
    exc = exc.func if isinstance(exc, ast.Call) else exc
    return isinstance(exc, ast.Name) and exc.id == "NotImplementedError"


def stubs(mods: Modules) -> set[str]:
    """``"module:Class.method"`` (a function outside a class: ``"module:function"``) for each
    function whose body (its docstring aside) is only ``raise NotImplementedError``."""
    found: set[str] = set()
    for name, path in mods.items():
        tree = _parse(path)
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _stub(node):
                found.add(f"{name}:{node.name}")
        for qual, cls in _classes(tree):
            found.update(f"{name}:{qual}.{fn.name}" for fn in cls.body
                         if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and _stub(fn))
    return found


def long_modules_without_one_concern(mods: Modules, max_lines: int) -> list[str]:
    """The modules over ``max_lines`` lines whose docstring lacks a line ``One concern: <what>``
    (the one thing the module is about, which is why it is long): ``"path (n lines)"``."""
    bad: list[str] = []
    for name, path in sorted(mods.items()):
        n = len(path.read_text().splitlines())
        if n <= max_lines:
            continue
        doc = ast.get_docstring(_parse(path)) or ""
        said = [line.strip()[len(ONE_CONCERN):].strip() for line in doc.splitlines()
                if line.strip().startswith(ONE_CONCERN)]
        if not any(said):
            bad.append(f"{name} ({n} lines)")
    return bad
