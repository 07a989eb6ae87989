"""Shared test setup: one intra-op thread (tiny models are dominated by thread start-up on 2 cores)."""

import torch

torch.set_num_threads(1)
