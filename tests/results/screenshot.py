"""The README's picture: a page of a built site, screenshotted in headless Chromium.

    .venv/bin/python -m tests.results.screenshot demo-out/site/devices/virtual-small-*.html docs/device-page.png

(after `./run.sh demo`: the small phone's page, which shows a fought budget).
"""

from __future__ import annotations

import sys
from pathlib import Path

from tests.results.conftest import Browser


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    page, out = Path(argv[0]).resolve(), Path(argv[1])
    if not page.is_file():
        print(f"screenshot: no such page {page}", file=sys.stderr)
        return 1
    browser = Browser()
    try:
        browser.attach()
        errors = browser.screenshot(page.as_uri(), out)
    finally:
        browser.close()
    if errors:
        print(f"screenshot: the page reported errors: {errors[:3]}", file=sys.stderr)
        return 1
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
