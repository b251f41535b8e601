#!/usr/bin/env bash
# Set up everything bmoe-fleet needs (a virtualenv in .venv) and run one of:
#   ./run.sh demo   the main job on the embedded default (see README)
#   ./run.sh test   lint (ruff, mypy), then the whole test suite; extra arguments go to pytest
#   ./run.sh test --quick   lint, then the tests that need no root, phone, browser, bmoe-cli, qemu or quiet host
#   ./run.sh lint   ruff and mypy only
# Works on a fresh Debian machine with Python >= 3.11; as root it installs what is missing.
set -euo pipefail
cd "$(dirname "$0")"
PYTHON="${PYTHON:-python3}"
VENV="${VENV:-.venv}"

need_debian_packages() {
    local missing=()
    "$PYTHON" -c 'import venv, ensurepip' 2>/dev/null || missing+=(python3-venv)
    # The test suite opens the rendered site in a real headless browser.
    if [ "${1:-}" = test ] && ! command -v chromium >/dev/null; then missing+=(chromium); fi
    # A virtual phone's shell is mksh and its toolbox toybox, as on Android (the tests, and the
    # demo as root, start virtual phones).
    if [ "${1:-}" = test ] || [ "$(id -u)" = 0 ]; then
        for tool in mksh toybox; do command -v "$tool" >/dev/null || missing+=("$tool"); done
    fi
    # The other-apps allocator built for an arm64 phone is run under qemu's user emulation.
    if [ "${1:-}" = test ] && [ "$(uname -m)" != aarch64 ] && [ ! -e /usr/bin/qemu-aarch64-static ]; then
        missing+=(qemu-user-static)
    fi
    # bmoe-py's compiled kernels are built with the host's C compiler (without one it multiplies
    # in numpy, ~10x slower; the tests check the compiled path). `test --quick` needs no more.
    if [ "${1:-}" = test ] || [ "${1:-}" = quick ] || [ "$(id -u)" = 0 ]; then
        if ! command -v "${CC:-cc}" >/dev/null || [ ! -e /usr/include/stdlib.h ]; then missing+=(gcc libc6-dev); fi
    fi
    if [ ${#missing[@]} -gt 0 ]; then
        if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
            echo "run.sh: installing ${missing[*]}" >&2
            apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
        else
            echo "run.sh: please install: ${missing[*]}" >&2
            exit 1
        fi
    fi
}

setup() {
    "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
        || { echo "run.sh: Python >= 3.11 is required ($PYTHON is $("$PYTHON" -V 2>&1))" >&2; exit 1; }
    need_debian_packages "${1:-}"
    # the demo needs the package alone; the tests and lint add their tools (pyproject's `test` extra)
    local extras="" stamp="$VENV/.installed"
    if [ "${1:-}" != demo ]; then extras="[test]"; stamp="$VENV/.installed-test"; fi
    if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
        [ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
        "$VENV/bin/pip" install --quiet --disable-pip-version-check -e ".$extras"
        touch "$stamp"
    fi
}

# Each step runs even when one before it failed, so one run reports everything; the last line
# names the steps that failed. Exit status: pytest's own when it failed, else 1 when lint failed.
failed=()
lint() {
    echo "run.sh: ruff check ." >&2
    "$VENV/bin/ruff" check . || failed+=("ruff check")
    echo "run.sh: mypy" >&2
    "$VENV/bin/mypy" || failed+=(mypy)
}

verdict() {
    local pytest_status="${1:-0}"
    if [ ${#failed[@]} -gt 0 ]; then
        echo "run.sh: FAILED: ${failed[*]}" >&2
        [ "$pytest_status" -ne 0 ] && exit "$pytest_status"
        exit 1
    fi
    echo "run.sh: all steps passed" >&2
}

case "${1:-}" in
    demo) setup demo; shift; exec "$VENV/bin/bmoe-fleet" demo "$@" ;;
    test)
        # --quick: the tests marked none of serial, root, phone, browser, bmoe_cli, qemu
        # (pyproject.toml's markers, set in tests/conftest.py), which any user can run in about two
        # minutes; the serial part is left out with the rest (it wants a quiet host)
        quick="" mode=test parts=(serial "not serial")
        if [ "${2:-}" = --quick ]; then
            quick=" and not (root or phone or browser or bmoe_cli or qemu)" mode=quick parts=("not serial")
            set -- "$1" "${@:3}"
        fi
        setup "$mode"; shift
        started=$SECONDS
        lint
        timings=("lint $((SECONDS - started)) s")
        # What both parts read and build once (the results tests' campaigns: tests/conftest.py
        # built_once) goes to one folder for this run, removed afterwards, pass or fail.
        BMOE_TEST_SHARED="$(mktemp -d "${TMPDIR:-/tmp}/bmoe-test-shared.XXXXXX")"
        export BMOE_TEST_SHARED
        # pytest's own temporary folders (pytest-of-USER) and what the tests' programs leave in
        # $TMPDIR (adb.UID.log, the log of an adb server a test or the harness starts: GetLogFilePath
        # in AOSP's adb) go to a folder of this run as well, removed with it (a short name: the
        # phones' unix sockets live under it)
        suite_tmp="$(mktemp -d "${TMPDIR:-/tmp}/bmoe-t.XXXXXX")"
        trap 'rm -rf "$BMOE_TEST_SHARED" "$suite_tmp"' EXIT
        # two runs of pytest: first, alone, the tests that measure the host's memory, swap or speed
        # (marked serial: tests/conftest.py), then the rest on three workers (most of them wait on
        # phones and adb: a third keeps both cores busy). Serial first: what both
        # parts build once (a campaign whose runs sample the host's memory) is then built alone. A
        # run that selects nothing (exit 5: the arguments name tests of the other part only) is not
        # a failure.
        status=0 ran=0
        for part in "${parts[@]}"; do
            workers=(); [ "$part" = serial ] || workers=(-n 3)
            echo "run.sh: pytest -m '$part$quick' ${workers[*]}" >&2
            code=0 started=$SECONDS
            # each part names its ten slowest tests (the suite's budget: docs/decisions/test-suite.md)
            TMPDIR="$suite_tmp" "$VENV/bin/python" -m pytest -q --durations=10 -m "$part$quick" "${workers[@]}" "$@" || code=$?
            timings+=("pytest '$part' $((SECONDS - started)) s")
            if [ "$code" -eq 5 ]; then continue; fi
            ran=1
            if [ "$code" -ne 0 ] && [ "$status" -eq 0 ]; then status=$code; failed+=(pytest); fi
        done
        if [ "$ran" -eq 0 ]; then status=5; failed+=("pytest (no tests selected)"); fi
        echo "run.sh: time: $(IFS=,; echo "${timings[*]}" | sed 's/,/, /g') (total $SECONDS s)" >&2
        verdict "$status" ;;
    lint) setup test; lint; verdict ;;
    *) echo "usage: ./run.sh demo|test [--quick]|lint [args...]" >&2; exit 2 ;;
esac
