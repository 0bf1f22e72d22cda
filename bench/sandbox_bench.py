"""Benchmark the Docker sandboxes: warm pooled runs vs cold containers, throughput, HumanEval.

    .venv/bin/python bench/sandbox_bench.py [--pool-size 4] [--n 300] [--no-humaneval]

Needs a running Docker daemon and the image from `agentgym sandbox build`.
"""

import argparse
import sys

from agentgym.sandboxes._bench import run_bench
from agentgym.sandboxes._config import DEFAULT_IMAGE


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image", default=DEFAULT_IMAGE)
    parser.add_argument("--pool-size", type=int, default=4)
    parser.add_argument("--n", type=int, default=300, help="warm runs to time")
    parser.add_argument("--cold-n", type=int, default=10, help="cold containers to time")
    parser.add_argument("--seconds", type=float, default=3.0, help="throughput window")
    parser.add_argument("--no-humaneval", action="store_true")
    args = parser.parse_args()
    result = run_bench(image=args.image, pool_size=args.pool_size, n=args.n,
                       cold_n=args.cold_n, seconds=args.seconds,
                       humaneval=not args.no_humaneval,
                       log=lambda msg: print(f"# {msg}", file=sys.stderr))
    for line in result.lines():
        print(line)


if __name__ == "__main__":
    main()
