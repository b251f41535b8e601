"""results.publish.Redactor: host paths in published text become names, anything else stays as it is."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

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


def _camp(root: Path, label: str, model: str | None = None) -> SimpleNamespace:
    return SimpleNamespace(root=root, label=label, models={"m": {"path": model}} if model else {})


def test_a_documents_fingerprint_names_only_the_paths_in_it(tmp_path):
    a, b = _camp(tmp_path / "lab" / "a", "a", "/srv/m/a.gguf"), _camp(tmp_path / "lab" / "b", "b", "/srv/m/b.gguf")
    alone, both = Redactor([a]), Redactor([a, b])
    mine = json.dumps({"argv": ["bmoe-cli", "-m", "/srv/m/a.gguf"], "evidence": [f"read {a.root}/runs/c/1/run.json"]})
    # a run of campaign a: the same for a site of a alone and one of a and b (its page serves both) ...
    assert alone.fingerprint_in(mine) == both.fingerprint_in(mine) != both.fingerprint()
    # ... but not once it names b's folder or model: b's name would stand in it on the second site
    for theirs in (str(b.root), "/srv/m/b.gguf"):
        doc = json.dumps({"evidence": [f"{theirs}/x", "y"]})
        assert alone.fingerprint_in(doc) != both.fingerprint_in(doc)
        assert alone.text(f"{theirs}/x") != both.text(f"{theirs}/x")
    # escapes that could hide a path, and a path JSON could spell otherwise: the whole fingerprint
    for doc in ('{"e": "\\/srv\\/m\\/b.gguf"}', '{"e": "\\u002fsrv/m/b.gguf"}'):
        assert both.fingerprint_in(doc) == both.fingerprint()
    odd = Redactor([_camp(tmp_path / "my lab", "c")])
    assert odd.fingerprint_in(mine) == odd.fingerprint()
    # text without a path gains nothing from another campaign either
    assert Redactor([b]).fingerprint_in('{"a": 1}') == both.fingerprint_in('{"a": 1}')


_PARTS = ["/srv/m", "/srv/m/a.gguf", "/srv/mx", "/srv/m/a", "-x", "/", ".", " ", "a", "runs", "b.gguf", "é", "\\"]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(first=st.sets(st.sampled_from(range(6))), second=st.sets(st.sampled_from(range(6))),
       strings=st.lists(st.lists(st.sampled_from(_PARTS + ["<root>", "<other>"]), max_size=6), max_size=5))
def test_equal_fingerprints_for_a_document_redact_each_of_its_strings_alike(tmp_path, first, second, strings):
    roots = [tmp_path / "lab" / f"c{i}" for i in range(3)] + [tmp_path / "lab" / "c0" / "in", tmp_path / "lab2"]
    models = ["/srv/m", "/srv/m/a.gguf", "/srv/mx/b.gguf"]
    pool = [_camp(roots[i % 5], f"l{i}", models[i % 3]) for i in range(6)]
    one, two = Redactor([pool[i] for i in sorted(first)]), Redactor([pool[i] for i in sorted(second)])
    texts = ["".join(str(roots[0]) if p == "<root>" else str(roots[3]) if p == "<other>" else p for p in parts)
             for parts in strings]
    doc = json.dumps({"strings": texts}, ensure_ascii=False)
    if one.fingerprint_in(doc) == two.fingerprint_in(doc):
        assert [one.text(t) for t in texts] == [two.text(t) for t in texts]
