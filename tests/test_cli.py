"""``python -m perfutils``: its own commands and every study's command line behind one entry point."""

from __future__ import annotations

import importlib

import pytest

from perfutils import cli


@pytest.mark.parametrize("study", sorted(cli.STUDIES))
def test_every_study_has_a_main(study):
    assert callable(importlib.import_module(cli.STUDIES[study]).main)


def test_a_study_gets_the_arguments_after_its_name(capsys):
    assert cli.main(["vocab-sweep", "stages"]) == 0
    assert "public-4096-1" in capsys.readouterr().out


def test_help_names_the_studies(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    assert "vocab-sweep" in capsys.readouterr().out
