"""Validation of logged summary values, at the call site: one real number (read there), an integer step, arrays.

Runs in the trainer, in whichever thread logs. Every function raises TypeError or ValueError
naming the tag in the caller's frame, so the summary service never sees garbage; arrays are
copied, so the caller may reuse its own at once.
"""

from __future__ import annotations

import operator
import sys
from typing import Any, Optional

import numpy as _np


def check_tag(tag: Any) -> str:
    """``tag`` if it is a non-empty string (not only blanks); ValueError otherwise."""
    if not isinstance(tag, str) or not tag.strip():
        raise ValueError(f"summary tag must be a non-empty string, got {tag!r}")
    return tag


_REAL_SCALARS = frozenset(_np.dtype(c).type for c in "?bhilqBHILQefd")


def as_float(tag: str, value: Any) -> float:
    """``value`` as a float; TypeError naming the tag for anything but one real number (NaN/inf are kept)."""
    check_tag(tag)
    return value if type(value) is float else real(tag, value)


def real(tag: str, value: Any) -> float:
    """``value`` (anything but a Python float) as a float; TypeError naming the tag if it is not one real number."""
    original = value
    # checked first: autograph converts this very code when a traced function calls it, and would
    # turn float() below into a cast that returns a tensor
    _refuse_symbolic(tag, value)
    to_numpy = getattr(value, "_numpy", None) or getattr(value, "numpy", None)  # an eager tensor's is cheapest
    if to_numpy is not None:
        try:
            value = to_numpy()
        except Exception:  # a foreign object
            raise TypeError(_unreadable(tag, original)) from None
        if type(value) in _REAL_SCALARS:
            return float(value)  # the common case: a scalar tensor gives a NumPy scalar
    kind = getattr(getattr(value, "dtype", None), "kind", "f")
    shape = getattr(value, "shape", ())
    try:
        if isinstance(value, (str, bytes, bytearray, complex)) or kind not in "biuf" or shape not in ((), (1,)):
            raise TypeError
        return float(value[0] if shape == (1,) else value)
    except (TypeError, ValueError):
        raise TypeError(f"summary {tag!r}: value must be a real number, got {type(original).__name__} "
                        f"{original!r:.60}") from None


def _unreadable(tag: str, value: Any) -> str:
    return (f"summary {tag!r}: cannot read the value of {type(value).__name__} here; "
            "log eager values, outside tf.function")


def _refuse_symbolic(tag: str, value: Any) -> None:
    """TypeError naming the tag for a symbolic tensor (a summary logged inside tf.function)."""
    tf = sys.modules.get("tensorflow")
    if tf is not None and tf.is_symbolic_tensor(value):
        raise TypeError(_unreadable(tag, value))


_eager: Optional[tuple[Any, frozenset[int]]] = None  # TF's eager tensor type, the enums of its real dtypes


def eager_kinds() -> tuple[Any, frozenset[int]]:
    """TF's eager tensor type and the dtype enums of one real number (TensorFlow must be imported)."""
    global _eager
    if _eager is None:
        import tensorflow as tf

        reals = (tf.bool, tf.float16, tf.bfloat16, tf.float32, tf.float64, tf.int8, tf.int16, tf.int32, tf.int64,
                 tf.uint8, tf.uint16, tf.uint32, tf.uint64)
        with tf.init_scope():  # eager even when the first call comes from inside a tf.function
            if tf.executing_eagerly():
                kind = type(tf.constant(0.0))
            else:  # a TF1 graph program: a constant would be an op in its graph, which may be frozen
                from tensorflow.python.framework.ops import EagerTensor

                kind = EagerTensor
        _eager = (kind, frozenset(d.as_datatype_enum for d in reals))
    return _eager


