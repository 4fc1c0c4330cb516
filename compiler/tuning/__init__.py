"""Schedule search: the TVM paper's AutoTVM idea for gemforge's back ends.

A compile that picks a schedule knob itself (a CPU product's register tile and tile order, an
accelerator convolution's tiling) asks `choice` first (`dispatch`). `gemforge tune` records those
compiles as `Task`s, measures candidate configurations of each (`search`): on this machine for
the CPU, on the calibrated cycle model for the accelerator, chosen by a cost model fitted to the
measurements so far, and keeps the best in a tuning log (`log`). `gemforge compile --tuning-log`
compiles under `applied(records)`; a model keeps the CPU records it was compiled with, so a run
that compiles its host kernels again compiles the same schedules.
"""

from .dispatch import Task, TuningError, active, applied, choice, recording, target_identity

__all__ = ["Task", "TuningError", "active", "applied", "choice", "recording", "target_identity"]
