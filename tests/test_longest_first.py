"""The suite's xdist order (tests/longest_first.py): pure, no process started."""

from __future__ import annotations

import random

import longest_first
from longest_first import LONG, order, slice_sizes


def _ids() -> tuple[list[str], dict[str, float]]:
    """Six modules of ten tests; some tests long (seeded)."""
    rng = random.Random(7)
    ids = [f"tests/test_{m}.py::test_{t}" for m in "abcdef" for t in range(10)]
    durations = {nid: round(rng.choice([0.1, 0.5, 1.0, 3.0, 12.0, 70.0]), 1) for nid in ids}
    return ids, durations


def test_slices_are_sized_as_worksteal_sends_them_and_sum_to_the_whole() -> None:
    for total in (5, 60, 2318):
        for workers in (2, 3, 4):
            sizes = slice_sizes(total, workers)
            assert sum(sizes) == total and max(sizes) - min(sizes) <= 1, (total, workers, sizes)
            assert sizes[0] == total // workers  # the first idle worker gets len(pending) // nodes


def test_every_test_is_kept_once_and_each_slice_leads_with_its_modules_long_tests_in_file_order() -> None:
    ids, durations = _ids()
    for workers in (2, 3, 4):
        out = order(ids, ids, workers, durations)
        assert sorted(out) == sorted(ids)
        start = 0
        for size in slice_sizes(len(ids), workers):
            part = out[start:start + size]
            start += size
            long_ = [nid for nid in part if durations[nid] >= LONG]
            assert part[:len(long_)] == long_, part  # the long tests first
            for module in {nid.split("::")[0] for nid in long_}:  # a module's long tests: one block, file order
                mine = [nid for nid in long_ if nid.startswith(module + "::")]
                at = long_.index(mine[0])
                assert long_[at:at + len(mine)] == mine
                assert mine == sorted(mine, key=ids.index)
            short = part[len(long_):]
            assert short == sorted(short, key=ids.index)  # the rest in file order


def test_the_long_time_is_dealt_within_one_module_block_of_even() -> None:
    ids, durations = _ids()
    blocks: dict[str, float] = {}
    for nid in ids:
        if durations[nid] >= LONG:
            blocks[nid.split("::")[0]] = blocks.get(nid.split("::")[0], 0.0) + durations[nid]
    for workers in (2, 3):
        out = order(ids, ids, workers, durations)
        loads, start = [], 0
        for size in slice_sizes(len(ids), workers):
            loads.append(sum(durations[nid] for nid in out[start:start + size] if durations[nid] >= LONG))
            start += size
        assert max(loads) - min(loads) <= max(blocks.values()), loads  # LPT: apart by at most one block


def test_no_durations_or_one_worker_keeps_the_collected_order() -> None:
    ids, durations = _ids()
    assert order(ids, ids, 1, durations) == ids
    assert order(ids, ids, 3, {}) == ids


def test_the_checked_in_durations_name_tests_as_node_ids_with_seconds() -> None:
    durations = longest_first.load()
    assert durations, "tests/durations.json is missing or empty: scripts/suite_cpu.py --durations writes it"
    assert all("::" in nid and nid.startswith("tests/test_") and seconds >= 1 for nid, seconds in durations.items())
