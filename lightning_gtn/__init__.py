"""lightning_gtn: differentiable WFST losses on dense emissions, for Lightning and Hydra.

Layers, each importing only those before it: ``wfst`` (the GTN-compatible engine),
``functional`` (batched losses), ``nn`` (modules), ``lightning`` (the mixin, metrics,
data), ``train`` (the Hydra entry point).
"""

__version__ = "0.1.0"
