"""One module per criterion: ``ctc``, ``asg``, ``seq``, ``stc``, ``transducer``, ``graph``
(user graphs) and ``conv_transduce`` (the WFST convolution). The transducer's graphs and its
numerators have modules of their own (``transducer_graphs``, ``transducer_numerators``).

Each module declares its :class:`~lightning_gtn.core.criterion.Criterion` and its public
function; import them from :mod:`lightning_gtn.functional`, the public surface.
"""
