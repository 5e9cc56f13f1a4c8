#!/usr/bin/env bash
# Does a package index's server answer? scripts/setup.sh asks before it tries PyTorch's CPU index,
# so that a machine that reaches only a registry mirror moves on at once instead of waiting out
# uv's and pip's failed attempts (7 s here).
#
#   bash scripts/index_answers.sh URL [SECONDS]
#
# Exit 0 when the server answers within SECONDS (default 5) with any HTTP status (whether it serves
# the package is the installer's to find out), or when URL is no web address (file://, a folder);
# exit 1 when it cannot be reached: no such host, no route, refused, timed out; exit 2, with one
# `error:` line, when the arguments are not a URL and a number of seconds. Proxies set in the
# environment are used, as the installers use them.
set -uo pipefail
exec python3 - "$@" <<'PY'
import math
import sys
import urllib.error
import urllib.request


def refuse(problem: str) -> None:
    print(f"error: scripts/index_answers.sh: {problem}", file=sys.stderr)
    sys.exit(2)


if not 2 <= len(sys.argv) <= 3 or not sys.argv[1]:
    refuse("give URL [SECONDS]")
url, given = sys.argv[1], sys.argv[2] if len(sys.argv) == 3 else "5"
try:
    seconds = float(given)
except ValueError:
    seconds = math.nan
if not 0 < seconds <= 3600:  # NaN too; no index needs an hour, and a huge number overflows the timeout
    refuse(f"SECONDS {given!r}: expected a number of seconds above 0, at most 3600")
if not url.startswith(("http://", "https://")):
    sys.exit(0)
try:
    urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=seconds).close()
except urllib.error.HTTPError:
    pass  # it answered, with a status of its own
except (OSError, ValueError):  # URLError (no such host, refused, no route), a timeout, a malformed URL
    sys.exit(1)
PY
