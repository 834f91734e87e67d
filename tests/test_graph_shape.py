"""procsv.trainer.checkpoint.graph_shape: a reused object-graph walk is only ever one of the same graph.

Real TensorFlow and Keras objects; each change a training program makes to its checkpoint's graph
after the first walk (an optimizer building its slots, a variable replaced, a layer added, a
TF1-style optimizer's slots) must read as a change, and an unchanged graph as the same.
"""

from __future__ import annotations

import pytest

from procsv.trainer.checkpoint import graph_shape


def _keras() -> tuple:
    import keras
    import tensorflow as tf

    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4)])
    opt = keras.optimizers.Adam(1e-3)
    return tf.train.Checkpoint(model=model, optimizer=opt, step=tf.Variable(0, dtype=tf.int64)), model, opt


def test_an_unchanged_graph_is_the_same_and_training_steps_do_not_change_it():
    import tensorflow as tf

    ckpt, model, opt = _keras()
    opt.build(model.trainable_variables)
    before = graph_shape.shape(ckpt)
    x = tf.ones((2, 8))
    for _ in range(3):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(model(x))
        opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
    assert graph_shape.same(before, graph_shape.shape(ckpt))


def test_an_optimizer_building_its_variables_changes_the_shape():
    ckpt, model, opt = _keras()
    before = graph_shape.shape(ckpt)
    opt.build(model.trainable_variables)
    assert not graph_shape.same(before, graph_shape.shape(ckpt))


def test_a_replaced_variable_or_an_added_object_changes_the_shape():
    import tensorflow as tf

    ckpt = tf.train.Checkpoint(w=tf.Variable(1.0), step=tf.Variable(0, dtype=tf.int64))
    before = graph_shape.shape(ckpt)
    ckpt.w = tf.Variable(1.0)  # same name, same value, another object
    assert not graph_shape.same(before, graph_shape.shape(ckpt))
    before = graph_shape.shape(ckpt)
    ckpt.extra = tf.Variable(2.0)
    assert not graph_shape.same(before, graph_shape.shape(ckpt))


def test_a_tf1_style_optimizers_new_slot_variables_change_the_shape():
    """Its slot variables are no edge of the graph: only their count tells them."""
    import tensorflow as tf

    w, w2 = tf.Variable([1.0, 2.0]), tf.Variable([3.0])
    opt = tf.compat.v1.train.AdamOptimizer(0.1)
    ckpt = tf.train.Checkpoint(w=w, w2=w2, optimizer=opt)
    opt.apply_gradients([(tf.constant([0.5, 0.5]), w)])  # the betas (edges) and w's m and v (slots)
    before = graph_shape.shape(ckpt)
    assert before is not None
    opt.apply_gradients([(tf.constant([0.5]), w2)])  # w2's m and v: slots only
    after = graph_shape.shape(ckpt)
    assert not graph_shape.same(before, after)
    opt.apply_gradients([(tf.constant([0.5, 0.5]), w)])
    assert graph_shape.same(after, graph_shape.shape(ckpt))


@pytest.mark.parametrize("a,b", [(None, None), (None, []), ([], None)])
def test_an_unknown_shape_is_never_the_same(a, b):
    assert not graph_shape.same(a, b)


def test_the_edges_are_the_ones_tensorflows_walk_lists():
    """The shape lists each object's children as ``ObjectGraphView.list_children`` does (it skips only
    that call's set-up of an object already set up): the same names to the same objects, in order."""
    import tensorflow as tf

    ckpt, model, opt = _keras()
    opt.build(model.trainable_variables)
    view = tf.__internal__.tracking.ObjectGraphView(ckpt)
    want, queue, seen, at = [], [ckpt], {id(ckpt)}, 0
    while at < len(queue):
        for ref in view.list_children(queue[at]):
            want.append((at, ref.name, ref.ref))
            if id(ref.ref) not in seen:
                seen.add(id(ref.ref))
                queue.append(ref.ref)
        at += 1
    got = graph_shape.shape(ckpt)
    assert got is not None and len(got) == len(want) > 10
    assert all(g[0] == w[0] and g[1] == w[1] and g[2] is w[2] for g, w in zip(got, want))



