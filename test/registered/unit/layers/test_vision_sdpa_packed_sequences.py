"""VisionSdpaAttention with several sequences packed in one call.

The fork's patch "Attend packed vision sequences one by one in the SDPA
backend" replaces the dense [1, s, s] block-diagonal mask with one attention
call per group of equal-length sequences. What is checked here:

* numerics: the patched forward equals the former masked computation within
  fp32 rounding. The former computation is rebuilt here from scratch (a
  block-diagonal boolean mask over the concatenation, one SDPA call), not
  taken from SGLang and not mocked;
* per-sequence invariance: a sequence's rows do not depend on what else is
  packed with it (bitwise), at the layer (through the tiny Qwen3-VL tower:
  the patch's own test_vision_sdpa_per_image_attention.py);
* memory: a batch whose dense mask would need more than 1 GiB is attended
  with a measured peak far below that, in a fresh child process;
* the paths the patch must leave alone (cu_seqlens=None, flatten_batch=False,
  a cu_seqlens that does not cover the call) still give the masked result.
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=8, suite="stage-a-test-cpu")


HEADS = 4
HEAD_DIM = 16
REPO = os.path.dirname(
    os.path.dirname(
        os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    )
)


def _attn(flatten_batch=True, **kwargs):
    from sglang.srt.layers.attention.vision import VisionSdpaAttention

    return VisionSdpaAttention(
        head_dim=HEAD_DIM,
        num_heads=HEADS,
        num_kv_heads=HEADS,
        flatten_batch=flatten_batch,
        **kwargs,
    )


def _packed_qkv(lengths, seed, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    total = sum(lengths)
    q, k, v = (
        torch.randn(total, HEADS, HEAD_DIM, generator=gen).to(dtype) for _ in range(3)
    )
    cu = torch.tensor(
        [0] + list(torch.tensor(lengths).cumsum(0).tolist()), dtype=torch.int32
    )
    return q, k, v, cu


def _block_diagonal_mask(cu, total):
    """The mask the unpatched backend built: True inside each sequence's block."""
    mask = torch.zeros(1, total, total, dtype=torch.bool)
    bounds = cu.tolist()
    for start, end in zip(bounds[:-1], bounds[1:]):
        mask[:, start:end, start:end] = True
    return mask


def _masked_reference(q, k, v, mask, scale=None, single_precision_softmax=False):
    """One attention call over the whole concatenation under ``mask``."""
    total = q.shape[0]
    qh, kh, vh = (
        t.reshape(1, total, HEADS, HEAD_DIM).transpose(1, 2) for t in (q, k, v)
    )
    scale = scale if scale is not None else HEAD_DIM**-0.5
    if single_precision_softmax:
        weights = torch.matmul(qh, kh.transpose(-2, -1)) * scale
        weights = weights + (~mask) * torch.finfo(q.dtype).min
        weights = torch.softmax(weights, dim=-1, dtype=torch.float32).to(q.dtype)
        out = torch.matmul(weights, vh)
    else:
        out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, scale=scale)
    return out.transpose(1, 2).reshape(total, HEADS, HEAD_DIM)


PACKINGS = {
    "one-sequence": [196],
    "two-uneven": [64, 100],
    "several-sizes": [64, 100, 37, 256, 5],
    "many-equal": [49] * 16,
    "interleaved-equal": [50, 77, 50, 3, 77, 50],
    "tiny-and-large": [1, 2, 300, 1],
    "with-empty": [0, 30, 0, 30, 12],
    "equal-around-empty": [0, 40, 0, 40],
}


@pytest.mark.control(
    reason="the per-image attention's equivalence to the masked call (pristine is the masked call)"
)
@pytest.mark.parametrize("name", sorted(PACKINGS))
@pytest.mark.parametrize(
    "single_precision_softmax", [False, True], ids=["sdpa", "fp32-softmax"]
)
def test_matches_the_masked_call_within_fp32_rounding(name, single_precision_softmax):
    lengths = PACKINGS[name]
    q, k, v, cu = _packed_qkv(lengths, seed=len(name))
    attn = _attn(softmax_in_single_precision=single_precision_softmax)
    with torch.no_grad():
        out = attn(q, k, v, bsz=1, cu_seqlens=cu)
        ref = _masked_reference(
            q,
            k,
            v,
            _block_diagonal_mask(cu, q.shape[0]),
            single_precision_softmax=single_precision_softmax,
        )
    assert out.shape == (q.shape[0], HEADS, HEAD_DIM)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=2e-6)


# bf16 only with several sizes: equal-length bf16 sequences come out bitwise
# alone-equal under pristine's masked call too, so those cases could not fail.
@pytest.mark.parametrize(
    "name,dtype",
    [
        ("several-sizes", torch.float32),
        ("many-equal", torch.float32),
        ("interleaved-equal", torch.float32),
        ("several-sizes", torch.bfloat16),
    ],
    ids=[
        "several-sizes-fp32",
        "many-equal-fp32",
        "interleaved-equal-fp32",
        "several-sizes-bf16",
    ],
)
def test_each_sequence_is_bitwise_what_it_gives_alone(name, dtype):
    """Packing neighbours must not change a sequence's rows at all."""
    lengths = PACKINGS[name]
    q, k, v, cu = _packed_qkv(lengths, seed=7, dtype=dtype)
    attn = _attn()
    with torch.no_grad():
        packed = attn(q, k, v, bsz=1, cu_seqlens=cu)
        bounds = cu.tolist()
        for start, end in zip(bounds[:-1], bounds[1:]):
            alone_cu = torch.tensor([0, end - start], dtype=torch.int32)
            alone = attn(
                q[start:end], k[start:end], v[start:end], bsz=1, cu_seqlens=alone_cu
            )
            assert torch.equal(packed[start:end], alone), (name, start, end)


