"""Every model class that inherits a hook of the series, through its hooks.

The series adds ``dp_encoder_spreads_images`` and a vision warm-up in
``precompile_kernels_after_loading`` to model classes. A subclass inherits
both whether or not its ``__init__`` builds what they read: GLM-OCR's MTP
draft (``GlmOcrForConditionalGenerationNextN``) calls ``nn.Module.__init__``
itself and builds no tower, and SGLang runs the post-load hook on the draft
worker's model too.

The classes are found, not listed: every module of ``sglang.srt.models`` is
imported and each class that defines ``dp_encoder_spreads_images`` is walked
through ``__subclasses__``. Each is built as such a subclass is (an
``nn.Module`` holding only a config) and, on one process published as TP rank 1
of attention-TP 2 with ``--mm-enable-dp-encoder`` on ROCm (where every other
condition says warm), must answer ``dp_encoder_spreads_images()`` False and
return from SGLang's post-load bracket without a vision warm-up line.
"""

import types

import pytest

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=60, suite="stage-a-test-cpu")

from cpu_support.ranks import mm_harness as H  # noqa: E402
from cpu_support.ranks.gloo import run_on_ranks  # noqa: E402

# Pristine 0.5.23's own precompile_kernels_after_loading of these classes
# reads the attribute named, unguarded, after the series' warm-up: a class
# without it failed there before the series.
PRISTINE_HOOK_READS = {"KimiK3ForConditionalGeneration": "vision_tower"}


def _hooked_classes():
    import importlib
    import pkgutil

    import torch

    import sglang.srt.models as models

    for module in pkgutil.iter_modules(models.__path__):
        try:
            importlib.import_module(f"sglang.srt.models.{module.name}")
        except ImportError:  # a kernel package the CPU set-up lacks
            pass

    def walk(cls):
        yield cls
        for sub in cls.__subclasses__():
            yield from walk(sub)

    found = {}
    for cls in walk(torch.nn.Module):
        if "dp_encoder_spreads_images" in vars(cls):
            found.update((c.__qualname__, c) for c in walk(cls))
    return found


def _worker(rank, world_size, init_method):
    import torch
    from cpu_support.tiny_models import tiny_qwen3_vl as T

    from sglang.srt.runtime_context import get_mm, get_parallel

    torch.distributed.init_process_group(
        "gloo", init_method=init_method, rank=rank, world_size=world_size
    )
    T.publish_cpu_context(tp_size=2, rank=1, dp_encoder=True)
    out = {}
    for name, cls in sorted(_hooked_classes().items()):
        model = cls.__new__(cls)
        torch.nn.Module.__init__(model)
        model.config = types.SimpleNamespace(language_only=False, encoder_only=False)
        row = {}
        with H.on_platform("ROCm"), get_mm().override(
            mm_enable_dp_encoder=True
        ), get_parallel().override(tp_rank=1, attn_tp_rank=1), H.warm_up_log() as log:
            for hook in ("spreads", "post_load"):
                try:
                    if hook == "spreads":
                        row[hook] = model.dp_encoder_spreads_images()
                    else:
                        row[hook] = H.post_load_hook(model)
                except Exception as error:
                    row[hook] = f"{type(error).__name__}: {error}"
        row["lines"] = list(log.lines)
        out[name] = row
    return out


@pytest.fixture(scope="module")
def classes():
    return run_on_ranks(_worker, 1, timeout=600)[0]


def test_the_walk_reaches_the_draft_and_the_subclasses(classes):
    for name in (
        "GlmOcrForConditionalGenerationNextN",  # GLM-4V -> GLM-OCR -> draft
        "Qwen3VLMoeForConditionalGeneration",  # Qwen3-VL's subclasses
        "Qwen3_5ForConditionalGeneration",
        "Glm4vMoeForConditionalGeneration",
    ):
        assert name in classes, sorted(classes)


def test_no_hook_raises_on_a_class_that_builds_no_encoder(classes):
    assert classes, "no model class defines dp_encoder_spreads_images"
    failures = {}
    for name, row in classes.items():
        expected_post_load = None
        if name in PRISTINE_HOOK_READS:
            attribute = PRISTINE_HOOK_READS[name]
            expected_post_load = (
                f"AttributeError: '{name}' object has no attribute '{attribute}'"
            )
        got = (row["spreads"], row["post_load"], row["lines"])
        if got != (False, expected_post_load, []):
            failures[name] = got
    assert failures == {}
