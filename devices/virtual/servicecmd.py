"""`cmd SERVICE ARGS...` on a virtual phone, and `am` and `pm` over it, as Android's scripts are.

Android's `cmd` (frameworks/native/cmds/cmd) hands its arguments and its own stdin, stdout and
stderr to a system service over binder (IBinder::shellCommand) and exits with the service's result;
`am` is `cmd activity "$@"` (frameworks/base/cmds/am/am: `instrument` aside) and `pm` is
`cmd package "$@"` (cmds/pm/pm). Here the services are the phone daemon's ActivityManager
(devices/virtual/am.py), reached over the phone's /dev/socket/vphone_cmd, a SOCK_SEQPACKET socket
that stands in for binder: one message carries the arguments, the caller's folder and environment,
with its three descriptors (SCM_RIGHTS, as binder passes ParcelFileDescriptors); the answer is one
message of what to print and the status. The service knows the caller by its credentials
(SO_PEERCRED), never by what it says.

Runs on the phone as `python -I -S servicecmd.py ROOT ARGS...` from the `cmd` wrapper in
/system/bin (ROOT: the phone's `/` as this process sees it). The standard library only, and of it
what a call needs (json, socket). `scripts()` is the daemon's side: the wrappers it installs.
"""

from __future__ import annotations

import os
import sys

SOCKET = "dev/socket/vphone_cmd"      # under the phone's root
MAX_MESSAGE_BYTES = 1 << 20           # 1 MiB spelt out: this module imports only the standard library
NO_SERVICE_STATUS = 20                # cmd's exit status when it cannot reach a service


def main(argv: list[str]) -> int:
    import json
    import signal
    import socket

    signal.signal(signal.SIGINT, signal.SIG_DFL)   # Ctrl-C ends cmd (and so the call), no traceback
    if not argv:
        print("usage: servicecmd.py ROOT [SERVICE ARGS...]", file=sys.stderr)
        return 2
    root, args = argv[0], argv[1:]
    try:
        cwd = os.getcwd()
    except OSError:
        cwd = "/"
    request = json.dumps({"args": args, "cwd": cwd, "env": dict(os.environ)}).encode("utf-8", "surrogateescape")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    folder = os.open(os.path.join(root, os.path.dirname(SOCKET)), os.O_PATH | os.O_DIRECTORY)
    try:
        # through the folder's descriptor: a socket path holds 107 bytes, a phone's folder may not
        sock.connect(f"/proc/self/fd/{folder}/{os.path.basename(SOCKET)}")
        socket.send_fds(sock, [request], _stdio())
        reply = sock.recv(MAX_MESSAGE_BYTES)
    except OSError as e:
        print(f"cmd: Unable to get default service manager! ({e.strerror})", file=sys.stderr)
        return NO_SERVICE_STATUS
    finally:
        os.close(folder)
        sock.close()
    if not reply:
        print(f"cmd: Failure calling service {args[0] if args else ''}: Broken pipe (32)", file=sys.stderr)
        return NO_SERVICE_STATUS
    answer = json.loads(reply)
    for stream, text in ((sys.stdout, answer.get("out", "")), (sys.stderr, answer.get("err", ""))):
        if text:
            stream.write(text)
            stream.flush()
    return int(answer.get("status", 0)) & 0xFF


def _stdio() -> list[int]:
    """This process's stdin, stdout and stderr, /dev/null for any that is closed."""
    fds = []
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
            fds.append(fd)
        except OSError:
            fds.append(os.open(os.devnull, os.O_RDWR))
    return fds


def scripts(sh: str, lib: str, root: str, python: str) -> dict[str, str]:
    """The phone's `cmd`, `am` and `pm` (name -> script): `cmd` runs this module on `python`
    from `lib`; `am` and `pm` are Android's scripts over it."""
    import shlex

    code = f"import sys; sys.path.insert(0, {lib!r}); import servicecmd; sys.exit(servicecmd.main(sys.argv[1:]))"
    return {
        "cmd": f"#!{sh}\nexec {shlex.quote(python)} -I -S -c {shlex.quote(code)} {shlex.quote(root)} \"$@\"\n",
        "am": (f"#!{sh}\n"
               "if [ \"$1\" != \"instrument\" ] ; then\n"
               "    cmd activity \"$@\"\n"
               "else\n"
               "    echo 'am instrument: a virtual phone runs no instrumentation' >&2\n"
               "    exit 1\n"
               "fi\n"),
        "pm": f"#!{sh}\ncmd package \"$@\"\n",
    }


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
