#!/bin/sh
# Make sure FUSE 2's library is installed for the power-loss test
# (tests/test_durability_powerloss.py mounts tests/support/powerfs.py with fusepy, which
# loads libfuse.so.2; Debian's fuse3 brings /dev/fuse handling and fusermount, not that
# library). Installs Debian's libfuse2 with apt-get when missing and we are root; in CI
# (CI=true) a missing library is an error, so the power-loss test can never be skipped
# there. Nothing is downloaded from anywhere but apt.
set -u
have() { /sbin/ldconfig -p 2>/dev/null | grep -q 'libfuse\.so\.2'; }
if have; then exit 0; fi
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "ensure_fuse: installing libfuse2 with apt-get" >&2
    apt-get update -q >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q libfuse2 fuse3 >/dev/null
fi
if have; then exit 0; fi
if [ "${CI:-}" = "true" ]; then
    echo "ensure_fuse: libfuse2 is missing and could not be installed (CI=true: the power-loss test may not skip)" >&2
    exit 1
fi
echo "ensure_fuse: libfuse2 not installed; the power-loss test will be skipped (run as root, or: apt-get install libfuse2)" >&2
exit 0