def test_an_object_whose_own_set_up_adds_an_edge_is_set_up_at_every_walk():
    """TensorFlow's walk calls every object's ``_maybe_initialize_trackable`` before listing its
    children; only Trackable's own one does nothing once an object is set up. A class may override
    it (here: it takes in a variable handed to it since, as a lazily built wrapper might) and list
    its children itself: TensorFlow's next walk has a new edge, so the shape must see it too, or a
    reused walk would leave the variable out of the next in-memory snapshot."""
    import tensorflow as tf

    class Lazy(tf.__internal__.tracking.Trackable):
        def __init__(self) -> None:
            self.pending: list = []
            self.taken: dict = {}

        def _maybe_initialize_trackable(self) -> None:
            super()._maybe_initialize_trackable()
            while self.pending:
                name, var = self.pending.pop(0)
                self.taken[name] = var

        def _trackable_children(self, save_type="checkpoint", **kwargs):
            return dict(self.taken)

    lazy = Lazy()
    lazy.pending.append(("a", tf.Variable(1.0)))
    ckpt = tf.train.Checkpoint(lazy=lazy)
    before = graph_shape.shape(ckpt)
    assert [e[1] for e in before] == ["lazy", "a"]
    lazy.pending.append(("b", tf.Variable(2.0)))
    after = graph_shape.shape(ckpt)
    view = tf.__internal__.tracking.ObjectGraphView(ckpt)
    assert [ref.name for ref in view.list_children(lazy)] == ["a", "b"]  # TensorFlow's walk
    assert [e[1] for e in after] == ["lazy", "a", "b"]
    assert not graph_shape.same(before, after)


def _changes() -> list:
    """(name, make -> (checkpoint, change)): each change a program makes to its graph after a walk."""
    import keras
    import tensorflow as tf

    def build():  # an optimizer building its slot variables
        ckpt, model, opt = _keras()
        return ckpt, lambda: opt.build(model.trainable_variables)

    def layer():  # a layer added to a built Keras 3 model
        ckpt, model, opt = _keras()
        opt.build(model.trainable_variables)
        return ckpt, lambda: model.add(keras.layers.Dense(2))

    def replace():  # a variable replaced under the same name
        ckpt = tf.train.Checkpoint(w=tf.Variable(1.0), step=tf.Variable(0, dtype=tf.int64))
        return ckpt, lambda: setattr(ckpt, "w", tf.Variable(1.0))

    def add():  # an object added
        ckpt = tf.train.Checkpoint(w=tf.Variable(1.0))
        return ckpt, lambda: setattr(ckpt, "extra", tf.Variable(2.0))

    def deep():  # a variable replaced deep in the graph (Trackable's list edited in place)
        outer, inner = tf.Module(), tf.Module()
        inner.v, inner.u = tf.Variable(1.0), tf.Variable(2.0)
        outer.inner = inner
        ckpt = tf.train.Checkpoint(outer=outer)
        return ckpt, lambda: setattr(inner, "v", tf.Variable(1.0))

    def tf1():  # a TF1-style optimizer's new slot variables (no edge: their count)
        w, w2 = tf.Variable([1.0, 2.0]), tf.Variable([3.0])
        opt = tf.compat.v1.train.AdamOptimizer(0.1)
        opt.apply_gradients([(tf.constant([0.5, 0.5]), w)])
        ckpt = tf.train.Checkpoint(w=w, w2=w2, optimizer=opt)
        return ckpt, lambda: opt.apply_gradients([(tf.constant([0.5]), w2)])

    def appended():  # a tracked list appended to (through its wrapper)
        ckpt = tf.train.Checkpoint(w=tf.Variable(1.0))
        ckpt.vs = [tf.Variable(2.0)]
        return ckpt, lambda: ckpt.vs.append(tf.Variable(3.0))

    def dict_set():  # a tracked dict given a new entry
        ckpt = tf.train.Checkpoint(w=tf.Variable(1.0))
        ckpt.vs = {"a": tf.Variable(2.0)}
        return ckpt, lambda: ckpt.vs.__setitem__("b", tf.Variable(3.0))

    def deleted():  # an attribute deleted (TensorFlow deletes its entry from the list in place)
        module = tf.Module()
        module.v, module.u = tf.Variable(1.0), tf.Variable(2.0)
        ckpt = tf.train.Checkpoint(m=module)
        return ckpt, lambda: delattr(module, "v")

    def reordered():  # deleted and set again: the same objects, in another order
        module = tf.Module()
        module.v, module.u = tf.Variable(1.0), tf.Variable(2.0)
        ckpt = tf.train.Checkpoint(m=module)

        def change() -> None:
            v = module.v
            del module.v
            module.v = v
        return ckpt, change

    def popped():  # a layer popped off a built Keras 3 model
        ckpt, model, opt = _keras()
        model.add(keras.layers.Dense(2))
        return ckpt, model.pop

    def scaled():  # a LossScaleOptimizer's first update (its inner optimizer's variables, built then)
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4)])
        opt = keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam(1e-3))
        ckpt = tf.train.Checkpoint(model=model, optimizer=opt)

        def change() -> None:
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(model(tf.ones((2, 8))))
            opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        return ckpt, change

    def delegated():  # a variable added behind TensorFlow's DelegatingTrackableMixin (listed again)
        from tensorflow.python.trackable import base_delegate

        class Delegate(base_delegate.DelegatingTrackableMixin, tf.__internal__.tracking.Trackable):
            pass

        inner = tf.Module()
        inner.v = tf.Variable(1.0)
        ckpt = tf.train.Checkpoint(d=Delegate(inner))
        return ckpt, lambda: setattr(inner, "u", tf.Variable(2.0))

    return [build, layer, replace, add, deep, tf1, appended, dict_set, deleted, reordered, popped, scaled, delegated]


