"""``_common.Bound`` hands Triton's C launch the tensors' addresses (integers it takes as
addresses without a driver query; ``test_launch_checks`` checks them), and the tensors
themselves to a launch hook that reads the arguments. CPU tensors, the launch recorded."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch_bridge.backends.triton import _common  # noqa: E402


def test_a_hook_reading_the_arguments_gets_the_tensors(monkeypatch):
    launched = []

    def go(gx, gy, gz, stream, args, enter, leave, wanted):
        launched.append((stream, list(args), wanted))

    monkeypatch.setattr(_common, "raw_launch", lambda compiled: go)
    monkeypatch.setattr(_common, "eager_stream", lambda tensors, device, pinned=None: 7)
    monkeypatch.setattr(_common, "launch_hooks", lambda: ("enter", None, True))
    a, b, c = (torch.zeros(8) for _ in range(3))
    bound = _common.Bound(object(), ("tail",), (2,), (a, 3, b, c), (0, 2, 3), checked=2)
    x, y, z = (torch.ones(8) for _ in range(3))
    assert bound((x, y, z))
    ((stream, args, wanted),) = launched
    assert stream == 7 and wanted
    assert args[0] is x and args[1] == 3 and args[2] is y and args[3] is z
    assert args[4:] == ["tail"]
