"""Paged-cache bookkeeping: sequences, the block manager, the scheduler. Pure Python, no torch."""
