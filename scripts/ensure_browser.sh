#!/bin/sh
# Make sure Debian's chromium and chromium-driver are installed for the browser tests of
# the memory browser (tests/test_ui_browser.py). Installs them with apt-get when missing
# and we are root; in CI (CI=true) a browser that cannot be installed is an error, so the
# browser tests can never be skipped there. Nothing is downloaded from anywhere but apt.
set -u
have() { [ -x /usr/bin/chromedriver ] && { [ -x /usr/bin/chromium ] || [ -x /usr/bin/chromium-browser ]; }; }
# A CJK font, so the Chinese and Japanese screenshots are legible (optional).
have_cjk_font() { ! command -v fc-list >/dev/null 2>&1 || fc-list :lang=zh 2>/dev/null | grep -q .; }
if have && have_cjk_font; then exit 0; fi
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "ensure_browser: installing chromium, chromium-driver and a CJK font with apt-get" >&2
    apt-get update -q >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium chromium-driver >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q fonts-wqy-zenhei >/dev/null 2>&1 || echo "ensure_browser: no CJK font (screenshots only)" >&2
fi
if have; then exit 0; fi
if [ "${CI:-}" = "true" ]; then
    echo "ensure_browser: chromium/chromium-driver are missing and could not be installed (CI=true: the browser tests may not skip)" >&2
    exit 1
fi
echo "ensure_browser: chromium/chromium-driver not installed; the browser tests will be skipped (run as root, or: apt-get install chromium chromium-driver)" >&2
exit 0
