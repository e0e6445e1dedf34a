"""bf16 against fp32 on this CPU, side by side in one run: why the demo picks its precision (train/precision.py).

    .venv/bin/python bench/cpu_bf16.py [--repeats 20] [--threads 1]

Times, per dtype, a SmolLM2-shaped matmul (512 x 576 @ 576 x 1536, one MLP projection of 512 positions)
and one forward + backward of a 576-wide SwiGLU MLP under autocast (what train.bf16 does to the draft), and
prints the bf16 / fp32 time ratio beside oneDNN's native-bf16 verdict. A CPU without AVX512-BF16 or AMX
emulates bf16 (ratios far above 1); one with them runs it faster than fp32 (ratios below 1).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from draftsmith.train.precision import cpu_has_native_bf16  # noqa: E402


def best_ms(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return 1e3 * min(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    rows = []
    a32, b32 = torch.randn(512, 576), torch.randn(576, 1536)
    a16, b16 = a32.bfloat16(), b32.bfloat16()
    rows.append(("matmul 512x576 @ 576x1536", best_ms(lambda: a32 @ b32, args.repeats),
                 best_ms(lambda: a16 @ b16, args.repeats)))
    mlp = torch.nn.Sequential(torch.nn.Linear(576, 1536, bias=False), torch.nn.SiLU(), torch.nn.Linear(1536, 576, bias=False))
    x = torch.randn(512, 576)

    def step(bf16: bool):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            y = mlp(x)
        y.float().pow(2).mean().backward()

    rows.append(("MLP fwd+bwd, autocast (train.bf16)", best_ms(lambda: step(False), args.repeats),
                 best_ms(lambda: step(True), args.repeats)))
    print(f"CPU capability {torch.backends.cpu.get_cpu_capability()}, native bf16 (oneDNN): {cpu_has_native_bf16()}, "
          f"{args.threads} thread(s)")
    print("| op | fp32 ms | bf16 ms | bf16 / fp32 |\n|---|---|---|---|")
    for name, f32, f16 in rows:
        print(f"| {name} | {f32:.2f} | {f16:.2f} | {f16 / f32:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
