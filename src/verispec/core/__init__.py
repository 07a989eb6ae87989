"""The bottom floor: pure math of sampling and verification, no models.

``sampling`` (SamplingConfig and the processors that turn logits into the distributions p and q actually sampled),
``rules`` (verification rules as data: acceptance probability h + correction distribution r, one registry),
``verify`` (the samplers that apply a rule to a chain or a tree) and ``schedule`` (the cost model that chooses the
draft length). Nothing here imports anything above it.
"""
