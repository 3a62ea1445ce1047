"""Errors the runtime raises at its edges. The server maps them to OpenAI-shaped responses."""


class InvalidRequestError(ValueError):
    """A request the engine refuses (bad parameters, prompt too long, ...). Never stops the engine loop."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


class ModelLoadError(RuntimeError):
    """The model directory cannot be served: missing/corrupt weights, no tokenizer, bad config."""


class UnsupportedModelError(ModelLoadError):
    """The architecture (or a feature such as a quantization) is not implemented by this runtime."""
