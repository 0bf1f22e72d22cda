"""How `make test`'s two xdist workers shared the suite, from the log of a run with ``-v
--durations=0``: each worker's busy time, the vLLM engine group's total, and the critical path.

The worker of each test comes from its ``[gwN] ... PASSED`` line, its time from the durations
table (setup + call + teardown, so a module fixture counts where it ran). When each line starts
with the seconds since the run began (as ``... | python3 -u stamp.py`` writes), the time each
worker went idle is printed as well: busy time alone hides the gaps between tests.

    .venv/bin/python -m pytest -n 2 --dist loadgroup --no-loadscope-reorder -v --durations=0 \
        > test.log 2>&1; python3 bench/test_split.py test.log
"""

from __future__ import annotations

import argparse
import re
from collections import defaultdict
from pathlib import Path

ENGINE_GROUP = "vllm-engines"  # tests/conftest.py's
RESULT = re.compile(r"^\s*(?:(\d+\.\d+) )?\[(gw\d+)\] \[\s*\d+%\] [A-Z]+ (\S+)")
DURATION = re.compile(r"^\s*(?:\d+\.\d+ )?(\d+\.\d+)s (?:setup|call|teardown)\s+(\S+)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("log", type=Path, help="output of pytest -n 2 -v --durations=0")
    parser.add_argument("--top", type=int, default=10, help="slowest modules to list")
    args = parser.parse_args()
    log = args.log.read_text(errors="replace").splitlines()
    worker: dict[str, str] = {}
    last_seen: dict[str, float] = {}
    for line in log:
        if match := RESULT.match(line):
            stamp, gw, nodeid = match.groups()
            worker[nodeid] = gw
            if stamp:
                last_seen[gw] = float(stamp)
    seconds: dict[str, float] = defaultdict(float)
    for line in log:
        if match := DURATION.match(line):
            seconds[match[2]] += float(match[1])
    if not worker or not seconds:
        raise SystemExit(f"{args.log} lacks '[gwN] PASSED' lines or the durations table: "
                         "run pytest with -n 2 -v --durations=0 (and without -q)")  # fmt: skip
    busy: dict[str, float] = defaultdict(float)
    group_total: dict[str, float] = defaultdict(float)
    module_total: dict[tuple[str, str], float] = defaultdict(float)
    for nodeid, spent in seconds.items():
        test, _, group = nodeid.partition("@")
        engine = group == ENGINE_GROUP
        busy[worker.get(nodeid, "?")] += spent
        group_total[ENGINE_GROUP if engine else "rest"] += spent
        module_total[(test.split("::")[0], "engine" if engine else "")] += spent
    for gw in sorted(busy):
        idle = f", idle from {last_seen[gw]:.0f} s" if gw in last_seen else ""
        print(f"{gw}: busy {busy[gw]:7.0f} s{idle}")
    engine, rest = group_total[ENGINE_GROUP], group_total["rest"]
    print(f"engine group {engine:.0f} s, the rest {rest:.0f} s, both {engine + rest:.0f} s")
    bound = max(engine, (engine + rest) / 2)
    print(f"critical path >= {bound:.0f} s ({'engine group' if engine > rest else 'even split'})"
          f"; slowest worker {max(busy.values()):.0f} s")  # fmt: skip
    slowest = sorted(module_total.items(), key=lambda m: -m[1])[: args.top]
    for (module, mark), spent in slowest:
        print(f"{spent:7.0f} s  {module} {mark}")


if __name__ == "__main__":
    main()
