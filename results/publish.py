"""What a published file may say about where things lived: no host paths (docs/decisions/recommendations.md).

recommendations.json, the site's pages and its runs.csv travel: into an app, a pull request, a
web server. A host path in them says nothing to a reader elsewhere and tells everyone the layout
of the machine that made them (a home folder, a user name, a temp folder). `Redactor` replaces
them with names that mean something anywhere:

- a campaign directory -> `<campaign LABEL>`;
- this fleet's home (staged engines, virtual phones) -> `~/.bmoe-fleet`; the user's home -> `~`;
- a model file on this host -> its file name;
- on runs of this host (`local`), every absolute path in the command line -> its file name (the
  staged engine, the model, the CSV): a phone's paths (`/data/local/tmp/…`) are the phone's, and
  say where the model sat (O_DIRECT needs a real filesystem), so they stay.

It works on strings, so every published field goes through `text()`; `argv()` knows which argv
elements are paths.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from engine.fsutil import fleet_home
from engine.interface.flags import FLAGS, PATH

# flags whose value is a file on the device the engine ran on (every PATH flag of the table)
PATH_FLAGS = frozenset(s for f in FLAGS if f.value == PATH for s in f.spellings)
# a path Redactor.fingerprint_in can look for: one a JSON text spells as it is (printable ASCII, no
# quote or backslash) and that no text a run page redacts could make of two of the record's
# strings (their glue, results.site.page_views, always holds a space or a quote); four characters
# at least (its index's key)
_PLAIN_KEY = re.compile(r'/[!#-\[\]-~]{3,}')
_ASCII_ESCAPE = re.compile(r"\\u00[2-7][0-9A-Fa-f]")     # \u002f: a printable character JSON need not escape



class Redactor:
    """Replaces this host's paths in published text (see the module doc)."""

    def __init__(self, campaigns: Iterable[Any] = (), model_paths: Iterable[str] = ()):
        pairs: dict[str, str] = {}
        for camp in campaigns:
            pairs[str(Path(camp.root).resolve())] = f"<campaign {camp.label}>"
            for record in camp.models.values():
                for p in [record.get("path"), *(record.get("paths") or ())]:
                    if isinstance(p, str) and os.path.isabs(p) and not p.startswith("device:"):
                        pairs[p] = os.path.basename(p)
        for p in model_paths:
            if p and os.path.isabs(p):
                pairs[p] = os.path.basename(p)
        home = fleet_home()
        pairs[str(home)] = "~/.bmoe-fleet"
        with_resolved = dict(pairs)
        for prefix, name in pairs.items():      # /tmp may be a symlink: both spellings
            real = os.path.realpath(prefix)
            with_resolved.setdefault(real, name)
        user_home = str(Path.home())
        # longest first, so a campaign inside the home folder is named as a campaign
        self._pairs = sorted(((k, v) for k, v in with_resolved.items() if len(k) > 1), key=lambda kv: -len(kv[0]))
        self._home = user_home if len(user_home) > 1 else None
        pattern = "|".join(re.escape(k) for k, _ in self._pairs)
        self._re = re.compile(f"(?:{pattern})(?=/|\\b|$)") if pattern else None
        self._names = dict(self._pairs)
        self._all_have_slash = all("/" in k for k in [*self._names, *([self._home] if self._home else [])])
        # fingerprint_in's index: every path's lengths by its first four characters; None when a path
        # (or the home) is not one it can look for (_PLAIN_KEY)
        by_start: dict[str, set[int]] | None = {} if not self._home or _PLAIN_KEY.fullmatch(self._home) else None
        for k in self._names:
            if by_start is None or not _PLAIN_KEY.fullmatch(k):
                by_start = None
                continue
            by_start.setdefault(k[:4], set()).add(len(k))
        self._by_start = None if by_start is None else {start: sorted(ns) for start, ns in by_start.items()}

    def text(self, value: str) -> str:
        """A string with every known host path replaced."""
        if not value or (self._all_have_slash and "/" not in value):     # no path in it: nothing to replace
            return value
        out = self._re.sub(lambda m: self._names[m[0]], value) if self._re is not None else value
        if self._home and self._home in out:
            out = re.sub(re.escape(self._home) + r"(?=/|\b|$)", "~", out)
        return out

    def argv(self, argv: Sequence[str], local: bool) -> list[str]:
        """A command line fit to publish: on this host's runs, the engine and every path argument
        by file name; everywhere, known host paths replaced."""
        out = []
        for i, arg in enumerate(argv):
            arg = str(arg)
            if local and os.path.isabs(arg) and (i == 0 or argv[i - 1] in PATH_FLAGS):
                arg = os.path.basename(arg)
            out.append(self.text(arg))
        return out

    def fingerprint(self) -> str:
        """A digest of what this redactor replaces: equal digests redact every text alike
        (results.site.report keeps a run page whose inputs, this among them, did not change)."""
        return hashlib.sha256(repr((self._pairs, self._home)).encode()).hexdigest()

    def fingerprint_in(self, document: str) -> str:
        """A digest of what this redactor replaces in any string of `document`, a JSON text (a run's
        run.json): the pairs whose path occurs in it, and the user's home if it does. Two redactors
        with equal digests for a document redact each of its strings alike, whatever else they
        replace (results.site.page_views.run_page_inputs: a run page made for one set of campaigns
        serves another). A document whose escapes could hide a path (`\\/`, `\\u002f`), or a
        redactor with a path that JSON could spell otherwise, gives fingerprint() itself."""
        if self._by_start is None or "\\/" in document or _ASCII_ESCAPE.search(document):
            return self.fingerprint()
        found, at = set(), document.find("/")
        while at >= 0:
            for n in self._by_start.get(document[at:at + 4], ()):
                if document[at:at + n] in self._names:
                    found.add(document[at:at + n])
            at = document.find("/", at + 1)
        pairs = [(k, v) for k, v in self._pairs if k in found]      # in the order text() tries them
        home = self._home if self._home and (self._home in document or any(self._home in v for _, v in pairs)) \
            else None
        return hashlib.sha256(repr((pairs, home)).encode()).hexdigest()

    def value(self, value: Any) -> Any:
        """Any JSON-like value with every string in it redacted."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, Mapping):
            return {k: self.value(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self.value(v) for v in value]
        return value
