"""Ablation: what a decode step takes when one of its parts costs nothing, or only its bytes.

`python -m tools.attribution` books each kernel the time from the kernel before it ending to its own end (under
PDL a kernel starts while its predecessor drains, and only waits): its link in the chain, the
dependency's release as well as its work. That is not what removing the part would save: the next
kernel has a release to wait for either way, and its early weight loads overlap differently (the
64-layer step's `norm` books 0.61 ms over 129 launches, ~4.7 us each, for well under a microsecond of
work each). An ablation measures the saving directly: `python -m tools.ablation --ablate PARTS`
builds the engine with the named parts replaced, through the Engine's timing hook (`substitute`,
engine/model/build.SUBSTITUTABLE), and times the step as `engine bench` does (its record and table).
Parts, joined by "+":

- `norm`: the residual add + RMSNorm launches (rms_norm, add_rms_norm) return their input;
- `delta_rule`: Gated DeltaNet's decode step (conv_step, delta_step);
- `attention`: the attention layers' prep (norms, RoPE, K/V write) and paged decode attention;
- `tower`: every tower GEMM; `lm_head`: the head's.

Each part may name a mode, `part:mode`: `free` (the default) launches nothing in the part's place;
`empty` launches one kernel that does nothing (tools/plain_read.empty_launch, PDL like the rest) per
launch it replaces, so `empty - free` is what the launches cost as links of the chain and `base -
empty` what their work costs; `read` (GEMM parts only) launches a plain read of the operand's bytes
(tools/plain_read.read_pair): the step as if every GEMM read its weights at plain-read speed once
its input is ready, and did nothing else (tools/ablation/gemm.py).

What a part would have written is left unwritten (torch.empty, no kernel), so the values that flow
on are garbage: an ablated engine computes wrong tokens. Its timings are the point; a decode step's
work does not depend on the values (greedy picks; no stop token ends a bench's run). Its record says
`"ablated": "<parts>"`, and a grid refuses such a record (grids/runner.parse_bench); the orchestrator
never builds one (the hook is a constructor argument only this tool passes). The ablations replace
the fused decode kernels and the fp4 GEMM, so they need CUDA's path: a part the backend does not run
that way is refused, and so is a part whose launches never ran (e.g. `lm_head` on the dequant arm),
rather than silently timed as the real engine.
"""
