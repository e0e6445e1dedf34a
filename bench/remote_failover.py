"""Remote-client fault latency: how long a failover and a refused connection take, over repeated runs,
as ratios to what the client is configured to wait (the timings tests/remote used to bound at 2.5 s
and 10 s; the tests now check only that failover happens and the error is raised).

    .venv/bin/python bench/remote_failover.py [--runs 20] [--timeout-s 0.5] [--retries 3] [--backoff-s 0.05]

In-process `serve-target` servers over a fake engine (tests/remote/fake_fleet.py, the client tests'
own; no model load), on 127.0.0.1:

- failover: a RemoteEngine over a server that never answers in time and a fast one; the request that
  meets the stuck server first waits ``--timeout-s``, marks it down and is answered by the fast one.
  Ratio: its latency / timeout_s (1.0 = no cost beyond the timeout), next to a plain request's latency.
- refused: a RemoteEngine pointed at a port nobody listens on, ``--retries`` retries with backoff
  ``--backoff-s`` doubling (capped at the client's max_backoff_s): the time until its RemoteError.
  Ratio: that time / the configured backoff sleeps (1.0 = nothing but the backoff).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests"), str(ROOT / "tests" / "remote")]


def failover_once(fleet_urls: list, stuck_index: int, timeout_s: float) -> tuple[float, float]:
    """(latency of the request that failed over, latency of a plain one) on a fresh client; the server
    at ``stuck_index`` never answers in time."""
    from draftsmith.remote.client import RemoteEngine
    from fake_fleet import batch

    failed_over = plain = None
    with RemoteEngine("bench", urls=fleet_urls, prefetch_depth=0, timeout_s=timeout_s, backoff_s=0.01) as eng:
        eng.set_vocab_map(None)
        for k in range(4):  # round robin: one of the first two meets the stuck server
            stuck = eng.servers[stuck_index]
            before = stuck.last_error
            t0 = time.perf_counter()
            eng.supervise("eagle3", batch(k), [1])
            dt = time.perf_counter() - t0
            if stuck.last_error != before and "timed out" in stuck.last_error:  # met it first, moved on
                failed_over = dt
            elif plain is None:
                plain = dt
            if failed_over is not None and plain is not None:
                break
    if failed_over is None:
        raise SystemExit("no request met the stuck server; the round robin changed?")
    return failed_over, plain


def refused_once(retries: int, backoff_s: float) -> float:
    """Seconds until a client pointed at a closed port gives up."""
    from draftsmith.remote.client import RemoteEngine, RemoteError

    t0 = time.perf_counter()
    try:
        RemoteEngine("bench", urls=["http://127.0.0.1:9"], retries=retries, backoff_s=backoff_s)  # port 9: closed
    except RemoteError:
        return time.perf_counter() - t0
    raise SystemExit("a client pointed at port 9 did not raise RemoteError")


def backoff_total(retries: int, backoff_s: float, max_backoff_s: float = 10.0) -> float:
    """The sleeps RemoteEngine makes before giving up when no server is healthy (see _with_failover)."""
    return sum(min(backoff_s * 2 ** i, max_backoff_s) for i in range(retries))


def row(name: str, xs: list, ref: float, ref_name: str) -> str:
    med = statistics.median(xs)
    return (f"{name:<36} {len(xs):>4}  {min(xs):8.3f}  {med:8.3f}  {max(xs):8.3f}  "
            f"{min(xs) / ref:6.2f} {med / ref:6.2f} {max(xs) / ref:6.2f}  x {ref_name} ({ref:.3f} s)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--timeout-s", type=float, default=0.5, help="the client's request timeout (the test's 0.5)")
    ap.add_argument("--retries", type=int, default=3)
    ap.add_argument("--backoff-s", type=float, default=0.05)
    args = ap.parse_args()

    from fake_fleet import FakeEngine, Fleet

    fleet = Fleet()
    try:
        fast_url, _ = fleet(FakeEngine())
        runs = []
        for _ in range(args.runs):  # a fresh stuck server each run: the last one's lock is still held
            stuck_url, _ = fleet(FakeEngine(gate=threading.Event()))  # answers only when the fleet closes
            runs.append(failover_once([stuck_url, fast_url], 0, args.timeout_s))
    finally:
        fleet.close()
    failover, plain = [r[0] for r in runs], [r[1] for r in runs]
    refused = [refused_once(args.retries, args.backoff_s) for _ in range(args.runs)]
    refused_1 = [refused_once(1, 0.01) for _ in range(args.runs)]  # the test's settings

    print(f"{'seconds':<36} {'runs':>4}  {'min':>8}  {'median':>8}  {'max':>8}  {'ratio min/median/max':>20}")
    print(row("failover (stuck + fast server)", failover, args.timeout_s, "timeout_s"))
    print(row("  a plain request, same client", plain, args.timeout_s, "timeout_s"))
    print(row(f"refused, {args.retries} retries from {args.backoff_s} s", refused,
              backoff_total(args.retries, args.backoff_s), "backoff"))
    print(row("refused, 1 retry from 0.01 s (test)", refused_1, backoff_total(1, 0.01), "backoff"))
    over = statistics.median(failover) - args.timeout_s - statistics.median(plain)
    print(f"failover cost beyond the timeout and a plain request: {over * 1000:.1f} ms (median); "
          f"the old test bounds: 2.5 s for two requests with one failover, 10 s for the refusal")
    return 0


if __name__ == "__main__":
    sys.exit(main())
