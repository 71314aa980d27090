"""Write a tiny Qwen-VL model directory for the CPU server (never downloaded).

    python cpu_support/tiny_models/make_tiny_model.py --out DIR [--family qwen2_5_vl]

Two families (``--family``; default ``qwen3_vl``, the one everything else
uses): ``qwen3_vl`` (``Qwen3VLForConditionalGeneration``) and ``qwen2_5_vl``
(``Qwen2_5_VLForConditionalGeneration``, served by SGLang's
``models/qwen2_5_vl.py``; sizes in ``TINY_QWEN2_5_VL_VISION`` / ``_TEXT``).

The directory holds what ``python -m sglang.launch_server --model-path DIR
--load-format dummy`` and ``sglang.bench_serving`` read:

* ``config.json``: ``Qwen3VLForConditionalGeneration`` with the tiny sizes of
  :mod:`cpu_support.tiny_models.tiny_qwen3_vl` (vocabulary shrunk to the byte-level
  tokenizer below). No weights: the server fills them (``--load-format dummy``).
* ``tokenizer.json`` + ``tokenizer_config.json``: a byte-level BPE without
  merges (one token per byte), built with ``tokenizers``, followed by the Qwen
  special tokens. The vision tokens are *special*: bench_serving draws its
  random prompt tokens from the vocabulary minus the special ids, and a stray
  ``<|video_pad|>`` in a prompt makes the server fail the request.
* ``chat_template.jinja``: a small Qwen-style chat template with image/video
  placeholders.
* ``preprocessor_config.json`` / ``video_preprocessor_config.json``: the
  family's image and video processors (Qwen2-VL image processor for both;
  Qwen3-VL or Qwen2-VL video processor), sized for the tiny tower.

``transformers.AutoProcessor.from_pretrained(DIR)`` loads it as the family's
processor, ``Qwen3VLProcessor`` or ``Qwen2_5_VLProcessor`` (checked at the end
unless ``--no-check``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))  # the repository, for cpu_support
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from cpu_support.tiny_models.tiny_sizes import (  # noqa: E402  (no side effects)
    TINY_QWEN2_5_TEXT,
    TINY_QWEN2_5_VISION,
    TINY_TEXT,
    TINY_VISION,
)

# The Qwen special tokens, in Qwen's order (their ids follow the 256 bytes).
QWEN_SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
)
NUM_BYTES = 256
# Room above the real tokens; a multiple of 64 like real checkpoints.
VOCAB_SIZE = 320

CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "<|im_start|>{{ message['role'] + '\\n' }}"
    "{%- if message['content'] is string -%}"
    "{{ message['content'] }}"
    "{%- else -%}"
    "{%- for item in message['content'] -%}"
    "{%- if item['type'] in ('image', 'image_url') -%}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{%- elif item['type'] in ('video', 'video_url') -%}"
    "<|vision_start|><|video_pad|><|vision_end|>"
    "{%- elif item['type'] == 'text' -%}"
    "{{ item['text'] }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "<|im_end|>{{ '\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|im_start|>assistant{{ '\\n' }}{%- endif -%}"
)

# Images between 32x32 and 1024x1024 pixels keep their size (rounded to the
# 32-pixel merge grid): 224x224 -> 49 tokens, 512x512 -> 256 tokens.
MIN_PIXELS = 32 * 32
MAX_PIXELS = 1024 * 1024

FAMILIES = ("qwen3_vl", "qwen2_5_vl")
DEFAULT_FAMILY = "qwen3_vl"
ARCHITECTURES = {
    "qwen3_vl": "Qwen3VLForConditionalGeneration",
    "qwen2_5_vl": "Qwen2_5_VLForConditionalGeneration",
}
PROCESSOR_CLASSES = {
    "qwen3_vl": "Qwen3VLProcessor",
    "qwen2_5_vl": "Qwen2_5_VLProcessor",
}

# The tiny Qwen2.5-VL: the sizes of cpu_support.tiny_models.tiny_sizes (tower, text),
# with video positions at 2 tokens a second. Heads and kv heads divide by 2
# (TP2); mrope 2+3+3 = head_dim / 2.
TINY_QWEN2_5_VL_VISION = dict(TINY_QWEN2_5_VISION, tokens_per_second=2)
TINY_QWEN2_5_VL_TEXT = dict(TINY_QWEN2_5_TEXT)
TINY_QWEN2_5_VL_ROPE = {
    "rope_type": "default",
    "mrope_section": [2, 3, 3],
    "rope_theta": 1000000.0,
}


def _check_family(family: str) -> str:
    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}; one of {', '.join(FAMILIES)}")
    return family


def token_ids() -> dict:
    return {tok: NUM_BYTES + i for i, tok in enumerate(QWEN_SPECIAL_TOKENS)}


def build_tokenizer():
    """Byte-level BPE, one token per byte, then the Qwen special tokens."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    assert len(alphabet) == NUM_BYTES, len(alphabet)
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in QWEN_SPECIAL_TOKENS]
    )
    ids = token_ids()
    for t, i in ids.items():
        got = tok.token_to_id(t)
        if got != i:
            raise RuntimeError(f"special token {t} got id {got}, expected {i}")
    return tok


