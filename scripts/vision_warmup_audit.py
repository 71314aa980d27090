"""Per-family compile audit of the post-load vision warm-up, on CPU (docs/warmup.md).

For each registered family, SGLang's real model class is built with tiny
random weights, and each case runs in a fresh process (nothing compiled
yet): warm the tower with the calls the patch ships for that model
(the calls its own ``precompile_kernels_after_loading`` hands
``mm_utils.warm_up_vision_tower``, read from the installed series, run
through that helper with its decision forced true), or
with none, or with the first call only; then run the serving sweep
(``SERVING_SWEEP`` then ``CEILING_CALL``), one tower call each, handed over
exactly as the DP encoder hands a rank its share (``call_tower_on_rank_share``
with the hook's ``rope_type`` and patch layout; a family whose hook hands the
helper a call of its own, not a rank share of
``run_dp_sharded_mrope_vision_model``, reports its warm-up only). Compiles are Dynamo's own
counter (``counters["frames"]["ok"]``, one per compiled or recompiled frame)
plus the cache entries of the family's compiled functions; seconds are wall
time of the machine that runs it.

    .venv/bin/python scripts/vision_warmup_audit.py                 # every family, every mode
    .venv/bin/python scripts/vision_warmup_audit.py --family glm4v --mode shipped
    .venv/bin/python scripts/vision_warmup_audit.py --list

``--fresh-inductor-cache`` points TORCHINDUCTOR_CACHE_DIR at a new empty
folder for every case, so each warm-up pays full Inductor code generation, as
on a first launch; without it the cases share the user's Inductor cache and
the warm-up seconds are those of a relaunch.
``--json PATH`` also writes every case's numbers.

Adding a family is one ``FAMILIES`` entry: a name, its model variants (a
label and a tiny builder each, as ``"module:function"`` plus keyword
arguments, built after the CPU runtime context and gloo groups exist) and
the compiled functions (``"module:attribute"``) whose Dynamo cache entries
to report. The tower, its grids, its rope type and its patch layout all come
from the model's own post-load hook (``mm_harness.shipped_warm_up``), so a
family whose hook warms nothing is reported as without a plan.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:  # cpu_support
    sys.path.insert(0, ROOT)

# The serving sweep (tower calls), as the DP encoder hands a rank its share:
# the 16-token floor of --mm-process-config (8x8 patches, and a 2x32 strip, the
# floor at a 1:16 aspect), multi-image calls, a 6144-patch image. The tests
# sweep these too (test_vision_warmup.py, test_vision_warmup_families.py).
SERVING_SWEEP = [
    [(1, 8, 8)],
    [(1, 2, 32)],
    [(1, 16, 16)],
    [(1, 8, 8)] * 3,
    [(1, 20, 36)],
    [(1, 8, 8), (1, 40, 60)],
    [(1, 16, 16)] * 7,
    [(1, 64, 64)],
    [(1, 64, 96)],
]
# ...then the --mm-process-config ceiling: 8000 tokens = 32000 patches in one
# call. The compiled pieces only see the call's total patch count, so 32 images
# adding up to 8000 tokens reach the same shapes as one ceiling image (the
# seed's 2464x2520 is 7920 tokens) without a 32000x32000 attention on CPU.
CEILING_CALL = [(1, 32, 32)] * 31 + [(1, 16, 16)]
SWEEP = SERVING_SWEEP + [CEILING_CALL]

# Compiled functions seen by the towers (module:attribute).
ROTARY = "sglang.srt.layers.attention.vision:apply_rotary_pos_emb"
GLM5_SWIGLU = "sglang.srt.models.glm5_next:swiglu_clamped"
# Kimi-K2.5's interpolated position embedding (dynamic=True; the module
# attribute is a first-call wrapper around the compiled function) and
# MiniMax-VL's rotary apply (dynamic=True).
KIMI_K25_ROPE_SHAPE = "sglang.srt.models.kimi_k25:get_rope_shape"
MINIMAX_ROPE = "sglang.srt.models.minimax_vl_common:_minimax_rope_applier"

TINY = "cpu_support.tiny_models.tiny_vl_family"
KIMI_MINIMAX = "cpu_support.tiny_models.tiny_kimi_minimax"


@dataclass(frozen=True)
class Variant:
    """One model class of a family: a label and how to build it tiny."""

    label: str
    builder: str  # "module:function"
    kwargs: Tuple[Tuple[str, object], ...] = ()

    def build(self):
        module, name = self.builder.split(":")
        return getattr(importlib.import_module(module), name)(**dict(self.kwargs))


@dataclass(frozen=True)
class Family:
    variants: Tuple[Variant, ...]
    compiled: Tuple[str, ...] = (ROTARY,)
    note: str = ""  # printed under the family's heading


# family name -> its variants and compiled functions. One entry per family;
# a new one needs only a tiny builder, e.g. (names illustrative)
#     "kimi_vl": Family(
#         (Variant("Kimi-VL", "cpu_support.tiny_models.tiny_x:build_tiny_kimi_vl"),)
#     ),
# plus compiled=(...) when its tower compiles more than the rotary apply.
# Tower, grids, rope type and patch layout come from the model's own hook
# (mm_harness.shipped_warm_up).
FAMILIES: Dict[str, Family] = {
    "qwen3_vl": Family(
        (
            Variant(
                "Qwen3-VL", "cpu_support.tiny_models.tiny_qwen3_vl:build_tiny_qwen3_vl"
            ),
        ),
    ),
    "glm5_next": Family(
        (Variant("GLM-5-Next", f"{TINY}:build_tiny_glm5_next"),),
        compiled=(ROTARY, GLM5_SWIGLU),
    ),
    "qwen2_5_vl": Family(
        (Variant("Qwen2.5-VL", f"{TINY}:build_tiny_qwen2_5_vl"),),
    ),
    "glm4v": Family(
        (
            Variant("GLM-4V", f"{TINY}:build_tiny_glm4v"),
            Variant("GLM-4.5V-MoE", f"{TINY}:build_tiny_glm4v", (("moe", True),)),
        ),
    ),
    "bailing_mm": Family(
        (
            Variant("Bailing MM2 (Qwen3-VL tower)", f"{TINY}:build_tiny_bailing_mm"),
            Variant(
                "Bailing MM (Qwen2.5-VL tower)",
                f"{TINY}:build_tiny_bailing_mm",
                (("vision", "qwen2_5"),),
            ),
        ),
    ),
    "bailing_moe_v3_vl": Family(
        (Variant("Ling-3 VL", f"{TINY}:build_tiny_bailing_moe_v3_vl"),),
    ),
    # Kimi and MiniMax: the real top-level classes, built from encoder-only
    # configs (no language model; see cpu_support/tiny_models/tiny_kimi_minimax.py).
    "kimi_vl": Family(
        (Variant("Kimi-VL", f"{KIMI_MINIMAX}:build_tiny_kimi_vl"),),
        compiled=(),
        note="MoonViT (Kimi-VL): no torch.compile piece in the tower.",
    ),
    "kimi_k25": Family(
        (Variant("Kimi-K2.5", f"{KIMI_MINIMAX}:build_tiny_kimi_k25"),),
        compiled=(KIMI_K25_ROPE_SHAPE,),
    ),
    "kimi_k3": Family(
        (Variant("Kimi-K3", f"{KIMI_MINIMAX}:build_tiny_kimi_k3"),),
        compiled=(),
        note="Kimi-K3's tower: no torch.compile piece reached on CPU.",
    ),
    "minimax_vl": Family(
        (Variant("MiniMax-VL (M3)", f"{KIMI_MINIMAX}:build_tiny_minimax_vl"),),
        compiled=(MINIMAX_ROPE,),
    ),
}

MODES = ("shipped", "none", "first")


def _resolve(path: str):
    """The compiled function at ``module:attribute``; when the attribute is a
    plain wrapper around it (Kimi-K2.5's get_rope_shape), the compiled
    function the wrapper closes over."""
    module, name = path.split(":")
    fn = getattr(importlib.import_module(module), name)
    if hasattr(fn, "_torchdynamo_orig_callable"):
        return fn
    for cell in getattr(fn, "__closure__", None) or ():
        inner = cell.cell_contents
        if hasattr(inner, "_torchdynamo_orig_callable"):
            return inner
    return fn


def _cache_entries(fn) -> int:
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    code = getattr(fn, "_torchdynamo_orig_callable", fn).__code__
    return len(_debug_get_cache_entry_list(code))


def _case(rank, world_size, init_method, family_name, variant_index, mode):
    """One case, in a fresh process: build, warm up per ``mode``, sweep."""
    import torch
    from cpu_support.ranks.mm_harness import frames_compiled as frames
    from cpu_support.ranks.mm_harness import shipped_warm_up
    from cpu_support.tiny_models import tiny_qwen3_vl as T

    from sglang.srt.multimodal import mm_utils
    from sglang.srt.multimodal.mm_utils import (
        call_tower_on_rank_share,
        warm_up_vision_tower,
    )
    from sglang.srt.utils.common import DynamicGradMode

    family = FAMILIES[family_name]
    variant = family.variants[variant_index]
    T.publish_cpu_context(tp_size=1, dp_encoder=True)
    T.init_gloo(rank, world_size, init_method)
    model = variant.build()
    plan = shipped_warm_up(model)
    result = dict(
        family=family_name,
        variant=variant.label,
        model_class=type(model).__name__,
        mode=mode,
        plan=None,
    )
    if plan is None:
        return result
    tower = plan["tower"]
    shipped = [
        [tuple(g) for g in ([call] if isinstance(call[0], int) else call)]
        for call in plan["calls"]
    ]
    calls = {"shipped": shipped, "first": shipped[:1], "none": []}[mode]
    fns = {path.split(":")[1]: _resolve(path) for path in family.compiled}

    result.update(
        plan=dict(
            tower=plan["tower_name"],
            tower_class=type(tower).__name__,
            rope_type=plan["rope_type"],
            calls=shipped,
        ),
        calls=calls,
        before=frames(),
    )
    start = time.perf_counter()
    if calls:
        # This process is attention-TP 1: the hook's decision, forced true.
        mm_utils.vision_warm_up_needed = lambda model: True
        warm_up_vision_tower(model, tower, calls, plan["call"])
    result["warm_s"] = time.perf_counter() - start
    result["warm_compiles"] = frames() - result["before"]
    result["entries_after_warm_up"] = {k: _cache_entries(f) for k, f in fns.items()}

    if plan["rope_type"] is None:
        # A runner of the model's own: its rank share is not a tower call
        # this sweep can reproduce; report the warm-up only.
        result.update(per_call=None, sweep_compiles=None, sweep_s=0.0)
        result["entries_after_sweep"] = result["entries_after_warm_up"]
        return result
    shape = plan["patch_shape"]
    weight = next(tower.parameters())
    device, dtype = weight.device, weight.dtype
    # Towers whose grids have no time axis (Kimi-VL) take (h, w): every
    # sweep image is a single frame, so it drops t.
    two_d = len(shipped[0][0]) == 2
    sweep = [[tuple(g[1:]) if two_d else tuple(g) for g in call] for call in SWEEP]
    per_call = []
    start = time.perf_counter()
    with DynamicGradMode():
        for call in sweep:
            before = frames()
            n = sum(math.prod(g) for g in call)
            pixels = torch.randn((n, *shape)).to(device=device, dtype=dtype)
            call_tower_on_rank_share(
                tower,
                pixels,
                [list(g) for g in call],
                plan["rope_type"],
                plan["pass_grid_thw_list"],
            )
            per_call.append(frames() - before)
    result["sweep_s"] = time.perf_counter() - start
    result["per_call"] = per_call
    result["sweep_compiles"] = sum(per_call)
    result["entries_after_sweep"] = {k: _cache_entries(f) for k, f in fns.items()}
    return result


def run_case(family_name: str, variant_index: int, mode: str, attempts: int = 3):
    """One case in a fresh (spawned) process; retried when its gloo port was taken."""
    from cpu_support.ranks.gloo import run_on_ranks

    for attempt in range(attempts):
        try:
            return run_on_ranks(
                _case, 1, family_name, variant_index, mode, timeout=900
            )[0]
        except Exception as exc:  # RankFailed carries the rank's traceback
            if "EADDRINUSE" not in str(exc) or attempt == attempts - 1:
                raise


def fmt_call(call) -> str:
    """``[1,32,32]``; repeats of one grid as ``6x[1,8,8]``; images joined by +."""
    runs: List[list] = []
    for grid in call:
        if runs and runs[-1][0] == tuple(grid):
            runs[-1][1] += 1
        else:
            runs.append([tuple(grid), 1])
    text = []
    for grid, count in runs:
        one = "[" + ",".join(str(int(d)) for d in grid) + "]"
        text.append(one if count == 1 else f"{count}x{one}")
    return "+".join(text)


def fmt_calls(calls) -> str:
    return " ".join(fmt_call(c) for c in calls) or "-"


def family_table(family_name: str, results: List[dict]) -> str:
    from cpu_support.bench.vit_bench_util import markdown_table

    note = FAMILIES[family_name].note
    headers = [
        "model class (tiny)",
        "tower",
        "warm-up",
        "grids (tower calls)",
        "compiles in warm-up",
        "compiles after ready (sweep)",
        "per sweep call",
        "cache entries after warm-up / sweep",
        "warm-up s (CPU)",
    ]
    sweep_text = {None: "- (own DP runner)"}
    rows = []
    for r in results:
        model = f"{r['model_class']} ({r['variant']})"
        if r["plan"] is None:
            rows.append([model, "-", r["mode"], "no plan", "-", "-", "-", "-", "-"])
            continue
        entries = ", ".join(
            f"{k} {r['entries_after_warm_up'][k]}/{r['entries_after_sweep'][k]}"
            for k in r["entries_after_warm_up"]
        )
        rows.append(
            [
                model,
                f"{r['plan']['tower']} ({r['plan']['tower_class']})",
                r["mode"],
                fmt_calls(r["calls"]),
                r["warm_compiles"],
                sweep_text.get(r["sweep_compiles"], r["sweep_compiles"]),
                r["per_call"] if r["per_call"] is not None else "-",
                entries,
                f"{r['warm_s']:.1f}",
            ]
        )
    title = [f"### {family_name}", ""] + ([note, ""] if note else [])
    return "\n".join(title + [markdown_table(headers, rows, align="l" * 9)])


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", action="append", choices=sorted(FAMILIES))
    parser.add_argument("--mode", action="append", choices=MODES)
    parser.add_argument("--fresh-inductor-cache", action="store_true")
    parser.add_argument("--json", help="also write every case's numbers here")
    parser.add_argument("--list", action="store_true", help="list families and exit")
    args = parser.parse_args(argv)
    if args.list:
        for name, family in FAMILIES.items():
            print(name + ": " + ", ".join(v.label for v in family.variants))
        return 0
    families = args.family or list(FAMILIES)
    modes = args.mode or list(MODES)
    print(
        "sweep (one tower call each, after the warm-up):",
        ", ".join(fmt_call(c) for c in SWEEP),
    )
    everything = []
    for name in families:
        results = []
        for index in range(len(FAMILIES[name].variants)):
            for mode in modes:
                if args.fresh_inductor_cache:  # an empty cache for every case
                    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(
                        prefix="inductor-"
                    )
                results.append(run_case(name, index, mode))
        everything.extend(results)
        print()
        print(family_table(name, results), flush=True)
    if args.json:
        with open(args.json, "w") as out:
            json.dump(everything, out, indent=1, default=list)
    return 0


if __name__ == "__main__":
    sys.exit(main())
