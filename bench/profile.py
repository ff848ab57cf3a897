"""Optional sampling profiles of the bridge during chosen cases (``bench/run.py --profile PREFIX``).

``py-spy record --format raw`` writes collapsed stacks (``frame;frame;frame count``) while the case
runs; ``top`` turns them into the functions with the most self and total samples. py-spy is not a
dependency of the bridge: install it with ``pip install py-spy`` (the ``bench`` extra).
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import signal
import sys
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

SAMPLE_RATE = 250  # samples per second


def py_spy() -> str | None:
    return shutil.which("py-spy") or (
        str(Path(sys.executable).with_name("py-spy")) if Path(sys.executable).with_name("py-spy").exists() else None
    )


@contextlib.asynccontextmanager
async def recording(pid: int, out: Path) -> AsyncIterator[None]:
    """Sample ``pid`` (idle frames excluded) into ``out`` while the body runs."""
    exe = py_spy()
    if exe is None:
        raise RuntimeError("py-spy is not installed (pip install py-spy)")
    proc = await asyncio.create_subprocess_exec(
        exe,
        "record",
        "--pid",
        str(pid),
        "--rate",
        str(SAMPLE_RATE),
        "--format",
        "raw",
        "--output",
        str(out),
        "--nonblocking",
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    await asyncio.sleep(0.3)  # py-spy attaches asynchronously; samples before that are lost anyway
    try:
        yield
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            await asyncio.wait_for(proc.wait(), 20)
        except TimeoutError:
            proc.kill()
            await proc.wait()


def top(collapsed: Path, limit: int = 25) -> str:
    """The ``limit`` functions with the most self samples, with their total (inclusive) share."""
    own: Counter[str] = Counter()
    total: Counter[str] = Counter()
    samples = 0
    for line in collapsed.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [_short(f) for f in stack.split(";")]
        samples += count
        own[frames[-1]] += count
        for frame in set(frames):
            total[frame] += count
    rows = [f"{'self%':>6} {'total%':>6}  function  ({samples} samples)"]
    for frame, count in own.most_common(limit):
        rows.append(f"{100 * count / samples:6.1f} {100 * total[frame] / samples:6.1f}  {frame}")
    return "\n".join(rows)


def _short(frame: str) -> str:
    # "func (path/to/module.py:123)" -> "func (module.py)": line numbers split one function's samples
    name, _, where = frame.partition(" (")
    return f"{name} ({Path(where.rstrip(')').rsplit(':', 1)[0]).name})" if where else name


if __name__ == "__main__":
    print(top(Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 25))
