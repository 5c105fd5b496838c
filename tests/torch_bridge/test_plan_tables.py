"""The bounded tables of call plans when threads insert at once."""

from __future__ import annotations

import threading

import pytest

pytest.importorskip("torch")

from torch_bridge import ops  # noqa: E402


class _TakenMeanwhile(dict):
    """A full table whose oldest entry another thread removes while this one evicts it."""

    def __iter__(self):
        first = next(super().__iter__())
        del self[first]
        return iter([first])


def test_an_oldest_plan_taken_out_by_another_thread_only_skips_the_eviction():
    table = _TakenMeanwhile({("a",): 1, ("b",): 2})
    ops._remember(("c",), 3, table, limit=2)
    assert table == {("b",): 2, ("c",): 3}


def test_threads_filling_one_small_table_raise_nothing():
    table: dict = {}
    errors = []

    def fill(t: int) -> None:
        try:
            for i in range(3000):
                ops._remember((t, i), i, table, limit=8)
        except Exception as e:  # noqa: BLE001 - any failure fails the test
            errors.append(e)

    threads = [threading.Thread(target=fill, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(table) <= 8 + len(threads)
