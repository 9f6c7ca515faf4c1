"""AWS Batch's own service model, as botocore ships it (botocore/data/batch/2016-08-10/
service-2.json): the operations the API answers, and every request checked against its input
shape (required members, types, enums, ranges) by botocore's own validator and, for what it
leaves out (enums, maximums), by `_check_bounds`, so that what the portal accepts is what AWS
documents, not a guess."""

from __future__ import annotations

from functools import cache

import botocore.session
from botocore.model import OperationModel, ServiceModel, Shape
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
    broken: list[str] = []
    _check_bounds(operation.input_shape, params, "", broken)
    if broken:
        raise client_error(f"{operation.name}: " + " ".join(broken))
    return params


def _check_bounds(shape: Shape, value: object, path: str, broken: list[str]) -> None:
    """What botocore's validator leaves out of the model's rules (it checks types, required
    members and minimums): enums, maximum lengths, sizes and values; and no NUL character in a
    string (PostgreSQL cannot store one). Appends a sentence naming the field for each."""
    rules = shape.metadata
    if shape.type_name == "structure" and isinstance(value, dict):
        for name, member in shape.members.items():
            if name in value:
                _check_bounds(member, value[name], f"{path}.{name}" if path else name, broken)
    elif shape.type_name == "list" and isinstance(value, list):
        if "max" in rules and len(value) > rules["max"]:
            broken.append(f"{path}: at most {rules['max']} items.")
        for i, item in enumerate(value):
            _check_bounds(shape.member, item, f"{path}[{i}]", broken)
    elif shape.type_name == "map" and isinstance(value, dict):
        if "max" in rules and len(value) > rules["max"]:
            broken.append(f"{path}: at most {rules['max']} entries.")
        for key, item in value.items():
            _check_bounds(shape.key, key, f"{path} key {key[:40]!r}", broken)
            _check_bounds(shape.value, item, f"{path}[{key[:40]!r}]", broken)
    elif shape.type_name == "string" and isinstance(value, str):
        if shape.enum and value not in shape.enum:
            broken.append(f"{path}: one of {', '.join(shape.enum)}, not {value[:40]!r}.")
        elif "max" in rules and len(value) > rules["max"]:
            broken.append(f"{path}: at most {rules['max']} characters.")
        if "\x00" in value:
            broken.append(f"{path}: no NUL character.")
    elif shape.type_name in ("integer", "long") and isinstance(value, int):
        highest = rules.get("max")
        if highest is not None and value > highest:
            broken.append(f"{path}: at most {highest}.")
