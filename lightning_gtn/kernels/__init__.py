"""The scoring kernels: what is computed, and where.

Each module is named by what it computes and on what: ``graph_numba`` / ``graph_torch`` /
``graph_triton`` run the forward-backward programme over batched criterion graphs (CPU numba, any
device with torch, CUDA with Triton); ``dense_numba`` / ``dense_torch`` score fully connected
normalisers (ASG's, the transducer's bigram) as recursions; ``transducer_hubs`` scores transducer
numerators through their hubs; ``stc_chain`` scores STC's chain; ``viterbi_paths`` is Viterbi with
back pointers (forced alignment), ``star_paths`` the same for the star alignment graphs without
graphs; ``beam_search_numba`` is the lexicon and LM beam search over
frame scores; ``compiled_graphs`` holds the flat arrays of compiled graphs that the graph kernels
read.

Kernels know nothing of losses: they take arrays and tensors and return tensors. The indices
they read are range-checked by their Python entry points or by the callers in
:mod:`lightning_gtn.core`.
"""