def read_floats(tags: list[str], values: list[Any], eager: Optional[tuple[Any, frozenset[int]]]) -> list[float]:
    """``values`` (logged under ``tags``) read into floats, in place; TypeError naming the tag of
    the first that is not one real number. ``eager``: :func:`eager_kinds` once TF is imported.

    An eager tensor is read now, with ``_numpy_internal`` (the C method behind ``Tensor.numpy()``,
    without ``_numpy``'s Python frame around it); if that fails, :func:`real` reads it the
    documented way and names the tag. Read at once, not kept for a later batched read: in the
    digits training loop a tensor kept until the hand-off cost 1.2 us to read there, and the
    tensors kept alive triggered a garbage collection every ~35 steps; read at once it costs about
    1 us, 0.7 of it TensorFlow's conversion (``scripts/bench_summary.py`` (c): ten scalars a step
    cost the digits step 5 %, against 8 % kept for the hand-off; reading them alone 2.5 %).
    """
    kind_eager, reals = eager or (None, frozenset())
    for i, value in enumerate(values):
        kind = type(value)
        if kind is float:
            continue
        if kind is kind_eager and value._datatype_enum() in reals:
            try:
                arr = value._numpy_internal()
            except Exception:
                arr = None
            if arr is not None:
                if arr.ndim == 0:
                    values[i] = float(arr)
                    continue
                if arr.shape == (1,):
                    values[i] = float(arr[0])
                    continue
        values[i] = real(tags[i], value)
    return values


def as_step(step: Any) -> int:
    """An explicit ``step=``: an integer (Python, NumPy or a scalar integer tensor)."""
    if hasattr(step, "numpy"):
        step = step.numpy()
    try:
        return operator.index(step)
    except TypeError:
        raise TypeError(f"summary step must be an integer, got {type(step).__name__} {step!r:.40}") from None


def _numeric_array(tag: str, what: str, data: Any) -> Any:
    import numpy as np

    _refuse_symbolic(tag, data)
    if hasattr(data, "numpy"):
        data = data.numpy()
    try:
        arr = np.asarray(data)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{what} {tag!r}: expected an array of real numbers: {exc}") from None
    if arr.dtype == np.bool_ or arr.dtype.kind not in "iuf":
        raise TypeError(f"{what} {tag!r}: expected real numbers, got dtype {arr.dtype}")
    return arr


def histogram_values(tag: str, values: Any) -> Any:
    """``values`` as a contiguous float64 copy; raise for a non-numeric or non-finite input."""
    import numpy as np

    check_tag(tag)
    arr = np.array(_numeric_array(tag, "histogram", values), dtype=np.float64, copy=True).ravel()
    if not np.isfinite(arr).all():
        raise ValueError(f"histogram {tag!r}: {int((~np.isfinite(arr)).sum())} values are NaN or infinite")
    return arr


def image_pixels(tag: str, images: Any, max_outputs: int) -> Any:
    """``[k, h, w, c]`` pixels (uint8, or float32 in [0, 1]); one ``[h, w, c]`` image is accepted too."""
    import numpy as np

    check_tag(tag)
    if not isinstance(max_outputs, int) or isinstance(max_outputs, bool) or max_outputs < 1:
        raise ValueError(f"image {tag!r}: max_outputs must be a positive integer, got {max_outputs!r}")
    arr = _numeric_array(tag, "image", images)
    if arr.ndim == 3:
        arr = arr[None]
    if arr.ndim != 4 or arr.shape[-1] not in (1, 2, 3, 4) or 0 in arr.shape[1:3]:
        raise ValueError(f"image {tag!r}: shape {list(np.shape(images))} is not [k, h, w, c] or [h, w, c] "
                         "with c = 1, 2, 3 or 4 channels and h, w > 0")
    arr = arr[:max_outputs]
    if arr.dtype == np.uint8:
        return np.ascontiguousarray(arr).copy()
    if arr.dtype.kind == "f":
        return np.array(arr, dtype=np.float32, copy=True)
    raise TypeError(f"image {tag!r}: pixels must be uint8 (0..255) or floating point (0..1), got {arr.dtype}")


def text_strings(tag: str, text: Any) -> tuple[list[str], list[int]]:
    """``text`` (a string, or an array/list of strings) flattened, and its shape."""
    import numpy as np

    check_tag(tag)
    _refuse_symbolic(tag, text)
    if hasattr(text, "numpy"):
        text = text.numpy()
    arr = np.asarray(text, dtype=object) if not isinstance(text, (str, bytes)) else np.asarray(text, dtype=object)
    flat: list[str] = []
    for s in arr.ravel().tolist():
        if isinstance(s, bytes):
            try:
                s = s.decode()
            except UnicodeDecodeError:
                raise ValueError(f"text {tag!r}: bytes that are not UTF-8") from None
        if not isinstance(s, str):
            raise TypeError(f"text {tag!r}: expected strings, got {type(s).__name__} {s!r:.40}")
        flat.append(s)
    return flat, list(arr.shape)