def tokenizer_config(family: str = DEFAULT_FAMILY) -> dict:
    _check_family(family)
    vision = [
        "<|vision_start|>",
        "<|vision_end|>",
        "<|vision_pad|>",
        "<|image_pad|>",
        "<|video_pad|>",
    ]
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": 4096,
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        # Listed so they land in all_special_ids (bench_serving skips those).
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"] + vision,
        "extra_special_tokens": {},
        "clean_up_tokenization_spaces": False,
        "split_special_tokens": False,
        "add_prefix_space": False,
        "processor_class": PROCESSOR_CLASSES[family],
    }


def model_config(family: str = DEFAULT_FAMILY) -> dict:
    """config.json for the family's architecture with the tiny sizes."""
    if _check_family(family) == "qwen2_5_vl":
        from transformers import Qwen2_5_VLConfig

        return _model_config(
            Qwen2_5_VLConfig,
            family,
            TINY_QWEN2_5_VL_TEXT,
            TINY_QWEN2_5_VL_ROPE,
            TINY_QWEN2_5_VL_VISION,
        )
    from transformers import Qwen3VLConfig

    text = dict(TINY_TEXT)
    rope = dict(text.pop("rope_scaling"), rope_theta=text.pop("rope_theta"))
    return _model_config(Qwen3VLConfig, family, text, rope, TINY_VISION)


def _model_config(
    config_cls, family: str, text: dict, rope: dict, vision: dict
) -> dict:
    """``config_cls`` with the tiny ``text`` / ``vision`` sizes, the byte-level
    vocabulary and the Qwen special-token ids, as a config.json dict."""
    ids = token_ids()
    text = dict(
        text,
        vocab_size=VOCAB_SIZE,
        bos_token_id=ids["<|endoftext|>"],
        eos_token_id=ids["<|im_end|>"],
        rope_parameters=dict(rope),
        dtype="bfloat16",
    )
    config = config_cls(
        text_config=text,
        vision_config=dict(vision),
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=text["tie_word_embeddings"],
    )
    config.architectures = [ARCHITECTURES[family]]
    data = config.to_dict()
    data["eos_token_id"] = ids["<|im_end|>"]
    return data


