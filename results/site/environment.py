"""The site's one jinja Environment (make_environment), and what makes a page besides its inputs
(code_fingerprint): the templates, their filters and this bmoe-fleet's code.

Autoescape is on: device strings are data and always render as text (figures travel as `tojson`
inside `<script type="application/json">`, which escapes `<`, `>`, `&` and `'`).
"""

from __future__ import annotations

import functools
import hashlib
from importlib import metadata, resources
from pathlib import Path
from typing import Any

import orjson
from jinja2 import Environment, FileSystemLoader, StrictUndefined

from results.site import kv_table
from results.site.site_format import fmt_mib, fmt_num


def templates_dir() -> Path:
    """The installed templates/ folder."""
    return Path(str(resources.files("templates")))


def make_environment() -> Environment:
    """The site's only jinja Environment: autoescaped, strict about missing fields; its filters and
    the key-value tables (results.site.kv_table) next."""
    # auto_reload off: a template is read once per build, not looked at again (its file stat'd) for every page
    env = Environment(loader=FileSystemLoader(str(templates_dir())), autoescape=True, undefined=StrictUndefined,
                      trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True, auto_reload=False)
    # tojson through orjson: the same JSON values, compact and in a tenth of json's time (a run
    # page's two charts cost 90 µs a page in json.dumps); keys sorted, as jinja's own default
    env.policies["json.dumps_function"] = _json_text
    env.filters["mib"] = fmt_mib
    env.filters["num"] = fmt_num
    env.globals["kv"] = kv_table.kv
    return env


def _json_text(value: Any, sort_keys: bool = False) -> str:
    """What the templates' `tojson` embeds: `value` as JSON text (jinja's htmlsafe_json_dumps then
    escapes <, >, & and ' in it); NaN and infinities are null."""
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS if sort_keys else 0).decode()


def render(env: Environment, template: str, page: Any) -> str:
    """One page: `template` with its context `page` (results.site.pages)."""
    return env.get_template(template).render(page=page)


@functools.cache
def code_fingerprint() -> str:
    """What makes the pages besides their inputs: this bmoe-fleet's version, the templates and the
    results package's code; a page made by another is made again."""
    digest = hashlib.sha256()
    try:
        digest.update(metadata.version("bmoe-fleet").encode())
    except metadata.PackageNotFoundError:
        digest.update(b"unknown")
    for base in (templates_dir(), Path(__file__).resolve().parents[1]):
        for path in sorted(base.rglob("*")):
            if path.suffix in (".py", ".html", ".css", ".js", ".json") and path.is_file():
                digest.update(str(path.relative_to(base)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()