def test_one_sequence_is_the_plain_unmasked_call():
    """cu_seqlens [0, s] gives exactly what cu_seqlens=None gives."""
    q, k, v, cu = _packed_qkv([196], seed=3)
    attn = _attn()
    with torch.no_grad():
        assert torch.equal(attn(q, k, v, bsz=1, cu_seqlens=cu), attn(q, k, v, bsz=1))


@pytest.mark.control(reason="upstream behaviour the patch keeps: a call without rows")
def test_a_call_without_rows_gives_an_empty_output():
    q, k, v, _ = _packed_qkv([4], seed=5)
    q, k, v = q[:0], k[:0], v[:0]
    cu = torch.tensor([0, 0], dtype=torch.int32)
    with torch.no_grad():
        out = _attn()(q, k, v, bsz=1, cu_seqlens=cu)
    assert out.shape == (0, HEADS, HEAD_DIM)


@pytest.mark.control(
    reason="a path the patch leaves alone: cu_seqlens not covering the call stays masked"
)
def test_cu_seqlens_that_does_not_cover_the_call_keeps_the_masked_call():
    q, k, v, _ = _packed_qkv([40, 40], seed=4)
    cu = torch.tensor([0, 30, 60], dtype=torch.int32)  # rows 60..79 in no sequence
    with torch.no_grad():
        out = _attn()(q, k, v, bsz=1, cu_seqlens=cu)
        ref = _masked_reference(q, k, v, _block_diagonal_mask(cu, q.shape[0]))
    torch.testing.assert_close(out, ref, equal_nan=True, rtol=0, atol=0)


@pytest.mark.control(
    reason="a path the patch leaves alone: flatten_batch=False keeps its padding mask"
)
def test_flatten_batch_false_keeps_its_padding_mask():
    """Without flatten_batch, cu_seqlens gives per-row valid lengths of a padded batch."""
    bsz, s, valid = 3, 24, [24, 10, 17]
    gen = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(bsz * s, HEADS, HEAD_DIM, generator=gen) for _ in range(3))
    cu = torch.tensor([0, 24, 34, 51], dtype=torch.int32)
    with torch.no_grad():
        out = _attn(flatten_batch=False)(q, k, v, bsz=bsz, cu_seqlens=cu)
    out = out.reshape(bsz, s, HEADS, HEAD_DIM)
    for b, n in enumerate(valid):
        rows = slice(b * s, b * s + n)
        qh, kh, vh = (t[rows].transpose(0, 1) for t in (q, k, v))
        ref = F.scaled_dot_product_attention(qh, kh, vh).transpose(0, 1)
        torch.testing.assert_close(out[b, :n], ref, rtol=1e-5, atol=2e-6)


# ---------------------------------------------------------------------------
# Memory: a batch whose dense mask would exceed 1 GiB
# ---------------------------------------------------------------------------

MEMORY_CHILD = textwrap.dedent(
    """
    import json, os, sys
    sys.path.insert(0, sys.argv[1])
    from cpu_support.standins.prepare import prepare_cpu_process
    prepare_cpu_process()
    import torch
    torch.set_num_threads(1)
    from sglang.srt.layers.attention.vision import VisionSdpaAttention

    n_seq, length, heads, head_dim = 33, 1024, 2, 16
    total = n_seq * length
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(total, heads, head_dim, generator=gen) for _ in range(3))
    cu = torch.arange(0, total + 1, length, dtype=torch.int32)
    attn = VisionSdpaAttention(head_dim=head_dim, num_heads=heads, num_kv_heads=heads,
                               flatten_batch=True)

    def rss_now():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def peak_now():
        with open("/proc/self/status") as f:
            line = next(x for x in f if x.startswith("VmHWM:"))
        return int(line.split()[1]) * 1024

    # Reset the peak (VmHWM) so that only the call's own peak counts, not one
    # left by the imports before it.
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before = rss_now()
    with torch.no_grad():
        out = attn(q, k, v, bsz=1, cu_seqlens=cu)
    peak = peak_now()
    print(json.dumps(dict(
        dense_mask_bytes=total * total,
        rss_before=before,
        peak=peak,
        shape=list(out.shape),
        finite=bool(torch.isfinite(out).all()),
    )))
    """
)


def test_batch_with_a_dense_mask_over_1gib_runs_without_allocating_it():
    proc = subprocess.run(
        [sys.executable, "-c", MEMORY_CHILD, REPO],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["dense_mask_bytes"] > 1 << 30
    assert report["shape"] == [33 * 1024, 2, 16] and report["finite"]
    grown = report["peak"] - report["rss_before"]
    # q/k/v/out are 4 MiB each; per-group work is tens of MiB. A dense bool
    # mask alone would add > 1 GiB (and SDPA's float copy of it 4x that).
    assert grown < 256 << 20, f"peak grew by {grown / 2**20:.0f} MiB during the call"
