"""No predictions: the default. Schedulers that need them (``scheduler=sjf``) refuse it at start-up."""

from servelab.plugin_api import LengthPredictor


class NoLengthPredictor(LengthPredictor):
    """Predicts nothing: :meth:`Scheduler.predicted_output_len` returns None."""

    name = "none"
    predicts = False

    def predict(self, request):
        raise NotImplementedError("length_predictor=none makes no predictions")
