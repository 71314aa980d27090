"""Per model and modality: does the DP encoder spread a call on ROCm.

Two gloo ranks, attention-TP 2, ``--mm-enable-dp-encoder`` on, ROCm simulated
with ``mm_harness.on_platform``; two single-item requests per case go through
the real ``mm_schedule._get_chunked_prefill_embedding`` with real
``MultimodalDataItem`` objects and the model's bound ``get_*_feature``.

* InternVL (``InternVLChatModel``, tiles split evenly) and Muse Spark
  (``MuseSparkForConditionalGeneration``, its own runner) spread their images
  (each answers ``dp_encoder_spreads_images``): one cross-request call. Both
  are real tiny models that really encode; Muse Spark is built by its real
  ``__init__`` in the encoder-only branch (its decoder needs a CUDA stream to
  build), which builds the same NaViT tower, adapter and projection as a full
  server.
* GLM-Image and the Qwen3-Omni thinker are built whole by their real
  ``__init__`` (``use_data_parallel = True``, read from the flag) but their
  vision towers are tensor-parallel (GLM-Image does not answer
  ``dp_encoder_spreads_images``, the thinker answers False), so they must stay
  one call per request, and the thinker's audio is never spread. Serving
  either with the DP encoder is broken upstream: the DP runner hands the
  ranks different images while the tower's collectives expect the same ones,
  so a real image encode would hang. Their ``get_image_feature`` is therefore
  a recording stand-in bound to the real model object (the gate still sees
  the real class and its answer) that returns zeros, one row per placeholder
  token. The thinker's audio encode is real.
* On CUDA the gate batches whatever the model (the decision table's CUDA
  rows, test_gate_prefill_paths.py); here only the thinker's audio
  runs on CUDA too, as the batched reference of its ROCm rows.
"""

import logging
import types

import pytest
import torch

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=1, suite="stage-a-test-cpu")

from cpu_support.ranks import mm_harness as H  # noqa: E402
from cpu_support.ranks.gloo import run_on_ranks  # noqa: E402


def rocm_line(batched: bool, model_class: str) -> str:
    """The gate's INFO line on ROCm at attention-TP 2."""
    return (
        f"cross-request ViT batching on ROCm: {'on' if batched else 'off'} "
        f"({model_class}, attention-TP 2)"
    )


# Placeholder tokens per item (model facts of the tiny configs).
INTERNVL_TOKENS_PER_TILE = 4  # 32x32 tile, 8x8 patches = 16, pixel-shuffled by 0.5
QWEN_GRID = (1, 8, 8)
QWEN_TOKENS = 16  # 64 patches merged 2x2
MUSE_TOKENS = 4  # 32x32 pixels, 8x8 patches = 16, merged 2x2
AUDIO_TOKENS = 5  # 40 mel frames after three stride-2 convolutions
HIDDEN = 64


def recording_encoder(model, name, calls):
    """A ``name`` (``get_image_feature``) stand-in bound to the REAL ``model``:
    records each call's item count and returns zeros, one row per placeholder
    token of its items."""

    def encoder(self, items):
        calls.append(len(items))
        tokens = sum(end - start + 1 for item in items for start, end in item.offsets)
        return torch.zeros(tokens, HIDDEN)

    encoder.__name__ = name
    return types.MethodType(encoder, model)


def item_lengths(calls):
    """An ``H.encoder_spy`` recorder: the item count of each call."""
    return lambda items: calls.append(len(items))


def tower_inputs(module, seen):
    """A forward pre-hook appending the number of inputs of each call: the
    length of a list (Muse Spark's NaViT takes one tensor per image), else
    the first dimension (InternViT's tiles on this rank)."""

    def hook(mod, args, kwargs):
        x = args[0] if args else next(iter(kwargs.values()))
        seen.append(len(x) if isinstance(x, list) else int(x.shape[0]))

    return module.register_forward_pre_hook(hook, with_kwargs=True)


def one_item_request(item, tokens):
    """A whole prompt: text, the item's placeholder span, text."""
    return H.Request(items=[item], length=H.TEXT_BEFORE + tokens + H.TEXT_BETWEEN)


def _has_series():
    from sglang.srt.managers import mm_schedule

    return hasattr(mm_schedule, "_batch_vit_across_requests")


def _fresh_server():
    """A new server's state: an empty embedding cache, and (with the series)
    the gate's once-per-server log memory emptied."""
    H.fresh_embedding_cache()
    if _has_series():
        H.fresh_gate_log()


