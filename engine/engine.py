"""The `Engine` API: load an NVFP4 checkpoint for one backend and one lm_head arm, then generate
greedily over the paged caches.

    eng = Engine(model_dir, backend="cpu", lm_head="packed")
    eng.generate([[1, 2, 3]], max_new_tokens=8)  # -> [[...8 token ids...]]
    eng.last_topk[0][j]  # TopK(logits, ids) at generated position j, for margin checks

The engine knows nothing about tokenization: prompts and outputs are token ids.
"""
from __future__ import annotations

import time
from contextlib import ExitStack
from pathlib import Path
from typing import NamedTuple

import torch

from engine import residency as _residency
from engine.backends import compute_dtype, device_for
from engine.errors import CapacityError
from engine.kv_cache import KvCache, StateCache
from engine.linear import HEAD_ARMS
from engine.memory import memory_snapshot
from engine.model.build import build_model, prepare_model
from engine.model_runner import DecodeStep, ModelRunner
from engine.options import EngineOptions
from engine.paged.block_manager import BlockManager, blocks_for
from engine.paged.scheduler import Scheduler
from engine.paged.sequence import PENDING, Sequence
from engine.scopes import DECODE, marker, scope


class _Launched(NamedTuple):
    seqs: list[Sequence]
    at: list[int]  # where each sequence's token goes in its token_ids
    step: DecodeStep


class TopK(NamedTuple):
    logits: list[float]
    ids: list[int]


