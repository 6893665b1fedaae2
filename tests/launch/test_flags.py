"""The pipeline parameters as flags (`launch.flags`)."""

from __future__ import annotations

import pytest


def test_every_parameters_help_prints(capsys: pytest.CaptureFixture[str]) -> None:
    """argparse formats help with %: a parameter's help holding a % (gate_rule's "95%") must
    print as written, not crash `make run ARGS=--help`."""
    from launch import flags as module
    from pipeline import PARAMETERS

    module.build_parser(PARAMETERS).print_help()
    assert "the paired 95% interval" in " ".join(capsys.readouterr().out.split())
