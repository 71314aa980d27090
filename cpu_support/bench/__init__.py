"""Benchmark helpers: `vit_bench_util`, what the ViT benchmarks and the GPU
check share (standard library only at import)."""
