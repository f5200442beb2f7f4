"""Summarise a py-spy profile of collapsed stacks (``--profile x.txt`` of any script).

Prints, for the event loop's thread and for the other threads, the functions holding
the most samples: inclusive (the function or anything it called was on the CPU) and self.
Usage: ``python3 bench/stacks.py PROFILE.txt [--top N] [--under FUNCTION]``.
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

# "func (path/to/file.py:123)" -> "func (path/to/file.py)": lines split one function.
_LINE = re.compile(r":\d+\)$")
# Every other thread starts here; the main thread (the event loop's) does not.
OTHER_THREAD = "Thread._bootstrap"


def stacks(path: Path) -> Iterator[tuple[list[str], int]]:
    for line in path.read_text().splitlines():
        frames, _, count = line.rpartition(" ")
        if frames and count.isdigit():
            yield [_LINE.sub(")", frame) for frame in frames.split(";")], int(count)


def tally(path: Path, *, loop: bool, under: str | None) -> tuple[int, Counter[str], Counter[str]]:
    total, inclusive, own = 0, Counter[str](), Counter[str]()
    for frames, count in stacks(path):
        if frames[0].startswith(OTHER_THREAD) == loop:
            continue
        if under is not None:
            found = [i for i, frame in enumerate(frames) if frame.startswith(under)]
            if not found:
                continue
            frames = frames[found[0] :]
        total += count
        for frame in set(frames):
            inclusive[frame] += count
        own[frames[-1]] += count
    return total, inclusive, own


def show(title: str, total: int, counts: Counter[str], top: int) -> None:
    print(f"\n{title} ({total} samples)")
    for frame, count in counts.most_common(top):
        print(f"  {100 * count / max(total, 1):5.1f}%  {frame}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("profile", type=Path)
    parser.add_argument("--top", type=int, default=20)
    parser.add_argument("--under", help="only stacks through this function (name prefix)")
    args = parser.parse_args()
    for loop in (True, False):
        where = "event loop thread" if loop else "other threads (pool, events, to_thread)"
        # py-spy counts a pool thread parked on its queue (a futex wait) as busy in _worker.
        total, inclusive, own = tally(args.profile, loop=loop, under=args.under)
        show(f"{where}: inclusive", total, inclusive, args.top)
        show(f"{where}: self", total, own, args.top // 2)


if __name__ == "__main__":
    main()
