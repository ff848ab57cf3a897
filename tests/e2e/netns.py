"""Run the end-to-end tests inside a loopback-only network namespace.

Inside ``unshare -n`` a process sees one interface, ``lo`` (down until someone brings it up), and no
route anywhere else: every DNS lookup or connection to a non-loopback address fails at once with
ENETUNREACH. The fake model server and the agents all live in the namespace, talk over 127.0.0.1, and
any phone-home attempt an agent makes fails instead of leaving the machine. This proves the offline
recipes in tests/e2e/agents.py really are offline.

Requirements: ``unshare`` (Debian package ``util-linux``, always present) and either root (``unshare -n``)
or unprivileged user namespaces (``unshare -rn``, which maps the caller to root inside). ``ip`` comes
from Debian package ``iproute2``; without it, this module brings ``lo`` up itself with one ioctl.

Makefile usage (``$$`` is make's escape for ``$``)::

    # with iproute2
    e2e-offline:
        unshare -n sh -c 'ip link set lo up && exec "$$@"' sh .venv/bin/pytest tests/e2e -q -m e2e

    # without iproute2 / as a non-root user (picks -n or -rn, brings lo up via ioctl)
    e2e-offline:
        .venv/bin/python tests/e2e/netns.py -- .venv/bin/pytest tests/e2e -q -m e2e

Check what this machine supports: ``.venv/bin/python tests/e2e/netns.py --check`` (prints JSON, exit 0 if
a loopback-only namespace works here).

Library use: ``status()`` → :class:`NetnsStatus`; ``wrap(argv)`` → the argv that runs ``argv`` inside a
fresh namespace; ``is_loopback_only()`` tells whether the current process already runs in one.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

SHELL_SNIPPET = "unshare -n sh -c 'ip link set lo up && exec \"$@\"' sh"
MAKE_SNIPPET = "unshare -n sh -c 'ip link set lo up && exec \"$$@\"' sh .venv/bin/pytest tests/e2e -q -m e2e"
PY_SNIPPET = ".venv/bin/python tests/e2e/netns.py -- .venv/bin/pytest tests/e2e -q -m e2e"

_SIOCGIFFLAGS = 0x8913
_SIOCSIFFLAGS = 0x8914
_IFF_UP = 0x1


def interfaces() -> list[str]:
    """Interfaces of *this process's* network namespace (not /sys/class/net, which shows the
    namespace that mounted sysfs)."""
    try:
        return sorted(name for _, name in socket.if_nameindex())
    except OSError:
        return []


def is_loopback_only() -> bool:
    """True when this process runs in a network namespace whose only interface is ``lo``."""
    return interfaces() == ["lo"]


def lo_up() -> None:
    """Bring ``lo`` up (what ``ip link set lo up`` does), with the SIOCSIFFLAGS ioctl."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        req = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(s.fileno(), _SIOCGIFFLAGS, req))[1]
        if not flags & _IFF_UP:
            fcntl.ioctl(s.fileno(), _SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | _IFF_UP))


def loopback_works() -> bool:
    """A TCP round trip over 127.0.0.1."""
    try:
        with socket.socket() as srv:
            srv.bind(("127.0.0.1", 0))
            srv.listen(1)
            with socket.create_connection(srv.getsockname(), timeout=2):
                conn, _ = srv.accept()
                conn.close()
        return True
    except OSError:
        return False


def external_blocked() -> bool:
    """True when a connection to a non-loopback address fails immediately (no route)."""
    try:
        with socket.create_connection(("192.0.2.1", 80), timeout=2):  # TEST-NET-1, never routable
            return False
    except OSError as exc:
        return exc.errno in (101, 99, 113)  # ENETUNREACH, EADDRNOTAVAIL, EHOSTUNREACH


def _unshare_args() -> list[str] | None:
    """``unshare -n`` as root, ``unshare -rn`` (user + net namespace) otherwise; None if missing."""
    exe = shutil.which("unshare")
    if exe is None:
        return None
    return [exe, "-n"] if os.geteuid() == 0 else [exe, "-r", "-n"]


def wrap(argv: Sequence[str], prefer_ip: bool = True) -> list[str]:
    """The argv that runs ``argv`` inside a fresh loopback-only namespace with ``lo`` up."""
    base = _unshare_args()
    if base is None:
        raise RuntimeError("unshare not found (Debian package util-linux)")
    if prefer_ip and shutil.which("ip"):
        return [*base, "sh", "-c", 'ip link set lo up && exec "$@"', "sh", *argv]
    return [*base, sys.executable, str(Path(__file__).resolve()), "--inside", "--", *argv]


@dataclass
class NetnsStatus:
    ok: bool  # a loopback-only namespace works here and blocks outside traffic
    unshare: str | None
    ip: str | None  # None → install Debian package iproute2, or rely on the ioctl fallback
    euid: int
    mode: str  # "unshare -n" | "unshare -rn" | ""
    inside: dict | None  # what the self-test saw inside the namespace
    reason: str = ""

    def as_dict(self) -> dict:
        return asdict(self)


def status(timeout: float = 20.0) -> NetnsStatus:
    """Spawn a namespace, run the self-test in it, and report."""
    base = _unshare_args()
    st = NetnsStatus(
        ok=False,
        unshare=shutil.which("unshare"),
        ip=shutil.which("ip"),
        euid=os.geteuid(),
        mode=" ".join(["unshare", *base[1:]]) if base else "",
        inside=None,
    )
    if base is None:
        st.reason = "unshare not found (Debian package util-linux)"
        return st
    cmd = [*base, sys.executable, str(Path(__file__).resolve()), "--self-test"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        st.reason = f"{' '.join(cmd[:3])} failed: {exc!r}"
        return st
    if proc.returncode != 0 and not proc.stdout.strip():
        st.reason = f"unshare failed (rc={proc.returncode}): {proc.stderr.strip()[-500:]}"
        return st
    try:
        st.inside = json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        st.reason = f"self-test printed no JSON: {proc.stdout[-300:]!r} {proc.stderr[-300:]!r}"
        return st
    inside = st.inside
    st.ok = bool(inside.get("loopback_only") and inside.get("loopback_works") and inside.get("external_blocked"))
    if not st.ok:
        st.reason = "self-test inside the namespace failed"
    return st


def _self_test() -> int:
    err = None
    try:
        lo_up()
    except OSError as exc:
        err = repr(exc)
    print(
        json.dumps(
            {
                "interfaces": interfaces(),
                "loopback_only": is_loopback_only(),
                "lo_up_error": err,
                "loopback_works": loopback_works(),
                "external_blocked": external_blocked(),
            }
        )
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--self-test"]:
        return _self_test()
    if args[:1] == ["--check"]:
        st = status()
        print(json.dumps(st.as_dict(), indent=2))
        return 0 if st.ok else 1
    inside = False
    if args[:1] == ["--inside"]:
        inside = True
        args = args[1:]
    if args[:1] == ["--"]:
        args = args[1:]
    if not args:
        print(__doc__, file=sys.stderr)
        return 2
    if inside or is_loopback_only():
        lo_up()
        os.execvp(args[0], args)
    cmd = wrap(args)
    os.execvp(cmd[0], cmd)
    return 127  # not reached


if __name__ == "__main__":
    sys.exit(main())
