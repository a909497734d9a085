"""Row B1's request on several revisions of the service side by side, in one run: did a change
make it slower, or did the machine?

A single ``make bench`` run of B1 on a shared 2-core machine reads anywhere in ±25 % of its
median (the same commit gave 0.78 and 1.26 in two runs), so comparing the B1 of two runs made
at different times says little. This script checks each git revision out in a worktree of its
own (removed afterwards), starts one server per revision (``python -m service``, 1 worker, from
that worktree) and the working tree's own, then sends B1's request (/attention L=1024 d_model=64,
every output, safetensors both ways, curl) to each in turn, the order rotating from round to
round, with the in-process floor (the same NumPy computation plus ``safetensors.numpy.save``)
timed in each round too. Prints each side's median, quartiles and ratio to the floor's median.

    .venv/bin/python benchmarks/revisions.py 3dc943f 31fed38 [--rounds 21]
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for folder in (ROOT, ROOT / "benchmarks"):  # harness, and run.py beside this file
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))

from run import (  # noqa: E402
    SAFETENSORS,
    attention_body,
    curl_fetch,
    safetensors_floor,
    timed,
    write_binary_body,
)

from harness.live import start_server  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("revisions", nargs="+", help="git revisions to compare with the tree")
    parser.add_argument("--rounds", type=int, default=21)
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="revisions-"))
    roots = {"working tree": ROOT}
    servers: dict[str, tuple[subprocess.Popen[bytes], str]] = {}
    try:
        for rev in args.revisions:
            tree = work / rev.replace("/", "_")
            git = ["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(tree), rev]
            subprocess.run(git, check=True)
            roots[rev] = tree
        for name, root in roots.items():
            servers[name] = start_server(cwd=root)
        body = attention_body(1024)
        file = write_binary_body(body, work, "B1.safetensors")
        for _, base in servers.values():  # first calls (imports, caches) are not measured
            for _ in range(3):
                curl_fetch(base + "/attention", file, SAFETENSORS, os.devnull)
        seconds: dict[str, list[float]] = {name: [] for name in servers}
        floor: list[float] = []
        names = list(servers)
        for i in range(args.rounds):
            for name in names[i % len(names) :] + names[: i % len(names)]:
                url = servers[name][1] + "/attention"
                seconds[name].append(curl_fetch(url, file, SAFETENSORS, os.devnull)[0])
            floor.append(timed(lambda: safetensors_floor(body)))
        f = statistics.median(floor)
        print(f"B1's request, medians of {args.rounds} rotating rounds; floor {f * 1e3:.1f} ms")
        for name in names:
            m = statistics.median(seconds[name])
            q1, _, q3 = statistics.quantiles(seconds[name], n=4)
            print(f"{name:24s} {m * 1e3:6.1f} ms (quartiles {q1 * 1e3:.1f}–{q3 * 1e3:.1f}), "
                  f"÷ floor {m / f:.3f}")  # fmt: skip
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            proc.wait(timeout=30)
        for root in roots.values():
            if root != ROOT:
                remove = ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(root)]
                subprocess.run(remove, check=False)


if __name__ == "__main__":
    main()
