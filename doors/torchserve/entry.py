"""TorchServe entry point of every task (packaged into an archive by ``torch-model-archiver``): the task is the
archive's ``handler.task`` (``model-config.yaml``), so a new task needs no entry file of its own.

TorchServe instantiates the one class defined in this file; the logic lives in :mod:`doors.torchserve.handler`.
"""

from doors.torchserve.handler import ExplanationHandler


class TaskExplanationHandler(ExplanationHandler):
    """Serves the task the archive's ``handler.task`` names (:func:`serving_core.task.get_task`)."""
