#!/bin/sh
# Make sure Debian's etcd-server and haproxy are installed for the cluster tests
# (tests/test_cluster_live.py), as ensure_browser.sh does for Chromium: installed with
# apt-get when missing and we are root; in CI (CI=true) a missing tool is an error, so the
# cluster tests can never be skipped there. Nothing is downloaded from anywhere but apt.
set -u
have() { [ -x /usr/bin/etcd ] && { [ -x /usr/sbin/haproxy ] || command -v haproxy >/dev/null 2>&1; }; }
if have; then exit 0; fi
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "ensure_cluster_tools: installing etcd-server and haproxy with apt-get" >&2
    apt-get update -q >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q etcd-server haproxy >/dev/null
fi
if have; then exit 0; fi
if [ "${CI:-}" = "true" ]; then
    echo "ensure_cluster_tools: etcd-server/haproxy are missing and could not be installed (CI=true: the cluster tests may not skip)" >&2
    exit 1
fi
echo "ensure_cluster_tools: etcd-server/haproxy not installed; the cluster tests will be skipped (run as root, or: apt-get install etcd-server haproxy)" >&2
exit 0
