"""The qwen3_5_text dense model as plain tensors and functions (no nn.Module, no autograd).

One file per concept: `config` (typed config), `norm`, `rope`, `mlp`, `attention` (gated full
attention over a paged KV cache), `gated_deltanet` (the linear-attention mixer and its delta rule),
`qwen3_5` (the decoder stack). Weights are built by `engine.model.build` from a loaded Checkpoint;
transformers' `Qwen3_5ForCausalLM` is the reference definition these files match.
"""
