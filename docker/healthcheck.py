"""Container health check (the image's HEALTHCHECK; docs/images.md).

The entrypoint writes what to probe to $SILOFL_HEALTH_FILE (default /tmp/silofl-health.json) when
it starts a SuperLink or a SuperNode: the URL of the process's HTTP ``/health`` endpoint (Flower
1.42 serves ``GET /health`` -> 200 on the SuperLink's one port, 8000 by default, and on the
SuperNode's local runtime API, 127.0.0.1:9094), the CA file when that API uses TLS, and the silo
service's socket when one runs next to the SuperNode. Exit 0: healthy (or nothing to probe: the
simulation role, or a command run as given); exit 1: unhealthy, with one line saying why.
Standard library only.
"""

from __future__ import annotations

import json
import os
import ssl
import stat
import sys
import urllib.request

TIMEOUT_S = 5.0


def main() -> int:
    path = os.environ.get("SILOFL_HEALTH_FILE", "/tmp/silofl-health.json")
    try:
        with open(path, encoding="utf-8") as fh:
            probe = json.load(fh)
    except FileNotFoundError:
        return 0  # no server role started by the entrypoint: nothing to probe
    except (OSError, ValueError) as err:
        print(f"unhealthy: cannot read {path}: {err}")
        return 1

    socket_path = probe.get("socket")
    if socket_path:
        try:
            if not stat.S_ISSOCK(os.stat(socket_path).st_mode):
                print(f"unhealthy: {socket_path} is not a socket")
                return 1
        except OSError as err:
            print(f"unhealthy: silo service socket {socket_path}: {err.strerror}")
            return 1

    url = probe["url"]
    context = None
    if url.startswith("https://"):
        # Verify against the federation's CA: the SuperLink's certificate must name 127.0.0.1
        # (its own SuperExec connects over loopback too; scripts/deploy/make_certs.py adds it).
        context = ssl.create_default_context(cafile=probe.get("cafile") or None)
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S, context=context) as response:  # noqa: S310
            if response.status != 200:
                print(f"unhealthy: {url} answered {response.status}")
                return 1
    except OSError as err:  # URLError, connection refused, TLS errors, timeouts
        print(f"unhealthy: {url}: {getattr(err, 'reason', err)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
