"""results.publish.Redactor: host paths in published text become names, anything else stays as it is."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from results.publish import Redactor


def test_host_paths_become_names_and_text_without_a_path_is_left_alone(tmp_path, monkeypatch):
    camp = tmp_path / "lab" / "camp"
    camp.mkdir(parents=True)
    model = "/srv/models/qwen3.gguf"
    r = Redactor([SimpleNamespace(root=camp, label="sweep", models={"q": {"path": model}})])
    assert r.text(f"read {camp}/runs/c-1/1/run.json and {model}") == "read <campaign sweep>/runs/c-1/1/run.json and qwen3.gguf"
    assert r.text(f"{Path.home()}/notes") == "~/notes"
    for plain in ("", "72", "0.75 MiB", "ok", "a\\b", "campaign sweep"):
        assert r.text(plain) == plain
    # a home named without a slash (HOME=home): text without one is still looked at
    monkeypatch.setenv("HOME", "home")
    assert Redactor().text("home sweet home") == "~ sweet ~"