class Engine:
    def __init__(self, model_dir: str | Path, backend: str = "cpu", lm_head: str = "packed", *,
                 max_num_seqs: int = 16, block_size: int = 16, max_model_len: int | None = None,
                 num_blocks: int | None = None, max_num_batched_tokens: int | None = None, top_k: int = 5,
                 cuda_graphs: bool | None = None, block_order: list[int] | None = None,
                 options: EngineOptions | None = None, substitute=None):
        """`options`: every switch of the engine and its kernels (engine/options.py; None: the defaults).
        `substitute`: the timing tools' hook (tools/ablation): called as substitute(part, real) for
        each of build.SUBSTITUTABLE (the tower's and the head's fp4 GEMM, the fused decode kernels), it
        returns what the model calls in its place. Such an engine computes wrong tokens; its
        `substituted` (str(substitute)) says so in every record that times it; None: the real engine."""
        from engine.loader import load_checkpoint  # the checkpoint loader owns every input check

        if lm_head not in HEAD_ARMS:
            raise ValueError(f"lm_head {lm_head!r}: expected one of {HEAD_ARMS}")
        self.options = options if options is not None else EngineOptions()
        self.substituted = None if substitute is None else str(substitute)
        self.backend, self.lm_head_arm, self.top_k = backend, lm_head, top_k
        self.device = device_for(backend)
        ckpt = load_checkpoint(Path(model_dir), w4a4=self.options.nvfp4_w4a4)
        self.naming, self.head_kind = ckpt.naming, ckpt.head_kind
        self.model = build_model(ckpt, backend, lm_head, self.options, substitute)
        self.config = ckpt.config
        del ckpt  # the model holds what it needs; the rest may go
        self.memory = {"after_load": memory_snapshot(self.device)}
        prepare_model(self.model, self.options)
        self.memory["after_prepare"] = memory_snapshot(self.device)
        cfg = self.model.config
        self.max_num_seqs = max_num_seqs
        self.max_model_len = max_model_len or min(cfg.max_position_embeddings, 4096)
        self.block_size = block_size
        self.num_blocks = num_blocks or max_num_seqs * blocks_for(self.max_model_len, block_size)
        self.max_num_batched_tokens = max_num_batched_tokens or max(self.max_model_len, 2048)
        self._block_order = block_order
        # W4A4's emulated activation quantization uploads a table per call: it cannot be recorded.
        w4a4 = any(getattr(lin, "w4a4", False) for lin in _residency.iter_linears(self.model))
        self._cuda_graphs = (backend == "cuda" and not w4a4) if cuda_graphs is None else cuda_graphs
        self._runner: ModelRunner | None = None
        self.last_topk: list[list[TopK]] = []

    def census(self) -> dict:
        return _residency.census(self.model)

    def residency(self) -> dict:
        return _residency.residency(self.model)

    @torch.inference_mode()
    def runner(self) -> ModelRunner:
        """The caches and (on CUDA) the decode graphs, allocated on first use (in inference mode,
        like every step that later writes them)."""
        if self._runner is None:
            cfg, dtype = self.model.config, compute_dtype(self.backend)
            bm = BlockManager(self.num_blocks, self.block_size, self.max_num_seqs, self._block_order)
            kv = KvCache(cfg, self.num_blocks, self.block_size, dtype, self.device)
            state = StateCache(cfg, self.max_num_seqs, dtype, self.device, self.options.state_dtype)
            self._runner = ModelRunner(self.model, bm, kv, state, self.device, self.max_num_seqs,
                                       self.max_model_len, self._cuda_graphs, self.top_k, self.options)
        return self._runner

    def _check_prompts(self, prompts: list[list[int]]) -> None:
        vocab = self.model.config.vocab_size
        for i, p in enumerate(prompts):
            bad = [t for t in p if not isinstance(t, int) or not 0 <= t < vocab]
            if not p or bad:
                raise ValueError(f"prompt {i}: expected a non-empty list of token ids in [0, {vocab}), "
                                 f"found {'an empty prompt' if not p else bad[:5]}")

    @torch.inference_mode()
    def generate(self, prompts: list[list[int]], max_new_tokens: int, stats: dict | None = None, *,
                 ahead: bool = True) -> list[list[int]]:
        """Greedy continuations, one list of `max_new_tokens` ids per prompt, in prompt order.
        `stats`, when given, receives prefill/decode seconds and step counts (device-synchronized).
        `ahead=False` reads each decode step back before the next is scheduled: the reference twin of
        decoding ahead (below), for tests; the engine never runs it."""
        self._check_prompts(prompts)
        runner = self.runner()
        scheduler = Scheduler(runner.bm, self.max_num_seqs, self.max_num_batched_tokens)
        seqs = [Sequence(i, p, max_new_tokens) for i, p in enumerate(prompts)]
        for s in seqs:
            if s.max_len > self.max_model_len:  # decode block tables are max_model_len wide
                raise CapacityError(f"sequence {s.seq_id}: {s.num_prompt_tokens} prompt + {max_new_tokens} new "
                                    f"tokens exceed max_model_len={self.max_model_len}")
            scheduler.add(s)
        topk: dict[int, list[TopK]] = {s.seq_id: [] for s in seqs}
        timing = {"prefill_s": 0.0, "decode_s": 0.0, "prefill_steps": 0, "decode_steps": 0, "decode_tokens": 0}
        # Decode one step ahead of the reads: the host schedules and launches step n + 1 before it waits
        # for step n's tokens, so its own work overlaps the device's. Reading each step back first (the
        # option decode_ahead=0 until 2026-12-07) made a 64-layer 27b step 1.026x slower at batch 1
        # (grid, direction established, H200; docs/lab/2026-12-07-h200-d-session.md).
        inflight: _Launched | None = None  # a decode step launched and not read back yet
        t_decode = None  # start of the current run of decode steps (timed as one, they overlap the host)
        decode_run = ExitStack()  # its scopes.DECODE range, recorded only while attribution is on
        while not scheduler.is_finished():
            batch, is_prefill = scheduler.schedule()
            if is_prefill:  # a prefill reads every token: the step in flight is read first
                self._read(inflight, topk)
                inflight = None
                if t_decode is not None:
                    timing["decode_s"] += self._now() - t_decode
                    t_decode = None
                    decode_run.close()
                t0 = self._now()
                tokens = self._greedy(batch, runner.prefill(batch), topk)
                timing["prefill_s"] += self._now() - t0
                timing["prefill_steps"] += 1
                scheduler.postprocess(batch, tokens)
                continue
            if t_decode is None:
                t_decode = self._now()
                decode_run.enter_context(marker(DECODE))
            launched = _Launched(batch, [len(s) for s in batch], runner.launch(batch))
            timing["decode_steps"] += 1
            timing["decode_tokens"] += len(batch)
            scheduler.postprocess(batch, [PENDING] * len(batch))  # lengths and finishes need no values
            self._read(inflight, topk)  # the previous step, while this one runs
            inflight = launched
            if not ahead:
                self._read(launched, topk)
                inflight = None
        self._read(inflight, topk)
        if t_decode is not None:
            timing["decode_s"] += self._now() - t_decode
            decode_run.close()
        self.last_topk = [topk[s.seq_id] for s in seqs]
        if stats is not None:
            stats.update(timing)
        return [s.completion for s in seqs]

    @staticmethod
    def _read(launched: "_Launched | None", topk: dict) -> None:
        """Wait for a launched decode step and put its tokens in place of its PENDING ones."""
        if launched is None:
            return
        tokens, vals, ids = launched.step.read()
        for s, at, tok, v, i in zip(launched.seqs, launched.at, tokens, vals, ids, strict=True):
            s.token_ids[at] = tok
            topk[s.seq_id].append(TopK(v, i))

    def _greedy(self, batch: list[Sequence], logits: torch.Tensor, topk: dict) -> list[int]:
        with scope("sample"):
            vals, ids = logits.topk(min(self.top_k, logits.shape[-1]), dim=-1)  # sorted; equal values in torch's order
            tokens = logits.argmax(dim=-1).tolist()
            for s, v, i in zip(batch, vals.tolist(), ids.tolist()):
                topk[s.seq_id].append(TopK(v, i))
        return tokens

    def _now(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter()

    @torch.inference_mode()
    def score(self, prompt: list[int]) -> torch.Tensor:
        """Logits [T, V] at every prompt position through the paged prefill path (cache then freed)."""
        self._check_prompts([prompt])
        runner = self.runner()
        seq = Sequence(-1, prompt, 1)
        if not runner.bm.can_allocate(seq):
            raise RuntimeError(f"score: a {len(prompt)}-token prompt does not fit the free cache")
        runner.bm.allocate(seq)
        try:
            return runner.prefill([seq], all_logits=True)
        finally:
            runner.bm.deallocate(seq)
