"""Test-session settings shared by every test module."""

import torch

# The unit tests use small tensors, for which intra-op threads cost more than they save (and CI
# has 2 cores shared with other processes).
torch.set_num_threads(1)