@pytest.mark.parametrize("make", _changes(), ids=lambda f: f.__name__)
def test_each_change_is_told_by_the_walks_marks_as_by_a_new_shape(make):
    """:func:`graph_shape.unchanged` checks a reused walk without listing the edges again: it must
    tell every change a new shape tells, and an unchanged graph as unchanged."""
    ckpt, change = make()
    before, marks = graph_shape.walk(ckpt)
    assert before is not None and graph_shape.unchanged(marks)
    change()
    assert not graph_shape.same(before, graph_shape.shape(ckpt))
    assert not graph_shape.unchanged(marks)
    again, marks = graph_shape.walk(ckpt)
    assert graph_shape.unchanged(marks) and graph_shape.same(again, graph_shape.shape(ckpt))


@pytest.mark.parametrize("make", _changes(), ids=lambda f: f.__name__)
def test_a_snapshot_taken_after_each_change_holds_what_a_new_walk_holds(make):
    """The snapshot store's reuse check, end to end: the in-memory snapshot taken right after a change
    holds the keys, the object graph and the values a new walk of the graph reads, not the old walk's."""
    import numpy as np

    from procsv.trainer.checkpoint.snapshot import GRAPH_KEY, plan
    from procsv.trainer.checkpoint.snapshot_store import SnapshotStore

    ckpt, change = make()
    store = SnapshotStore(ckpt, 2, lambda: 0.0)
    try:
        store.take(1, 0)  # a walk
        change()
        reuse = store.plan_reusable(1.0, 10.0)
        assert not reuse
        snap = store.take(2, 1, fresh=not reuse)
        assert store.arena is not None
        walked = plan(ckpt)
        values = {key: np.asarray(read()) for key, read in walked.readers}
        assert sorted(spec.key for spec in snap.specs if spec.key != GRAPH_KEY) == sorted(values)
        framed = [spec for spec in snap.specs if spec.offset is None]
        assert bytes(snap.frames[framed.index(snap.specs[-1])]) == walked.graph
        for spec in snap.specs:
            if spec.offset is not None:
                want = values[spec.key]
                got = store.arena.array[spec.offset:spec.offset + want.nbytes].view(want.dtype).reshape(want.shape)
                assert np.array_equal(got, want), spec.key
    finally:
        store.close()


def test_a_list_changed_outside_its_wrapper_is_a_change_as_tensorflows_walk_refuses_it():
    import tensorflow as tf

    ckpt = tf.train.Checkpoint(w=tf.Variable(1.0))
    inner = [tf.Variable(2.0)]
    ckpt.vs = inner
    _, marks = graph_shape.walk(ckpt)
    inner.append(tf.Variable(3.0))  # the wrapped list itself: its wrapper never saw it
    assert not graph_shape.unchanged(marks)
    with pytest.raises(ValueError, match="modified outside the wrapper"):
        graph_shape.shape(ckpt)


def test_an_object_of_a_class_listing_its_own_children_is_listed_again_at_each_check():
    import tensorflow as tf

    class Own(tf.__internal__.tracking.Trackable):
        def __init__(self) -> None:
            self.vars = {"a": tf.Variable(1.0)}

        def _trackable_children(self, save_type="checkpoint", **kwargs):
            return dict(self.vars)

    own = Own()
    ckpt = tf.train.Checkpoint(own=own)
    _, marks = graph_shape.walk(ckpt)
    assert graph_shape.unchanged(marks)
    own.vars["b"] = tf.Variable(2.0)  # no tracking call: only listing the children again sees it
    assert not graph_shape.unchanged(marks)


def test_a_reuse_check_of_a_keras_graph_lists_no_children_and_a_training_step_changes_nothing(monkeypatch):
    """The check before each reuse of a walk listed every object's children through TensorFlow's
    Python (0.39 ms of each in-memory snapshot of the digits model, issue 54 point 5): where they are
    Trackable's own list (every Keras 3 and TensorFlow object here), it is compared by identity."""
    import tensorflow as tf

    from procsv.trainer.checkpoint.snapshot_store import SnapshotStore

    ckpt, model, opt = _keras()
    opt.build(model.trainable_variables)
    store = SnapshotStore(ckpt, 1, lambda: 0.0)
    store.take(1, 0)  # a walk
    assert store.plan is not None and store.plan.reusable
    listed = []
    real = tf.__internal__.tracking.Trackable._trackable_children

    def counting(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        listed.append(self)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(tf.__internal__.tracking.Trackable, "_trackable_children", counting)
    x = tf.ones((2, 8))
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(model(x))
    opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
    assert store.plan_reusable(1.0, 10.0)
    assert listed == []
    store.close()
