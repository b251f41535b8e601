"""bmoe-cli's releases, in order, as this project knows them from upstream's CHANGELOG.md and
cli/main.cpp (Helldez/BigMoeOnEdge).

A release is compared as (major, minor, patch). What a build *reports* can differ from what it is:
the build in ../shared/peer is the source at the 0.20.0 changelog entry (commit 2d4f2b1) and says
0.19.0, because CMake's project(VERSION) was not moved until 0.21.0 (`reported_as`). Upstream's
work after 0.24.0 has no release number yet; it is NEXT, named by the commit a table entry follows.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_VERSION = re.compile(r"^([0-9]+)\.([0-9]+)(?:\.([0-9]+))?$")


@dataclass(frozen=True, order=True)
class Release:
    major: int
    minor: int
    patch: int = 0

    @classmethod
    def parse(cls, text: str) -> Release:
        """`0.19.0` or `0.19` (what `--version`, a CSV's `# engine=` and the changelog write)."""
        m = _VERSION.match(text.strip().removeprefix("v"))
        if not m:
            raise ValueError(f"not a bmoe-cli release: {text!r} (e.g. 0.19.0)")
        return cls(int(m[1]), int(m[2]), int(m[3] or 0))

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}.{self.patch}"


V0_19, V0_20, V0_21, V0_22, V0_23, V0_24 = (Release(0, n) for n in range(19, 25))
NEXT = Release(0, 25)            # upstream after 0.24.0, not yet released
RELEASES = (V0_19, V0_20, V0_21, V0_22, V0_23, V0_24, NEXT)

# builds that report an older release than their source: what they say -> the newest they may be
REPORTED_AS = {V0_19: V0_20}


def reported_as(text: str) -> tuple[Release, Release]:
    """The range of releases a build that reports `text` may be: (oldest, newest)."""
    said = Release.parse(text)
    return said, REPORTED_AS.get(said, said)
