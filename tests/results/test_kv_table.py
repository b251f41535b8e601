"""The site's key-value tables (results.site.kv_table): every key, value and caption escaped as
jinja's autoescape escapes `{{ x }}` in the site's own Environment, whatever the text holds (a NUL
included, which the table's one-escape path joins on)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from markupsafe import Markup

from results.site.environment import make_environment
from results.site.kv_table import kv

ENV = make_environment()
CELL = ENV.from_string("{{ x }}")

texts = st.text(alphabet=st.sampled_from(list("ab <>&\"'\0é—1")), max_size=8)
cells = st.one_of(texts, st.integers(), st.floats(allow_nan=True), st.none(), st.booleans(),
                  texts.map(lambda t: Markup("<b>") + t))


def _autoescaped(x) -> str:
    return CELL.render(x=x)


@settings(max_examples=300, deadline=None)
@given(rows=st.lists(st.tuples(cells, cells), max_size=6), caption=st.sampled_from(["", "c<&>", "configuration"]))
def test_each_cell_is_what_autoescape_makes_of_it(rows, caption):
    html = kv(rows, caption)
    head = '<table class="kv">\n' + (f"<caption>{_autoescaped(caption)}</caption>" if caption else "")
    body = "".join(f'<tr><th scope="row">{_autoescaped(k)}</th><td>{_autoescaped(v)}</td></tr>\n' for k, v in rows)
    assert html == head + (body or "<tr><td>none recorded</td></tr>") + "</table>"
    assert isinstance(html, Markup)


def test_a_template_calls_it_and_markup_in_a_cell_never_escapes_its_neighbours():
    page = ENV.from_string('{{ kv(page, "x") }}').render(page=[("<script>", "a\0<b>"), ("k", Markup("<i>ok</i>"))])
    assert page == ('<table class="kv">\n<caption>x</caption><tr><th scope="row">&lt;script&gt;</th>'
                    '<td>a\0&lt;b&gt;</td></tr>\n<tr><th scope="row">k</th><td><i>ok</i></td></tr>\n</table>')


def test_a_row_that_is_not_a_pair_is_refused():
    with pytest.raises(ValueError, match="pairs"):
        kv([("a", "b", "c"), ("d",)])


json_values = st.recursive(st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1)
                           | st.floats(allow_nan=False, allow_infinity=False) | texts,
                           lambda inner: st.lists(inner, max_size=4) | st.dictionaries(texts, inner, max_size=4),
                           max_leaves=20)


@settings(max_examples=300, deadline=None)
@given(value=json_values)
def test_tojson_gives_the_value_back_sorted_and_safe_inside_a_script_tag(value):
    """The site's `tojson` (orjson, results.site.environment._json_text): the same JSON value back, each
    object's keys sorted (jinja's default), and no character that ends a script tag or a quoted
    attribute."""
    text = ENV.from_string("{{ x|tojson }}").render(x=value)
    orders: list[list[str]] = []
    assert json.loads(text, object_pairs_hook=lambda pairs: orders.append([k for k, _ in pairs]) or dict(pairs)) == value
    assert all(keys == sorted(keys) for keys in orders)
    assert not set("<>&'") & set(text)
