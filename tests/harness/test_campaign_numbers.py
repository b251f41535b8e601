"""Numbers inside a campaign's strings and the command line's flags (docs/decisions/ascii-numbers.md):
an app size, a release claim, a flag's value are ASCII decimal and bounded, and anything else is
one `Error:` line naming the key (or the option), never a traceback, under `run --dry-run` too."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

NINES = "9" * 400


def _campaign(tmp_path: Path, model: Path, axes: str = "", run: str = "", engine: str = "") -> Path:
    path = tmp_path / "c.toml"
    path.write_text(f'version = 1\nname = "n"\n[fleet]\ndevices = ["R58XYZ"]\n[models]\nm = "{model}"\n'
                    f'[engine]\n{engine}\n[axes]\ncache_mb = [0]\n{axes}\n[run]\nn_predict = 4\n{run}\n')
    return path


def _refused(cli, path: Path, tmp_path: Path, key: str, why: str) -> None:
    for args in (["run", str(path), "--dry-run"], ["run", str(path), "-o", str(tmp_path / "out")]):
        result = CliRunner().invoke(cli, args, catch_exceptions=False)
        assert result.exit_code == 1, result.output
        assert result.output.startswith("Error: ") and result.output.count("\n") == 1, result.output
        assert f"{key}: " in result.output and why in result.output, result.output
        assert len(result.output) < 600
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("axes", "run", "key", "why"), [
    (f'apps = ["cached:{NINES}MiB"]', "", "axes.apps[0]", "no phone holds it"),
    (f'apps = ["none", "cached:1MiB+visible:{NINES}"]', "", "axes.apps[1]", "no phone holds it"),
    ("", f'turns = 2\nidle_s = 1.0\ngap_apps = "cached:{NINES}MiB"', "run.gap_apps", "no phone holds it"),
    ("", f'turns = 2\nidle_s = 1.0\ngap_apps = "cached:{"1" * 5000}G"', "run.gap_apps", "no phone holds it"),
    ('apps = ["cached:32MiB+"]', "", "axes.apps[0]", "an empty item"),
    ('apps = ["a++b"]', "", "axes.apps[0]", "an empty item"),
    ("", 'turns = 2\nidle_s = 1.0\ngap_apps = "+cached:1MiB"', "run.gap_apps", "an empty item"),
    ('apps = ["cached:１２MiB"]', "", "axes.apps[0]", "bad app size"),
    ('apps = ["cached:1_000MiB"]', "", "axes.apps[0]", "bad app size"),
])
def test_an_app_size_no_phone_holds_or_an_empty_app_is_one_line_naming_the_key(tmp_path, tiny_model, cli,
                                                                                 axes, run, key, why):
    _refused(cli, _campaign(tmp_path, tiny_model, axes=axes, run=run), tmp_path, key, why)
