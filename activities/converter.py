"""The data converter every Cairn client and worker uses: pydantic JSON, with typed input errors.

Temporal decodes a workflow's input before the workflow runs. With the SDK's pydantic
converter a typo in that input (``checkpoint.evry`` from ``temporal workflow start
--input-file`` or the Web UI's form) raises pydantic's ``ValidationError``, which fails the
*workflow task*: Temporal retries the task forever and the run hangs in RUNNING. Here the
same error becomes a non-retryable ``ApplicationError`` of type ``ConfigError`` carrying the
one-line message ``cairn run start`` prints, and the SDK fails the *workflow* at once (a
``FailureError`` raised while decoding fails the execution, not the task). Activity inputs
get the same treatment: a malformed input fails the activity without retries. (A signal
whose argument does not decode is dropped by the SDK, as before.)
"""

from __future__ import annotations

from typing import Any

import temporalio.api.common.v1
from pydantic import ValidationError
from temporalio.contrib.pydantic import PydanticJSONPlainPayloadConverter, PydanticPayloadConverter
from temporalio.converter import DataConverter, DefaultPayloadConverter, JSONPlainPayloadConverter
from temporalio.exceptions import ApplicationError

from cairn.config import config_error_from

__all__ = ["DATA_CONVERTER", "CairnPayloadConverter", "input_error"]


def input_error(exc: ValidationError, type_hint: Any) -> ApplicationError:
    """The non-retryable Temporal error for a payload that does not validate as ``type_hint``."""
    name = getattr(type_hint, "__name__", None) or str(type_hint)
    error = config_error_from(exc, f"input ({name})", type_hint)
    return ApplicationError(str(error), type=error.type_name, non_retryable=True)


class _ValidatingJSONConverter(PydanticJSONPlainPayloadConverter):
    def from_payload(self, payload: temporalio.api.common.v1.Payload, type_hint: type | None = None) -> Any:
        try:
            return super().from_payload(payload, type_hint)
        except ValidationError as exc:
            raise input_error(exc, type_hint) from None


class CairnPayloadConverter(PydanticPayloadConverter):
    """The SDK's pydantic payload converter whose JSON decoding raises typed input errors."""

    def __init__(self) -> None:  # noqa: D107 - nullary, as DataConverter requires
        json_converter = _ValidatingJSONConverter()
        converters = [
            json_converter if isinstance(c, JSONPlainPayloadConverter) else c
            for c in DefaultPayloadConverter.default_encoding_payload_converters
        ]
        # Skip PydanticPayloadConverter.__init__: build the composite with our JSON converter.
        super(PydanticPayloadConverter, self).__init__(*converters)


DATA_CONVERTER = DataConverter(payload_converter_class=CairnPayloadConverter)
"""Use for every ``Client.connect``, the worker and the replayer."""
