"""Fixtures shared by the multimodal unit tests."""

import pytest


@pytest.fixture(scope="session")
def decision_tables():
    """Both decisions (the ViT batching gate and the vision warm-up) for every
    platform x flag x attention-TP x encoder row, from one spawned process
    (``mm_harness.decision_tables``)."""
    from cpu_support.ranks import mm_harness as H
    from cpu_support.ranks.gloo import run_on_ranks

    return run_on_ranks(H.decision_tables, 1, timeout=300)[0]
