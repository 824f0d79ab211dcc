"""``lightning_gtn.lightning``: the Lightning layer (layer 4).

- :class:`StructuredLossMixin`: loss, Viterbi decoding, CER/WER and optimizers for your
  LightningModule whose ``forward`` returns emissions ``(B, T, C)`` and lengths.
- :class:`SequenceModule`: the mixin plus a network from a config (what the CLI trains).
- :class:`Vocabulary`: characters to ids with the blank / repeat conventions of each loss.
- :func:`build_loss`: a :mod:`lightning_gtn.nn` loss and its vocabulary from a name, config or module.
- Data: :class:`DigitLinesDataModule` (embedded, no download), :class:`TextLinesDataModule`
  (embedded: English sentences rendered with matplotlib's fonts), :class:`FeatureDataModule`
  (your own ``.npz`` features and transcripts), :class:`LhotseDataModule` (speech: Lhotse
  manifests, duration bucketing, on-the-fly filterbanks), :class:`HFDataModule` (speech: a HF
  ``datasets`` dataset on disk); :func:`cuts_from_folder` / :func:`cuts_from_hf` build the cuts;
  :class:`SpokenTaskDataModule` (embedded speech: the text task's sentences spoken by eSpeak NG,
  written as Lhotse manifests).
- :class:`ConvEncoder`: an all-convolutional (depthwise separable, residual) emission model.
- :class:`ConvRNNEncoder`: a small convolution + bidirectional GRU/LSTM emission model.
- :class:`ConvTransduceEncoder`: that encoder's letter scores through a WFST convolution
  (:class:`lightning_gtn.nn.ConvTransduce1D`) over a lexicon.
- :class:`TransducerModel`: that encoder + a prediction network (stateless or LSTM) + a joiner,
  for the RNN-T losses (the protocol of :mod:`lightning_gtn.nn.rnnt`).
- :class:`TrainingPlots`: ``curves.png`` and ``alignments.png`` in the run directory.
"""

from .callbacks import FinalLastCheckpoint, SpawnedProcessGroupCleanup, TrainingPlots, class_labels
from .data import (
    DigitLinesDataModule,
    FeatureDataModule,
    SequenceDataset,
    collate_sequences,
    make_digit_lines,
    read_transcripts,
)
from .lhotse_data import LhotseDataModule, check_cut, read_cuts
from .loss_builder import BUILTIN_LOSSES, TargetGraphLoss, build_loss
from .mixin import NonFiniteLossError, StructuredLossMixin
from .models import ConvEncoder, ConvRNNEncoder, ConvTransduceEncoder
from .module import SequenceModule
from .plots import plot_alignments, plot_training_curves
from .speech_sources import HFDataModule, cuts_from_folder, cuts_from_hf
from .spoken import SpokenTaskDataModule, list_voices, make_spoken_task, synthesise
from .text import TEXT_CHARS, TextLinesDataModule, make_sentences, make_text_lines, save_text_lines_png
from .transducer import TransducerModel
from .vocabulary import Vocabulary

__all__ = [
    "StructuredLossMixin",
    "NonFiniteLossError",
    "SequenceModule",
    "Vocabulary",
    "build_loss",
    "TargetGraphLoss",
    "BUILTIN_LOSSES",
    "DigitLinesDataModule",
    "FeatureDataModule",
    "LhotseDataModule",
    "HFDataModule",
    "cuts_from_folder",
    "cuts_from_hf",
    "read_cuts",
    "check_cut",
    "SpokenTaskDataModule",
    "synthesise",
    "list_voices",
    "make_spoken_task",
    "TextLinesDataModule",
    "TEXT_CHARS",
    "make_sentences",
    "make_text_lines",
    "save_text_lines_png",
    "SequenceDataset",
    "collate_sequences",
    "make_digit_lines",
    "read_transcripts",
    "ConvEncoder",
    "ConvRNNEncoder",
    "ConvTransduceEncoder",
    "TransducerModel",
    "TrainingPlots",
    "SpawnedProcessGroupCleanup",
    "FinalLastCheckpoint",
    "class_labels",
    "plot_training_curves",
    "plot_alignments",
]
