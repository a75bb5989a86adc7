#!/usr/bin/env bash
# examples/c/run.sh: the C API end to end.
#
# Builds libdoorbell and the daemon (release), compiles examples/c/submit.c with the system C
# compiler against crates/capi/include/doorbell.h twice — linked with the shared library, and
# with the static library under AddressSanitizer (with LeakSanitizer) — starts
# `doorbell serve` with a short engine idle period, runs the program against it, then the
# AddressSanitizer build, then (where Valgrind is installed) the shared build under Valgrind's
# memcheck, stops the daemon with SIGTERM, and exits non-zero if anything failed.
#
# Needs: a Rust toolchain, a C compiler (`cc`: gcc or clang) with AddressSanitizer's runtime
# (Debian/Ubuntu: apt-get install gcc, which brings libasan), and optionally valgrind
# (apt-get install valgrind). Run from anywhere: bash examples/c/run.sh
#
# DOORBELL_C_BUILD_ARGS: what to build (default `-p doorbell-c -p doorbell`). CI, which has
# just run `cargo build --release --workspace --all-targets`, passes those arguments instead:
# building a subset resolves some dependencies' features differently (dev-dependencies add
# some), which would rebuild the stack and relink both artifacts with fat LTO for nothing.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

say() { printf '== c-api: %s\n' "$*"; }
die() {
    printf '== c-api: FAILED: %s\n' "$*" >&2
    exit 1
}

if ! command -v cc >/dev/null 2>&1; then
    die "no C compiler (cc) on PATH: install one (Debian/Ubuntu: apt-get install gcc)"
fi
have_valgrind=1
if ! command -v valgrind >/dev/null 2>&1; then
    have_valgrind=0
    say "valgrind not found: its run will be skipped (Debian/Ubuntu: apt-get install valgrind)"
fi

target="${CARGO_TARGET_DIR:-target}"
lib="$(cd "$target" 2>/dev/null && pwd || echo "$PWD/$target")/release"
include="crates/capi/include"

read -r -a build_args <<<"${DOORBELL_C_BUILD_ARGS:--p doorbell-c -p doorbell}"
say "building libdoorbell and the daemon: cargo build --release ${build_args[*]}"
cargo build --release "${build_args[@]}"
for f in "$lib/libdoorbell.so" "$lib/libdoorbell.a" "$lib/doorbell"; do
    [ -e "$f" ] || die "cargo build did not produce $f"
done

tmp="$(mktemp -d "${TMPDIR:-/tmp}/doorbell-c.XXXXXX")"
daemon_pid=""
cleanup() {
    if [ -n "$daemon_pid" ] && kill -0 "$daemon_pid" 2>/dev/null; then
        kill -TERM "$daemon_pid" 2>/dev/null || true
        wait "$daemon_pid" 2>/dev/null || true
    fi
    rm -rf "$tmp"
}
trap cleanup EXIT

# What a program linking a Rust static library must link besides it: the standard library's
# native dependencies, as rustc reports them for this target.
native_libs="$(echo '' | rustc --crate-type staticlib --print native-static-libs -o "$tmp/empty.a" - 2>&1 |
    sed -n 's/.*native-static-libs: //p')"
[ -n "$native_libs" ] || die "rustc did not report the standard library's native libraries"

cflags=(-std=c11 -g -O1 -Wall -Wextra -Werror -I "$include")
say "compiling submit.c against libdoorbell.so: cc ${cflags[*]} examples/c/submit.c -L$lib -ldoorbell"
cc "${cflags[@]}" examples/c/submit.c -L "$lib" -ldoorbell -Wl,-rpath,"$lib" -o "$tmp/submit"
say "compiling submit.c against libdoorbell.a with AddressSanitizer (-fsanitize=address; $native_libs)"
# shellcheck disable=SC2086 # the native libraries are separate words
cc "${cflags[@]}" -fsanitize=address -fno-omit-frame-pointer examples/c/submit.c "$lib/libdoorbell.a" \
    $native_libs -o "$tmp/submit-asan"

# A short idle period: the engine enters F1 and its doorbells disconnect 5 ms after its last
# work, so the program sees DISCONNECTED_RETRY at once.
cat >"$tmp/d.toml" <<'EOF'
idle_period_ms = 5
EOF
socket="$tmp/s"
say "starting the daemon: $lib/doorbell serve --socket $socket --config $tmp/d.toml"
"$lib/doorbell" serve --socket "$socket" --config "$tmp/d.toml" >"$tmp/daemon.log" 2>&1 &
daemon_pid=$!
for _ in $(seq 1 1000); do
    [ -S "$socket" ] && break
    kill -0 "$daemon_pid" 2>/dev/null || {
        cat "$tmp/daemon.log" >&2
        die "the daemon exited before listening"
    }
    sleep 0.01
done
[ -S "$socket" ] || die "the daemon did not listen on $socket within 10 s"

failed=()
run() {
    local name="$1"
    shift
    say "running $name"
    if "$@"; then
        say "$name: passed"
    else
        say "$name: FAILED (exit status $?)"
        failed+=("$name")
    fi
}

run "submit (libdoorbell.so)" "$tmp/submit" "$socket"
# halt_on_error: the first error ends the run with a report; detect_leaks: LeakSanitizer at
# exit (every handle is destroyed, so every allocation the library made must be freed).
run "submit under AddressSanitizer (libdoorbell.a)" \
    env ASAN_OPTIONS=detect_leaks=1:halt_on_error=1:abort_on_error=0 "$tmp/submit-asan" "$socket"
if [ "$have_valgrind" = 1 ]; then
    # Every leak kind is an error; valgrind.supp holds the one allocation of the standard
    # library that memcheck cannot see is still referenced, with why.
    run "submit under valgrind memcheck (libdoorbell.so)" \
        valgrind --quiet --error-exitcode=1 --leak-check=full --errors-for-leak-kinds=definite,indirect,possible \
        --suppressions=examples/c/valgrind.supp "$tmp/submit" "$socket"
fi

say "stopping the daemon (SIGTERM)"
kill -TERM "$daemon_pid"
if wait "$daemon_pid"; then
    say "the daemon stopped cleanly"
else
    say "the daemon exited with status $?; its log:"
    cat "$tmp/daemon.log" >&2
    failed+=("daemon stop")
fi
daemon_pid=""
[ ! -e "$socket" ] || failed+=("daemon left its socket behind")

if [ ${#failed[@]} -gt 0 ]; then
    die "${failed[*]}"
fi
say "ok: every run passed"
