"""What every loss shares: the criterion base and its custom ops, plans, graphs, checks.

``criterion`` holds :class:`~lightning_gtn.core.criterion.Criterion` (a loss declares how targets
become a plan), the loss prologue and the ``torch.library`` custom ops; ``scoring`` turns a plan
into losses and gradients; ``dispatch`` is the dynamic-programme driver that picks a kernel;
``criterion_graphs`` builds and caches criterion graphs; ``normalisers`` scores the dense
normalisers (fully connected, unigram) that ASG and the transducer share; ``checks`` validates
arguments; ``best_path`` is the max-semiring search; ``gtn_backend`` runs losses on the real
``gtn`` package; ``cache`` holds the LRU and the handle registry.

Nothing here imports :mod:`lightning_gtn.losses` or anything above it.
"""
