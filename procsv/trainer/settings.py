"""How the Supervisor shows its collaborators' names and the settings a program may change.

Runs in the trainer process. Three descriptors, each declared in the Supervisor's class body:

* :class:`Forward` (a method): ``sv.should_stop`` is ``sv.coord.should_stop``. On an instance it
  is the collaborator's bound method (so a subclass's override, and its ``super()``, work as with a
  method of the Supervisor's own); on the class it is a function taking the Supervisor first, with
  the collaborator's docstring and signature (``Supervisor.log_scalar(sv, ...)``, ``help()``).
* :class:`ForwardValue` (a property): ``sv.graph`` is ``sv._surface.graph``, read each time.
* :class:`Setting`: ``sv.save_summaries_secs`` is ``sv._settings.save_summaries_secs``, read and
  written; the collaborators hold the same :class:`Settings` and read it live, so a value a
  program sets after construction is the one used (TF's Supervisor kept them as attributes).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Concatenate, Generic, Mapping, Optional, ParamSpec, TypeVar, overload

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")


@dataclasses.dataclass
class Settings:
    """The Supervisor's settings that its collaborators read live (a program may set them on the
    Supervisor after building it)."""

    save_summaries_secs: Optional[float]
    summary_fn: Optional[Callable[[], Mapping[str, Any]]]
    stop_grace_secs: float
    recovery_wait_secs: float
    init_fn: Optional[Callable[[Any], None]]
    checkpoint_basename: str


class Forward(Generic[P, R]):
    """A method of the Supervisor that is a collaborator's: ``log_scalar = Forward(SummaryLog.log_scalar,
    "_summaries")`` (the collaborator's function, typed, and the Supervisor's attribute that holds it)."""

    def __init__(self, fn: Callable[Concatenate[Any, P], R], collaborator: str) -> None:
        self.collaborator = collaborator
        self.name = fn.__name__

        @functools.wraps(fn)
        def through(owner: Any, *args: P.args, **kwargs: P.kwargs) -> R:
            method: Callable[P, R] = getattr(getattr(owner, collaborator), self.name)
            return method(*args, **kwargs)

        self._through = through

    @overload
    def __get__(self, obj: None, objtype: Optional[type] = None) -> Callable[Concatenate[Any, P], R]: ...

    @overload
    def __get__(self, obj: object, objtype: Optional[type] = None) -> Callable[P, R]: ...

    def __get__(self, obj: Optional[object], objtype: Optional[type] = None) -> Any:
        if obj is None:
            return self._through
        return getattr(getattr(obj, self.collaborator), self.name)


class ForwardValue(Generic[T]):
    """A read-only attribute of the Supervisor that is a collaborator's (a property there), read each time."""

    def __init__(self, collaborator: str, doc: str = "") -> None:
        self.collaborator = collaborator
        self.name = ""
        self.__doc__ = doc

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, obj: None, objtype: Optional[type] = None) -> "ForwardValue[T]": ...

    @overload
    def __get__(self, obj: object, objtype: Optional[type] = None) -> T: ...

    def __get__(self, obj: Optional[object], objtype: Optional[type] = None) -> Any:
        if obj is None:
            return self
        return getattr(getattr(obj, self.collaborator), self.name)


class Setting(Generic[T]):
    """An attribute of the Supervisor that is its :class:`Settings`' (``_settings``): read and written there."""

    def __init__(self) -> None:
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, obj: None, objtype: Optional[type] = None) -> "Setting[T]": ...

    @overload
    def __get__(self, obj: object, objtype: Optional[type] = None) -> T: ...

    def __get__(self, obj: Optional[object], objtype: Optional[type] = None) -> Any:
        if obj is None:
            return self
        return getattr(obj.__dict__["_settings"], self.name)

    def __set__(self, obj: object, value: T) -> None:
        setattr(obj.__dict__["_settings"], self.name, value)
