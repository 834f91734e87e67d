"""The Supervisor's settings its collaborators read live, and how it shows a collaborator's method.

Runs in the trainer process.

* :class:`Settings`: the settings a program may change after construction. The collaborators
  hold the same object and read it live; the Supervisor's properties of those names read and
  write it, so a value a program sets after building the Supervisor is the one used (TF's
  Supervisor kept them as attributes).
* :class:`Forward` (a method), declared in the Supervisor's class body: ``sv.should_stop`` is
  ``sv.coord.should_stop``. On an instance it is the collaborator's bound method (so a subclass's
  override, and its ``super()``, work as with a method of the Supervisor's own); on the class it
  is a function taking the Supervisor first, with the collaborator's docstring and signature
  (``Supervisor.log_scalar(sv, ...)``, ``help()``).
* :class:`ForwardValue`, declared there too, for the few values that are a collaborator's and that
  TF's Supervisor does not have: read each time, and a subclass may shadow them (TF's own values
  are the Supervisor's plain properties).
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

    def change(self, name: str, value: Any) -> None:
        """Set the setting ``name`` (the Supervisor's property of that name, typed there, is the one caller)."""
        if name not in {f.name for f in dataclasses.fields(self)}:
            raise AttributeError(f"no setting {name!r}")
        setattr(self, name, value)


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
    """A read-only value of the Supervisor that is a collaborator's and that TF's Supervisor does not
    have (``graph``, ``logdir``, ``local_init_op``, ``summaries_dropped``), read each time. Not a data
    descriptor, unlike a property: a subclass written for TF's Supervisor may keep an attribute of its
    own under such a name (``self.logdir = ...`` before ``super().__init__``), as it could on TF's,
    and then reads its own."""

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