def _step(encoder, requests, platform, gate_log, calls, towers=None):
    """One prefill step of ``requests`` through the real scheduler function,
    with ``encoder`` (a bound ``get_*_feature``) as the embedding function."""
    import contextlib

    _fresh_server()
    calls.clear()
    if towers is not None:
        towers.clear()
    first = len(gate_log.lines)
    with contextlib.ExitStack() as stack:
        stack.enter_context(torch.no_grad())
        stack.enter_context(H.on_platform(platform))
        # run_prefill_embedding hands the scheduler ``model.get_image_feature``.
        out = H.run_prefill_embedding(
            types.SimpleNamespace(get_image_feature=encoder), requests
        )
    gate = [
        line
        for line in gate_log.lines[first:]
        if "cross-request ViT batching" in line[1]
    ]
    return {
        "calls": list(calls),
        "towers": list(towers) if towers is not None else None,
        "gate": gate,
        "out": out,
    }


def _rank_worker(rank, world_size, init_method):
    from cpu_support.tiny_models import tiny_gemma3_internvl as G
    from cpu_support.tiny_models import tiny_omni_muse as O
    from cpu_support.tiny_models import tiny_qwen3_vl as T
    from cpu_support.tiny_models.tiny_vl_family import build_tiny_family_model
    from test_gate_real_non_dp_vlm import tiny_glm_image_config

    from sglang.srt.models.glm_image_vl import GlmImageForConditionalGeneration

    gate_log = H.capture_gate_log()
    result = {}
    calls, towers = [], []
    platforms = ("ROCm",)

    # --- InternVL: real tiny model, real encoding; tiles split evenly.
    G.publish_dp_encoder_server(G.tiny_internvl_config(), rank, world_size)
    T.init_gloo(rank, world_size, init_method)
    internvl = G.build_tiny_internvl(seed=4)
    result[("built", "internvl")] = _built(
        internvl, "use_data_parallel", internvl.vision_model.encoder.layers[0].mlp.fc1
    )
    internvl.get_image_feature = H.encoder_spy(internvl, item_lengths(calls))
    handle = tower_inputs(internvl.vision_model.encoder, towers)
    two = G.pixel_requests(
        [[1], [1]], INTERNVL_TOKENS_PER_TILE, seed=5, key="per-model"
    )
    for platform in platforms:
        result[("internvl", platform)] = _step(
            internvl.get_image_feature, two, platform, gate_log, calls, towers
        )
    with torch.no_grad():
        result["internvl_alone"] = H.reference_rows(internvl, two)
    handle.remove()

    # --- Muse Spark: real tiny model, its own runner.
    G.publish_dp_encoder_server(O.tiny_muse_spark_config(), rank, world_size)
    muse = O.build_tiny_muse_spark(seed=8)
    result[("built", "muse")] = _built(
        muse, "use_data_parallel_encoder", muse.model.vision_tower.layers[0].mlp.fc1
    )
    muse.get_image_feature = H.encoder_spy(muse, item_lengths(calls))
    handle = tower_inputs(muse.model.vision_tower, towers)
    images = [
        one_item_request(
            O.muse_image_item(seed=90 + k, offset=H.TEXT_BEFORE), MUSE_TOKENS
        )
        for k in range(3)
    ]
    for platform in platforms:
        result[("muse", platform)] = _step(
            muse.get_image_feature, images[:2], platform, gate_log, calls, towers
        )
    with torch.no_grad():
        result["muse_alone"] = H.reference_rows(muse, images[:2])
    handle.remove()

    # --- GLM-Image: built whole; its vision MLP is tensor-parallel.
    config = tiny_glm_image_config()
    G.publish_dp_encoder_server(config, rank, world_size)
    glm = build_tiny_family_model(config, GlmImageForConditionalGeneration)
    result[("built", "glm_image")] = _built(
        glm, "use_data_parallel", glm.visual.blocks[0].mlp.linear_fc1
    )
    two_qwen = [H.make_request([QWEN_GRID], seed=s) for s in (11, 12)]
    for platform in platforms:
        encoder = recording_encoder(glm, "get_image_feature", calls)
        result[("glm_image", platform)] = _step(
            encoder, two_qwen, platform, gate_log, calls
        )

    # --- Qwen3-Omni thinker: built whole; TP vision encoder, TP audio tower.
    G.publish_dp_encoder_server(O.tiny_qwen3_omni_thinker_config(), rank, world_size)
    thinker = O.build_tiny_qwen3_omni_thinker(seed=9)
    result[("built", "thinker")] = _built(
        thinker, "use_data_parallel", thinker.visual.blocks[0].mlp.linear_fc1
    )
    for platform in platforms:
        encoder = recording_encoder(thinker, "get_image_feature", calls)
        result[("thinker_image", platform)] = _step(
            encoder, two_qwen, platform, gate_log, calls
        )
    thinker.get_audio_feature = _audio_spy(thinker, calls)
    clips = [
        one_item_request(O.audio_item(seed=s, offset=H.TEXT_BEFORE), AUDIO_TOKENS)
        for s in (21, 22)
    ]
    for platform in ("ROCm", "CUDA"):  # CUDA: the batched reference
        result[("thinker_audio", platform)] = _step(
            thinker.get_audio_feature, clips, platform, gate_log, calls
        )
    return result


