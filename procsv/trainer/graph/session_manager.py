"""``procsv.train.SessionManager``: TensorFlow's ``tf.compat.v1.train.SessionManager`` for graph programs.

Runs in the trainer process (graph mode). It makes a ``tf.compat.v1.Session`` of the graph and
makes the model ready as TF's page says: restore the newest checkpoint of ``checkpoint_dir`` (the
``checkpoint`` state file, which procsv's checkpoint service keeps as TF's ``Saver`` did) or the
one named, else run ``init_op`` (with ``init_feed_dict``) and ``init_fn(sess)``; then run
``local_init_op`` once ``ready_for_local_init_op`` reports nothing, and check ``ready_op``.

The graph-mode :class:`procsv.Supervisor` restores through procsv's checkpoint agent (the newest
committed checkpoint that verifies) and uses this class only for the local-init and ready checks
(:func:`finish_preparation`). As a class of its own it is TF's: a program that
builds sessions with it (a worker waiting for its chief, :meth:`wait_for_session`) gets TF's
behaviour, with procsv's checkpoints readable as TF's.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Optional

from procsv.common.clock.watched import process_clock

logger = logging.getLogger("procsv.train")


def ready(op: Any, sess: Any) -> tuple[bool, Optional[str]]:
    """Run a ready op (``report_uninitialized_variables``): ready when it returns nothing (or an
    int32 value, or there is no op); else the names it reports."""
    if op is None:
        return True, None
    import tensorflow as tf

    try:
        value = sess.run(op)
    except tf.errors.FailedPreconditionError as exc:
        if "uninitialized" not in str(exc):
            raise
        return False, str(exc)
    if value is None or getattr(value, "dtype", None) == "int32" or getattr(value, "size", 0) == 0:
        return True, None
    return False, "Variables not initialized: " + ", ".join(v.decode("utf-8") for v in value)


class SessionManager:
    """TF's ``SessionManager(local_init_op, ready_op, ready_for_local_init_op, graph,
    recovery_wait_secs, local_init_run_options, local_init_feed_dict)``."""

    def __init__(self, local_init_op: Any = None, ready_op: Any = None, ready_for_local_init_op: Any = None,
                 graph: Any = None, recovery_wait_secs: float = 30, local_init_run_options: Any = None,
                 local_init_feed_dict: Any = None) -> None:
        import tensorflow as tf

        if ready_for_local_init_op is not None and local_init_op is None:
            raise ValueError("If you pass a ready_for_local_init_op you must also pass a local_init_op , "
                             f"ready_for_local_init_op [{ready_for_local_init_op}]")
        self._graph = graph if graph is not None else tf.compat.v1.get_default_graph()
        self._local_init_op = local_init_op
        self._ready_op = ready_op
        self._ready_for_local_init_op = ready_for_local_init_op
        self._recovery_wait_secs = recovery_wait_secs
        self._local_init_run_options = local_init_run_options
        self._local_init_feed_dict = local_init_feed_dict
        self._target: Optional[str] = None

    # ------------------------------------------------------------------ TF's API
    def prepare_session(self, master: str, init_op: Any = None, saver: Any = None, checkpoint_dir: Optional[str] = None,
                        checkpoint_filename_with_path: Optional[str] = None, wait_for_checkpoint: bool = False,
                        max_wait_secs: float = 7200, config: Any = None, init_feed_dict: Any = None,
                        init_fn: Optional[Callable[[Any], None]] = None) -> Any:
        """A session restored from a checkpoint, else initialized (``init_op``, then ``init_fn``);
        ``local_init_op`` run; ``RuntimeError`` if the model is not ready after that."""
        sess, loaded = self._restore_checkpoint(master, saver, checkpoint_dir, checkpoint_filename_with_path,
                                                wait_for_checkpoint, max_wait_secs, config)
        if not loaded:
            initialize(sess, init_op, init_feed_dict, init_fn, self._local_init_op)
        finish_preparation(self, sess, init_op, init_fn)
        return sess

    def recover_session(self, master: str, saver: Any = None, checkpoint_dir: Optional[str] = None,
                        checkpoint_filename_with_path: Optional[str] = None, wait_for_checkpoint: bool = False,
                        max_wait_secs: float = 7200, config: Any = None) -> tuple[Any, bool]:
        """A session and True if it was restored and is ready; else the session (not initialized) and False."""
        sess, loaded = self._restore_checkpoint(master, saver, checkpoint_dir, checkpoint_filename_with_path,
                                                wait_for_checkpoint, max_wait_secs, config)
        local_ok, msg = self._try_run_local_init_op(sess)
        if not loaded:
            return sess, False
        if not local_ok:
            logger.info("Restoring model from %s did not make model ready for local init: %s",
                        checkpoint_dir or checkpoint_filename_with_path, msg)
            return sess, False
        is_ready, msg = self._model_ready(sess)
        if not is_ready:
            logger.info("Restoring model from %s did not make model ready: %s",
                        checkpoint_dir or checkpoint_filename_with_path, msg)
            return sess, False
        return sess, True

    def wait_for_session(self, master: str, config: Any = None, max_wait_secs: Optional[float] = float("inf"),
                         sleep: Callable[[float], None] = time.sleep,
                         clock: Optional[Callable[[], float]] = None) -> Any:
        """A session once the model is ready (another process initializes it), trying every
        ``recovery_wait_secs``; ``DeadlineExceededError`` after ``max_wait_secs`` on ``clock`` (not given: the
        process's watched clock, without the time it was stopped: the process that initializes the model was
        stopped with it in a suspended job)."""
        import tensorflow as tf

        self._target = master
        limit = float("inf") if max_wait_secs is None else max_wait_secs
        clock = process_clock() if clock is None else clock
        deadline = clock() + limit
        while True:
            sess = tf.compat.v1.Session(master, graph=self._graph, config=config)
            local_ok, local_msg = self._try_run_local_init_op(sess)
            msg = None
            if local_ok:
                is_ready, msg = self._model_ready(sess)
                if is_ready:
                    return sess
            try:
                sess.close()
            except Exception:  # (TF's _safe_close: a session that fails to close is dropped anyway)
                pass
            if deadline - clock() - self._recovery_wait_secs < 0:
                raise tf.errors.DeadlineExceededError(None, None,
                                                      "Session was not ready after waiting %d secs." % limit)
            logger.info("Waiting for model to be ready. Ready_for_local_init_op: %s, ready: %s", local_msg, msg)
            sleep(self._recovery_wait_secs)

    def _restore_checkpoint(self, master: str, saver: Any, checkpoint_dir: Optional[str],
                            checkpoint_filename_with_path: Optional[str], wait_for_checkpoint: bool,
                            max_wait_secs: float, config: Any) -> tuple[Any, bool]:
        import tensorflow as tf

        self._target = master
        sess = tf.compat.v1.Session(master, graph=self._graph, config=config)
        if checkpoint_dir and checkpoint_filename_with_path:
            raise ValueError("Can not provide both checkpoint_dir and checkpoint_filename_with_path.")
        if not saver or not (checkpoint_dir or checkpoint_filename_with_path):
            return sess, False
        if checkpoint_filename_with_path:
            saver.restore(sess, checkpoint_filename_with_path)
            return sess, True
        waited = 0.0
        state = tf.train.get_checkpoint_state(checkpoint_dir)
        while not state or not state.model_checkpoint_path:
            if not wait_for_checkpoint or waited >= max_wait_secs:
                return sess, False
            logger.info("Waiting for checkpoint to be available.")
            time.sleep(self._recovery_wait_secs)
            waited += self._recovery_wait_secs
            state = tf.train.get_checkpoint_state(checkpoint_dir)
        saver.restore(sess, state.model_checkpoint_path)
        saver.recover_last_checkpoints(state.all_model_checkpoint_paths)
        return sess, True

    def _model_ready(self, sess: Any) -> tuple[bool, Optional[str]]:
        return ready(self._ready_op, sess)

    def _model_ready_for_local_init(self, sess: Any) -> tuple[bool, Optional[str]]:
        return ready(self._ready_for_local_init_op, sess)

    def _try_run_local_init_op(self, sess: Any) -> tuple[bool, Optional[str]]:
        if self._local_init_op is None:
            return True, None
        ok, msg = self._model_ready_for_local_init(sess)
        if not ok:
            return False, msg
        sess.run(self._local_init_op, feed_dict=self._local_init_feed_dict, options=self._local_init_run_options)
        return True, None


def initialize(sess: Any, init_op: Any, init_feed_dict: Any, init_fn: Optional[Callable[[Any], None]],
               local_init_op: Any) -> None:
    """A fresh start, as TF: ``init_op`` with ``init_feed_dict``, then ``init_fn(sess)``;
    ``RuntimeError`` when there is nothing to initialize with."""
    if init_op is None and not init_fn and local_init_op is None:
        raise RuntimeError("Model is not initialized and no init_op or init_fn or local_init_op was given")
    if init_op is not None:
        sess.run(init_op, feed_dict=init_feed_dict)
    if init_fn:
        init_fn(sess)


def finish_preparation(manager: Any, sess: Any, init_op: Any, init_fn: Any) -> None:
    """After a restore or an initialization: ``manager``'s ``local_init_op`` and ready check
    (this module's SessionManager or TF's own), raising TF's ``RuntimeError``s."""
    local_ok, msg = manager._try_run_local_init_op(sess)
    if not local_ok:
        raise RuntimeError(f"Init operations did not make model ready for local_init.  Init op: "
                           f"{_name(init_op)}, init fn: {init_fn}, error: {msg}")
    is_ready, msg = manager._model_ready(sess)
    if not is_ready:
        raise RuntimeError(f"Init operations did not make model ready.  Init op: {_name(init_op)}, init fn: "
                           f"{init_fn}, local_init_op: {getattr(manager, '_local_init_op', None)}, error: {msg}")


def _name(op: Any) -> str:
    return str(getattr(op, "name", op))
