"""How the cooperative split_row grid is sized (CPU: the kernel's occupancy is faked).

Triton compiles one kernel per class of ``n_slots`` (== 1, a multiple of 16, anything else); each
candidate grid must be checked against the occupancy of the kernel that will really be launched.
"""

import pytest

from kernels import split_row
from kernels.launch import Launch


def fake_resident(by_class):
    def resident(launch):
        n = launch.args["n_slots"]
        return by_class["one" if n == 1 else "div16" if n % 16 == 0 else "other"]

    return resident


def coop_launch():
    return Launch("split_row.cooperative", None, (1,), {"n_slots": 1}, {}, num_warps=4)


@pytest.mark.parametrize(
    "by_class, n_rows, chunks, expected",
    [
        ({"one": 40, "div16": 528, "other": 792}, 4096, 32, (24, 792)),  # as many rows as the kernel allows
        ({"one": 40, "div16": 396, "other": 396}, 4096, 32, (12, 396)),
        ({"one": 40, "div16": 528, "other": 528}, 5, 32, (5, 528)),  # fewer rows than fit
        ({"one": 40, "div16": 528, "other": 528}, 4096, 32, (16, 528)),  # 16 rows: the multiple-of-16 kernel fits
        ({"one": 40, "div16": 500, "other": 1024}, 4096, 32, (31, 1024)),  # it does not: one row fewer
        ({"one": 40, "div16": 50, "other": 50}, 4096, 32, (1, 40)),  # one row: sized with the == 1 kernel
        ({"one": 20, "div16": 10, "other": 10}, 4096, 32, (0, 10)),  # not one row fits: no cooperative grid
    ],
)
def test_cooperative_slots_uses_the_launched_kernels_occupancy(monkeypatch, by_class, n_rows, chunks, expected):
    monkeypatch.setattr(split_row, "max_resident_programs", fake_resident(by_class))
    launch = coop_launch()
    slots, fit = split_row.cooperative_slots(launch, n_rows, chunks)
    assert (slots, fit) == expected
    assert slots * chunks <= fit
    if slots:
        assert launch.args["n_slots"] == slots
