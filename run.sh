#!/usr/bin/env bash
# Set up everything bmoe-fleet needs (a virtualenv in .venv) and run one of:
#   ./run.sh demo   the main job on the embedded default (see README)
#   ./run.sh test   lint (ruff, mypy), then the whole test suite; extra arguments go to pytest
#   ./run.sh test --quick   lint, then the tests that need no root, phone, browser, bmoe-cli, qemu or quiet host
#   ./run.sh lint   ruff and mypy only
#   ./run.sh setup  the virtualenv only (with the tests' tools)
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
        # uv installs what pip would, several times as fast, and compiles the bytecode pip would
        # (docs/decisions/setup-installer.md): its cache (and its temporary files) stay in the
        # virtualenv, on its file system (the files are hard links to the cache's, so it costs
        # little room), and go with it. pip when uv cannot be had.
        local cache="$VENV/.uv-cache"
        mkdir -p "$cache/tmp"
        if ! { "$VENV/bin/pip" install --quiet --disable-pip-version-check "uv>=0.5" >/dev/null 2>&1 \
                && UV_CACHE_DIR="$cache" TMPDIR="$cache/tmp" "$VENV/bin/uv" pip install --quiet \
                    --link-mode=hardlink --compile-bytecode --python "$VENV/bin/python" -e ".$extras"; }; then
            echo "run.sh: uv could not install; pip instead" >&2
            "$VENV/bin/pip" install --quiet --disable-pip-version-check -e ".$extras"
        fi
        rm -rf "$cache/tmp"
        touch "$stamp"
    fi
}

