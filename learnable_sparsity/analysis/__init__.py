"""Attention-head analyses of the adaptively sparse Transformer: density, head diversity
(generalized Jensen–Shannon), head roles, α trajectories, and their figures."""
