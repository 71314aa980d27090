"""SGLang's multimodal code on N gloo ranks, one process each.

* `gloo`: ``run_on_ranks`` runs a function on N gloo ranks forked from a
  preloaded forkserver, and fails fast if one dies; ``free_port``.
* `rank_preload`: what that forkserver imports once (torch, SGLang's
  multimodal path, the harness).
* `mm_harness`: requests through the real ``_get_chunked_prefill_embedding``,
  the tower's real calls observed with a forward pre-hook, encoder-call spy,
  platform table, log capture, the post-load hook and Dynamo's frame count.
"""
