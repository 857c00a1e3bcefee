"""`radixserve bench stacks FILE`: where a sampled process's threads spent their time.

FILE is what `py-spy record --threads -f raw` writes: one line per distinct stack, its frames
from the thread's root to the running function joined by ';', a space, and how many samples
ended in it:

    thread (1445): engine-loop;_run (scheduler/loop.py:150);...;upload_columns (upload.py:71) 12

A sampler that reads the process from outside (py-spy's --nonblocking) does not slow it, unlike
cProfile inside it, so the served engine thread's shares are the ones it has unobserved
(docs/benchmarks.md, "GPU, twenty-ninth round"). The tables: samples per thread, then for the
chosen thread the functions by their own samples (the frame that was running; native code called
from Python counts for the Python function) and by their inclusive samples (anywhere on the
stack), each as a share of the thread's samples. --under keeps only the stacks that pass through
a function (e.g. `_iterate`, the serving loop's iterations: not start-up, not warm-up); --lines
counts each line of a function apart.
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

# "name (path/to/file.py:123)": the function, its file's last two parts and the line
_FRAME = re.compile(r"^(?P<name>.*?) \((?P<path>[^()]*?)(?P<line>:\d+)?\)$")


def frame_name(frame: str, lines: bool = False) -> str:
    """The function of a raw frame and its file; with `lines`, its line too (without, one
    function's lines add up)."""
    m = _FRAME.match(frame)
    if m is None:
        return frame
    line = (m["line"] or "") if lines else ""
    return f"{m['name']} ({'/'.join(m['path'].split('/')[-2:])}{line})"


@dataclass
class Stacks:
    threads: Counter[str] = field(default_factory=Counter)  # samples per thread
    own: Counter[str] = field(default_factory=Counter)  # the chosen thread's running functions
    inclusive: Counter[str] = field(default_factory=Counter)  # ... anywhere on its stacks
    samples: int = 0  # the chosen thread's samples that passed --under


def read(lines: list[str], thread: str | None = None, under: str | None = None,
         by_line: bool = False) -> Stacks:
    """Count `lines` (py-spy raw). `thread`: a substring of the thread frame whose functions are
    counted (None: every thread); `under`: a substring of a function some frame must have;
    `by_line`: a function's lines counted apart."""
    out = Stacks()
    for line in lines:
        stack, _, count = line.rstrip("\n").rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        head, *frames = stack.split(";")
        out.threads[head] += n
        if thread is not None and thread not in head:
            continue
        names = [frame_name(f, by_line) for f in frames]
        if under is not None and not any(under in name for name in names):
            continue
        out.samples += n
        if names:
            out.own[names[-1]] += n
        for name in set(names):
            out.inclusive[name] += n
    return out


def format_report(s: Stacks, top: int) -> str:
    rows = ["| thread | samples |", "|---|---:|",
            *(f"| {name} | {n} |" for name, n in s.threads.most_common())]
    for title, counts in (("own", s.own), ("inclusive", s.inclusive)):
        rows += ["", f"| function ({title}) | samples | share |", "|---|---:|---:|",
                 *(f"| {name} | {n} | {100 * n / max(s.samples, 1):.1f} % |"
                   for name, n in counts.most_common(top))]
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="radixserve bench stacks", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("file", type=Path, help="py-spy record --threads -f raw output")
    p.add_argument("--thread", help="count the functions of threads whose frame has this text "
                                    "(e.g. engine-loop); default: every thread")
    p.add_argument("--under", help="only stacks through a function whose name has this text")
    p.add_argument("--top", type=int, default=30, help="functions shown per table")
    p.add_argument("--lines", action="store_true",
                   help="count each line of a function apart (which call in it is dear)")
    args = p.parse_args(argv)
    stacks = read(args.file.read_text().splitlines(), args.thread, args.under, args.lines)
    print(format_report(stacks, args.top))
    return 0 if stacks.samples else 1


if __name__ == "__main__":
    raise SystemExit(main())
