"""Opening and removing files *beneath* a folder without following a symbolic link anywhere on
the way: every component is opened relative to its parent's descriptor with ``O_NOFOLLOW``, so a
link planted (or swapped in) inside a working directory can never lead outside it. Used for
inline attachments (``orchestrator.attachments``) and artifacts (``orchestrator.artifacts``).

All blocking: run them in a worker thread.

Must not import: ``bridge`` (except ``bridge.rpc``).
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
from collections.abc import Iterator, Sequence

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW


@contextlib.contextmanager
def folder_beneath(root: str, parts: Sequence[str], *, create: bool = False) -> Iterator[int]:
    """A descriptor of ``root/parts…`` (each part one name), opened without following a link;
    with ``create``, missing folders are made (mode 0700). Closed on exit.

    Raises:
        OSError: a component is a link (``ELOOP``) or not a folder (``ENOTDIR``), or is missing.
    """
    fds = [os.open(root, os.O_RDONLY | os.O_DIRECTORY)]
    try:
        for part in parts:
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o700, dir_fd=fds[-1])
            fds.append(os.open(part, _DIR_FLAGS, dir_fd=fds[-1]))
        yield fds[-1]
    finally:
        for fd in fds:
            os.close(fd)


def read_beneath(root: str, relative: str, limit: int) -> bytes | None:
    """At most ``limit + 1`` bytes of the regular file ``root/relative`` ("/"-separated), or None
    when it is gone, a link (anywhere on the way), or not a regular file (a FIFO is opened
    non-blocking and refused, so it cannot hang the reader)."""
    *parents, name = relative.split("/")
    try:
        with folder_beneath(root, parents) as parent:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=parent)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as file:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return file.read(limit + 1)


def remove_beneath(root: str, parts: Sequence[str]) -> bool:
    """Remove the folder ``root/parts…`` and what it holds, never through a link: the path to it
    is opened component by component, and ``shutil.rmtree`` works from its parent's descriptor
    (it refuses a link and does not follow links inside). Then the parents, up to ``root``, are
    removed while empty. Returns whether it was removed (False: gone, or a link on the way)."""
    *parents, name = parts
    try:
        with folder_beneath(root, parents) as parent:
            shutil.rmtree(name, dir_fd=parent)
    except FileNotFoundError:
        return False
    except OSError as exc:
        # ELOOP/ENOTDIR: a link on the way; errno None: rmtree refused a link at ``name`` itself
        if exc.errno not in (errno.ELOOP, errno.ENOTDIR, None):
            raise
        return False
    for depth in range(len(parents), 0, -1):  # .xworkmate/attachments, then .xworkmate, once empty
        try:
            with folder_beneath(root, parents[: depth - 1]) as fd:
                os.rmdir(parents[depth - 1], dir_fd=fd)
        except OSError:
            break
    return True
