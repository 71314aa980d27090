"""What the copy of a ViT graph replay's output costs, against the call itself.

``ViTCudaGraphRunner.replay`` returns a copy of the graph's static output (the
series' first patch). This prints, for SGLang's real Qwen3-VL vision tower on
the CPU (random weights, eager: there is no graph here, so the call is the
eager tower's), the median time of one tower call and of one copy of its
output (``Tensor.clone``), per call and per step of N single-image requests
encoded one image per call (--mm-max-encoder-input-tokens-per-batch under one image)
or in one call. Two tower sizes: the tests' tiny tower, and Qwen3-VL-8B's
widths (hidden 1152, 16 heads, MLP 4304, output 4096 with three deepstack
mergers) at --depth blocks instead of 27, so the call is shorter than the real
tower's and the copy's share is an upper bound.

    .venv/bin/python benchmark/vit/bench_vit_graph_copy.py [--repeats 7] [--depth 4]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

# The repository root, for cpu_support.
sys.path.insert(
    0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
)

import torch  # noqa: E402
from cpu_support.bench.vit_bench_util import free_port, markdown_table  # noqa: E402
from cpu_support.tiny_models import tiny_qwen3_vl as T  # noqa: E402


def _median_ms(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def _tower(depth: int, real_widths: bool):
    vision = {}
    if real_widths:
        vision = dict(
            depth=depth,
            hidden_size=1152,
            num_heads=16,
            intermediate_size=4304,
            out_hidden_size=4096,
            deepstack_visual_indexes=list(range(1, depth))[-3:],
        )
    model = T.build_tiny_qwen3_vl(T.tiny_qwen3_vl_config(vision=vision), seed=1)
    return model


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument(
        "--depth", type=int, default=4, help="blocks of the 8B-width tower"
    )
    parser.add_argument(
        "--grid",
        type=int,
        nargs=3,
        default=(1, 28, 28),
        help="patch grid of each image (default: 448x448 at patch 16)",
    )
    parser.add_argument(
        "--images",
        type=int,
        nargs="+",
        default=[1, 4, 8],
        help="single-image requests in a step",
    )
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.depth < 2 or min(args.images) < 1 or min(args.grid) < 1:
        parser.error(
            "--repeats and --images must be >= 1, --depth >= 2, the grid positive"
        )

    torch.set_num_threads(max(1, torch.get_num_threads()))
    T.publish_cpu_context(tp_size=1)
    T.init_gloo(0, 1, f"tcp://127.0.0.1:{free_port()}")
    grid = tuple(args.grid)
    print(
        f"grid {list(grid)} per image, medians of {args.repeats}, "
        f"{torch.get_num_threads()} threads"
    )
    rows = []
    for name, real in (
        ("tiny (depth 2, width 64)", False),
        (f"8B widths, depth {args.depth}", True),
    ):
        model = _tower(args.depth, real)
        with torch.no_grad():
            item = T.image_item(grid, seed=0, config=model.config)
            one = model.get_image_feature([item])
            call_ms = _median_ms(lambda: model.get_image_feature([item]), args.repeats)
            copy_ms = _median_ms(lambda: one.clone(), args.repeats)
            mib = one.numel() * one.element_size() / 2**20
            for n in args.images:
                items = [
                    T.image_item(grid, seed=k, config=model.config) for k in range(n)
                ]
                batched = model.get_image_feature(items)
                batch_ms = _median_ms(
                    lambda: model.get_image_feature(items), args.repeats
                )
                batch_copy_ms = _median_ms(lambda: batched.clone(), args.repeats)
                each = (
                    f"{n * call_ms:.2f} / {n * copy_ms:.3f} / {copy_ms / call_ms:.2%}"
                )
                whole = f"{batch_ms:.2f} / {batch_copy_ms:.3f} / {batch_copy_ms / batch_ms:.2%}"
                rows.append(
                    [name, n, f"{mib:.2f}", f"{call_ms:.2f}", f"{copy_ms:.3f}"]
                    + [each, whole]
                )
    print(
        markdown_table(
            [
                "tower",
                "images/step",
                "output MiB/image",
                "call ms",
                "copy ms",
                "step, one call per image: calls ms / copies ms / copy share",
                "step, one call: call ms / copy ms / copy share",
            ],
            rows,
            align="lrrrrll",
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
