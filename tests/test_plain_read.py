"""tools/plain_read.py: the plain read that read_floor times and the GEMM ablation launches, under
Triton's CPU interpreter where there is no GPU."""
from __future__ import annotations

import os

import pytest
import torch

from tools import plain_read
from tools.plain_read import empty_launch, read, read_pair, xor_reference

pytestmark = pytest.mark.skipif(not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1",
                                reason="no GPU and Triton's interpreter is off")
DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _words(n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-2**31, 2**31 - 1, (n,), dtype=torch.int32, generator=g)


def test_each_program_xors_its_slice_the_ragged_last_one_masked():
    x = _words(2 * 256 * 4 + 77, 0)
    for block, loads in ((256, 4), (512, 1)):
        assert torch.equal(read(x.to(DEV), block, loads, 4).cpu(), xor_reference(x, block * loads))


def test_a_pair_is_read_as_two_reads_in_one_launch(monkeypatch):
    """a's programs first, then b's, each ragged at its own end; b given as bytes (a tile operand's codes)."""
    monkeypatch.setattr(plain_read, "BLOCK", 64)  # small programs: several of each, under the interpreter too
    monkeypatch.setattr(plain_read, "LOADS", 2)
    a, b = _words(3 * 128 + 5, 1), _words(2 * 128 + 100, 2)
    got = read_pair(a.to(DEV), b.view(torch.uint8).reshape(-1, 4).to(DEV)).cpu()
    assert torch.equal(got, torch.cat([xor_reference(a, 128), xor_reference(b, 128)]))


def test_bytes_that_are_not_whole_words_are_refused_by_shape_and_dtype():
    with pytest.raises(ValueError, match=r"shape \(7,\) and dtype torch.uint8 is not contiguous whole int32 words"):
        plain_read.words(torch.zeros(7, dtype=torch.uint8))
    with pytest.raises(ValueError, match="not contiguous"):
        plain_read.words(torch.zeros(8, 4, dtype=torch.int32).t())


def test_an_empty_launch_runs_and_writes_nothing():
    sink = plain_read._sink(torch.device(DEV))
    sink.fill_(7)
    empty_launch(torch.device(DEV))
    assert sink.item() == 7
