"""Shared setup for the gate suites.

The suites run tiny models: one intra-op thread is faster than many on a shared box (with a loaded
2-core machine, torch's thread pool made a 4-prompt generate 30x slower), and it keeps the run's
floating-point reduction order independent of the machine's core count.
"""
import torch

torch.set_num_threads(1)
