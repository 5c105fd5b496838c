"""The installed distribution declares the ``woa`` console script the README's commands use."""

from __future__ import annotations

from importlib.metadata import entry_points

from torch_bridge import cli


def test_woa_console_script_points_at_cli_main():
    (ep,) = entry_points(group="console_scripts", name="woa")
    assert ep.value == "torch_bridge.cli:main"
    assert ep.load() is cli.main