def processor_configs(family: str = DEFAULT_FAMILY):
    """The family's (image, video) processor configs, sized for its tower."""
    if _check_family(family) == "qwen2_5_vl":
        common = _processor_common(TINY_QWEN2_5_VL_VISION, family)
        # Merge grid 28 pixels: 224x224 -> a 16x16 patch grid, 64 image tokens.
        size = {"shortest_edge": 28 * 28, "longest_edge": MAX_PIXELS}
        image = dict(
            common, image_processor_type="Qwen2VLImageProcessorFast", size=size
        )
        video = dict(
            common,
            video_processor_type="Qwen2VLVideoProcessor",
            size=dict(size),
            fps=2,
            min_frames=2,
            max_frames=8,
            do_sample_frames=False,
        )
        return image, video
    common = _processor_common(TINY_VISION, family)
    image = dict(
        common,
        image_processor_type="Qwen2VLImageProcessorFast",
        size={"shortest_edge": MIN_PIXELS, "longest_edge": MAX_PIXELS},
    )
    video = dict(
        common,
        video_processor_type="Qwen3VLVideoProcessor",
        size={"shortest_edge": MIN_PIXELS, "longest_edge": MAX_PIXELS * 4},
        fps=2,
        min_frames=2,
        max_frames=8,
        do_sample_frames=True,
    )
    return image, video


def _processor_common(vision: dict, family: str) -> dict:
    """What the image and video processors of a family share."""
    return {
        "patch_size": vision["patch_size"],
        "temporal_patch_size": vision["temporal_patch_size"],
        "merge_size": vision["spatial_merge_size"],
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "do_resize": True,
        "do_convert_rgb": True,
        "processor_class": PROCESSOR_CLASSES[family],
    }


def _write_json(path: str, data: dict) -> None:
    with open(path, "w") as f:
        json.dump(data, f, indent=2, sort_keys=True)
        f.write("\n")


def make_tiny_model(out: str, check: bool = True, family: str = DEFAULT_FAMILY) -> str:
    """Write the ``family``'s model directory ``out`` (created if missing); return it."""
    _check_family(family)
    os.makedirs(out, exist_ok=True)
    _write_json(os.path.join(out, "config.json"), model_config(family))
    build_tokenizer().save(os.path.join(out, "tokenizer.json"))
    _write_json(os.path.join(out, "tokenizer_config.json"), tokenizer_config(family))
    with open(os.path.join(out, "chat_template.jinja"), "w") as f:
        f.write(CHAT_TEMPLATE)
    image, video = processor_configs(family)
    _write_json(os.path.join(out, "preprocessor_config.json"), image)
    _write_json(os.path.join(out, "video_preprocessor_config.json"), video)
    _write_json(
        os.path.join(out, "generation_config.json"),
        {"eos_token_id": token_ids()["<|im_end|>"], "do_sample": False},
    )
    if check:
        check_model_dir(out, family)
    return out


def check_model_dir(path: str, family: str = DEFAULT_FAMILY) -> None:
    """Raise unless AutoProcessor loads ``path`` as the family's processor."""
    from transformers import AutoProcessor

    proc = AutoProcessor.from_pretrained(path)
    name = type(proc).__name__
    expected = PROCESSOR_CLASSES[_check_family(family)]
    if name != expected:
        raise RuntimeError(f"AutoProcessor loaded {name}, expected {expected}")
    ids = token_ids()
    if proc.image_token_id != ids["<|image_pad|>"]:
        raise RuntimeError(
            f"image token id {proc.image_token_id} != {ids['<|image_pad|>']}"
        )
    special = set(proc.tokenizer.all_special_ids)
    for tok in ("<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>"):
        if ids[tok] not in special:
            raise RuntimeError(f"{tok} is not a special token of the tokenizer")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="model directory to write")
    parser.add_argument(
        "--family",
        choices=FAMILIES,
        default=DEFAULT_FAMILY,
        help="model family to write (default: %(default)s)",
    )
    parser.add_argument(
        "--no-check", action="store_true", help="skip the AutoProcessor load check"
    )
    args = parser.parse_args(argv)
    if os.path.exists(args.out) and not os.path.isdir(args.out):
        print(
            f"make_tiny_model: --out {args.out} exists and is not a directory",
            file=sys.stderr,
        )
        return 2
    make_tiny_model(args.out, check=not args.no_check, family=args.family)
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