def _audio_spy(model, calls):
    """The thinker's real ``get_audio_feature``, bound to it, recording each
    call's item count first."""
    real = type(model).get_audio_feature

    def get_audio_feature(self, items):
        calls.append(len(items))
        return real(self, items)

    return types.MethodType(get_audio_feature, model)


def _built(model, attribute, vision_fc1):
    """How the real ``__init__`` built ``model``: its class, the attribute it
    set from the flag, and the output rows of its first vision MLP layer on
    this rank (a tensor-parallel layer holds half of them at TP 2)."""
    return (
        type(model).__name__,
        attribute,
        getattr(model, attribute),
        int(vision_fc1.weight.shape[0]),
    )


@pytest.fixture(scope="module")
def ranks():
    return run_on_ranks(_rank_worker, 2, timeout=500)


def _gate(rank, line):
    """The gate's INFO line: once per server, on TP rank 0 only."""
    return [(logging.INFO, line)] if rank == 0 else []


# ---------------------------------------------------------------------------
# The gate, per model and modality, on ROCm
# ---------------------------------------------------------------------------


# (class, the attribute its __init__ sets from the flag, its value, rows of
# the first vision MLP layer on each rank). The tiny MLPs are 64 wide in
# InternVL and Muse Spark (whole on each rank) and 128 wide in GLM-Image and
# the thinker (half on each rank: tensor-parallel).
BUILT = {
    "internvl": ("InternVLChatModel", "use_data_parallel", True, 64),
    "muse": (
        "MuseSparkForConditionalGeneration",
        "use_data_parallel_encoder",
        True,
        64,
    ),
    "glm_image": ("GlmImageForConditionalGeneration", "use_data_parallel", True, 64),
    "thinker": (
        "Qwen3OmniMoeThinkerForConditionalGeneration",
        "use_data_parallel",
        True,
        64,
    ),
}


@pytest.mark.parametrize("model", ["internvl", "muse"])
def test_rocm_dp_model_takes_both_requests_in_one_call(ranks, model):
    """InternVL and Muse Spark spread a call's images: on ROCm the two
    one-image requests are one encoder call, each rank encoding one image
    (InternVL: one of the two tiles; Muse Spark: one of the two images), and
    both ranks hold the same embeddings, each image's as when encoded alone."""
    for rank, r in enumerate(ranks):
        assert r[("built", model)] == BUILT[model]
        step = r[(model, "ROCm")]
        assert step["calls"] == [2]
        assert step["towers"] == [1]
        assert step["gate"] == _gate(rank, rocm_line(True, BUILT[model][0]))
        torch.testing.assert_close(
            step["out"], r[f"{model}_alone"], rtol=1e-4, atol=1e-5
        )
    torch.testing.assert_close(
        ranks[0][(model, "ROCm")]["out"], ranks[1][(model, "ROCm")]["out"]
    )


@pytest.mark.parametrize(
    "case,model,logged",
    [
        ("glm_image", "glm_image", True),
        ("thinker_image", "thinker", True),
        ("thinker_audio", "thinker", False),
    ],
    ids=["glm-image", "qwen3-omni-image", "qwen3-omni-audio"],
)
@pytest.mark.control(
    reason="upstream behaviour the series keeps: ROCm per request for these towers"
)
def test_rocm_not_spread_stays_one_call_per_request(ranks, case, model, logged):
    """GLM-Image's and the Qwen3-Omni thinker's images, and the thinker's
    audio: one encoder call per request on ROCm, although the real class says
    ``use_data_parallel = True`` (its vision MLP being tensor-parallel). For
    images the gate says "off" once, on TP rank 0, naming the model; audio is
    no ViT work and stays per request without a line."""
    line = rocm_line(False, BUILT[model][0])
    tokens = AUDIO_TOKENS if case == "thinker_audio" else QWEN_TOKENS
    for rank, r in enumerate(ranks):
        assert r[("built", model)] == BUILT[model]
        step = r[(case, "ROCm")]
        assert step["calls"] == [1, 1]
        assert step["gate"] == (_gate(rank, line) if logged else [])
        assert tuple(step["out"].shape) == (2 * tokens, HIDDEN)
    if case == "thinker_audio":
        # The audio tower really ran, every rank on the same clip: the ranks
        # agree, the rows are not zeros, and match the batched CUDA step's.
        rocm = [r[(case, "ROCm")]["out"] for r in ranks]
        torch.testing.assert_close(rocm[0], rocm[1])
        assert rocm[0].abs().sum() > 0
        torch.testing.assert_close(
            rocm[0], ranks[0][(case, "CUDA")]["out"], rtol=1e-4, atol=1e-5
        )
