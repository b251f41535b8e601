"""adbutils, imported so that a malformed $ANDROID_ADB_SERVER_PORT cannot crash the import.

adbutils builds a default client when it is imported, reading ANDROID_ADB_SERVER_PORT with int():
`ANDROID_ADB_SERVER_PORT=abc bmoe-fleet devices` died in a ValueError traceback before
devices.adb.server could say which variable adb would refuse. The variable is hidden for the import
only; devices.adb.default_server() then reads it and refuses it in one line.
"""

from __future__ import annotations

import os
from types import ModuleType


def _import_adbutils() -> ModuleType:
    saved = os.environ.get("ANDROID_ADB_SERVER_PORT")
    try:
        int(saved or "0")
        hide = False
    except ValueError:
        hide = True
    if hide:
        del os.environ["ANDROID_ADB_SERVER_PORT"]
    try:
        import adbutils
    finally:
        if hide and saved is not None:
            os.environ["ANDROID_ADB_SERVER_PORT"] = saved
    return adbutils


adbutils = _import_adbutils()

from adbutils import AdbClient, AdbConnection, AdbDevice, AdbError, AdbTimeout  # noqa: E402  (after the guarded import)
from adbutils.errors import AdbConnectionError  # noqa: E402

__all__ = ["AdbClient", "AdbConnection", "AdbConnectionError", "AdbDevice", "AdbError", "AdbTimeout", "adbutils"]
