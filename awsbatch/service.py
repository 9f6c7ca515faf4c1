"""AWS Batch's own service model, as botocore ships it (botocore/data/batch/2016-08-10/
service-2.json): the operations the API answers, and every request checked against its input
shape (required members, types, enums, ranges) by botocore's own validator, so that what the
portal accepts is what AWS documents, not a guess."""

from __future__ import annotations

from functools import cache

import botocore.session
from botocore.model import OperationModel, ServiceModel
from botocore.validate import ParamValidator

from awsbatch.errors import AwsError, client_error

UNKNOWN_OPERATION = "{path}: no such operation of AWS Batch (rest-json, POST /v1/<operation>)."
NOT_SUPPORTED = "{operation}: AWS Batch has it, the portal does not (docs/aws.md says what it has)."


@cache
def service_model() -> ServiceModel:
    return botocore.session.get_session().get_service_model("batch")


@cache
def operations_by_path() -> dict[str, OperationModel]:
    """Each operation by its request path, `/v1/createquotashare`."""
    model = service_model()
    operations = (model.operation_model(name) for name in model.operation_names)
    return {op.http["requestUri"].lower(): op for op in operations}


def operation_for(path: str) -> OperationModel:
    operation = operations_by_path().get(path.lower().rstrip("/"))
    if operation is None:
        raise AwsError(UNKNOWN_OPERATION.format(path=path), code="UnknownOperationException",
                       status=404)  # fmt: skip
    return operation


def validate(operation: OperationModel, params: object) -> dict:
    """The request's parameters, checked against the operation's input shape; a ClientException
    naming every field that breaks a rule."""
    if not isinstance(params, dict):
        raise client_error("body: must be a JSON object.")
    report = ParamValidator().validate(params, operation.input_shape)
    if report.has_errors():
        raise client_error(f"{operation.name}: {report.generate_report()}")
    return params