# Each step runs even when one before it failed, so one run reports everything; the last line
# names the steps that failed. Exit status: pytest's own when it failed, else 1 when lint failed.
failed=()
lint() {    # arguments: a command to run them under (nice -n 19)
    echo "run.sh: ruff check ." >&2
    "$@" "$VENV/bin/ruff" check . || failed+=("ruff check")
    echo "run.sh: mypy" >&2
    "$@" "$VENV/bin/mypy" || failed+=(mypy)
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
        quick="" mode=test
        if [ "${2:-}" = --quick ]; then
            quick=" and not (root or phone or browser or bmoe_cli or qemu)" mode=quick
            set -- "$1" "${@:3}"
        fi
        setup "$mode"; shift
        timings=()
        if [ "$mode" = quick ]; then
            started=$SECONDS
            lint
            timings+=("lint $((SECONDS - started)) s")
        fi
        # What both parts read and build once (the results tests' campaigns: tests/conftest.py
        # built_once) goes to one folder for this run, removed afterwards, pass or fail.
        BMOE_TEST_SHARED="$(mktemp -d "${TMPDIR:-/tmp}/bmoe-test-shared.XXXXXX")"
        export BMOE_TEST_SHARED
        # pytest's own temporary folders (pytest-of-USER) and what the tests' programs leave in
        # $TMPDIR (adb.UID.log, the log of an adb server a test or the harness starts: GetLogFilePath
        # in AOSP's adb) go to a folder of this run as well, removed with it (a short name: the
        # phones' unix sockets live under it)
        suite_tmp="$(mktemp -d "${TMPDIR:-/tmp}/bmoe-t.XXXXXX")"
        # pytest in parts (docs/decisions/test-suite.md):
        # 1. the serial tests (marked serial: tests/conftest.py, they measure the host's memory, swap
        #    or speed) that read a campaign the later parts share (marked after_serial), alone at
        #    normal priority, so that it is built alone; lint beside them at nice 19;
        # 2. the other serial tests, and beside them at nice 19, on two workers, the tests that start
        #    no phone, make no cgroup and are not marked after_serial: the serial tests wait on
        #    phones and engines and leave most of a core idle, which the niced ones take and give
        #    back as soon as a serial test wants it;
        # 3. the after_serial tests that start no phone and make no cgroup (campaigns on this host
        #    whose rates their assertions rest on), on three workers, with no phone beside them; a
        #    campaign they share is built with none of them beside it (BMOE_TEST_BUILDS_ALONE:
        #    tests/conftest.py BuildsAlone);
        # 4. the phone and root tests on three workers (most wait on phones and adb: a third keeps
        #    both cores busy).
        # The serial parts collect only the modules SERIAL names (BMOE_TEST_SERIAL_ONLY: tests/conftest.py).
        # A part that selects nothing (exit 5: the arguments name tests of other parts only) is not
        # a failure. What runs niced writes to a log, printed when it ends; an interrupt reaches the
        # niced tests (their own process group: the terminal's Ctrl-C does not) and run.sh waits
        # for their teardown.
        status=0 ran=0 niced_pid="" niced_log="$suite_tmp/niced.log" lint_pid=""
        part_done() {    # $1 part, $2 its exit status, $3 its seconds
            timings+=("pytest '$1' $3 s")
            [ "$2" -eq 5 ] && return 0
            ran=1
            if [ "$2" -ne 0 ] && [ "$status" -eq 0 ]; then status=$2; failed+=(pytest); fi
        }
        stop_niced() {
            if [ -n "$lint_pid" ]; then kill "$lint_pid" 2>/dev/null || true; wait "$lint_pid" 2>/dev/null || true; fi
            if [ -n "$niced_pid" ] && kill -0 "$niced_pid" 2>/dev/null; then
                kill -INT -- "-$niced_pid" 2>/dev/null || kill -INT "$niced_pid" 2>/dev/null || true
                wait "$niced_pid" 2>/dev/null || true
                echo "run.sh: the niced part, stopped:" >&2
                tail -n 20 "$niced_log" >&2 || true
            fi
        }
        # a process that outlives its part by a moment (a pytest worker's exit, which writes in
        # pytest-of-USER) can refill a folder as rm empties it: a second try after it has gone
        remove_run_folders() {
            rm -rf "$BMOE_TEST_SHARED" "$suite_tmp" 2>/dev/null || { sleep 2; rm -rf "$BMOE_TEST_SHARED" "$suite_tmp"; }
        }
        trap 'stop_niced; remove_run_folders' EXIT
        trap 'exit 130' INT TERM
        # each part names its ten slowest tests (the suite's budget: docs/decisions/test-suite.md)
        part_options=(-q --durations=10)
        pytest_part() {    # $1 marker expression, then the workers; pytest's arguments follow "--"
            local expr="$1"; shift
            local workers=(); while [ "$1" != -- ]; do workers+=("$1"); shift; done; shift
            echo "run.sh: pytest -m '$expr' ${workers[*]}" >&2
            TMPDIR="$suite_tmp" "$VENV/bin/python" -m pytest "${part_options[@]}" -m "$expr" "${workers[@]}" "$@"
        }
        if [ "$mode" = quick ]; then
            code=0 started=$SECONDS
            pytest_part "not serial$quick" -n 3 -- "$@" || code=$?
            part_done "not serial" "$code" $((SECONDS - started))
        else
            lint_started=$SECONDS
            ( lint ionice -c 3 nice -n 19 >"$suite_tmp/lint.log" 2>&1; printf '%s\n' "${failed[@]}" >"$suite_tmp/lint.failed" ) &
            lint_pid=$!
            code=0 started=$SECONDS
            BMOE_TEST_SERIAL_ONLY=1 pytest_part "serial and after_serial" -- "$@" || code=$?
            part_done "serial and after_serial" "$code" $((SECONDS - started))
            wait "$lint_pid" || true
            lint_pid=""
            cat "$suite_tmp/lint.log" >&2
            while IFS= read -r step; do [ -n "$step" ] && failed+=("$step"); done <"$suite_tmp/lint.failed"
            timings=("lint (beside) $((SECONDS - lint_started)) s" "${timings[@]}")
            niced_expr="not serial and not (phone or root or after_serial)"
            niced_started=$SECONDS
            mkdir "$suite_tmp/niced"
            # a process group of its own, SIGINT at its default (a background job of a script starts
            # with it ignored), then pytest at nice 19 and in the idle I/O class (the block layer's
            # mq-deadline serves it after the others), its temporary folders apart from the others'
            ( TMPDIR="$suite_tmp/niced" exec ionice -c 3 nice -n 19 "$VENV/bin/python" -c \
                'import os, signal, sys; os.setpgid(0, 0); signal.signal(signal.SIGINT, signal.SIG_DFL); os.execv(sys.executable, [sys.executable, "-m", "pytest", *sys.argv[1:]])' \
                "${part_options[@]}" -m "$niced_expr" -n 2 "$@" >"$niced_log" 2>&1 ) &
            niced_pid=$!
            echo "run.sh: pytest -m '$niced_expr' -n 2, at nice 19 beside the serial part (its output when it ends)" >&2
            code=0 started=$SECONDS
            BMOE_TEST_SERIAL_ONLY=1 pytest_part "serial and not after_serial" -- "$@" || code=$?
            part_done "serial and not after_serial" "$code" $((SECONDS - started))
            rate_expr="not serial and after_serial and not (phone or root)"
            for expr in "$rate_expr" "not serial and (phone or root)"; do
                code=0 started=$SECONDS
                if [ "$expr" = "$rate_expr" ]; then
                    BMOE_TEST_BUILDS_ALONE="$BMOE_TEST_SHARED/builds-alone.lock" pytest_part "$expr" -n 3 -- "$@" || code=$?
                else
                    pytest_part "$expr" -n 3 -- "$@" || code=$?
                fi
                part_done "$expr" "$code" $((SECONDS - started))
            done
            code=0
            wait "$niced_pid" || code=$?
            niced_pid=""
            echo "run.sh: pytest -m '$niced_expr' -n 2 (at nice 19):" >&2
            cat "$niced_log"
            part_done "$niced_expr" "$code" $((SECONDS - niced_started))
        fi
        if [ "$ran" -eq 0 ]; then status=5; failed+=("pytest (no tests selected)"); fi
        echo "run.sh: time: $(IFS=,; echo "${timings[*]}" | sed 's/,/, /g') (total $SECONDS s)" >&2
        verdict "$status" ;;
    lint) setup test; lint; verdict ;;
    setup) setup test ;;
    *) echo "usage: ./run.sh demo|test [--quick]|lint|setup [args...]" >&2; exit 2 ;;
esac
