import inspect

import pytest

import edgesdk
from edgesdk import errors


def _error_classes():
    return [obj for _, obj in inspect.getmembers(errors, inspect.isclass) if issubclass(obj, Exception)]


def test_every_error_derives_from_the_root_and_has_a_distinct_exit_code():
    classes = _error_classes()
    assert errors.EdgeSDKError in classes
    codes = {}
    for cls in classes:
        assert issubclass(cls, errors.EdgeSDKError), cls
        codes.setdefault(cls.exit_code, []).append(cls.__name__)
    assert all(len(names) == 1 for names in codes.values()), codes
    assert all(code != 0 for code in codes)


def test_the_tree_is_drawn_in_the_module_docstring():
    for cls in _error_classes():
        assert cls.__name__ in errors.__doc__, f"{cls.__name__} missing from the docstring tree"


def test_input_error_is_also_a_value_error():
    with pytest.raises(ValueError):
        raise errors.InputError("bad")


def test_public_api_is_exactly_the_documented_names():
    assert set(edgesdk.__all__) == {
        "__version__", "Runtime", "RuntimeInfo", "TensorSpec", "StatsSnapshot", "DeviceProfile", "CoreCluster",
        "PowerMode", "Accelerator", "RuntimeMode", "load_profile", "list_profiles", "detect_device", "CorePlan",
        "plan_cores", "EdgeSDKError", "ProfileError", "ModelFormatError", "BackendError", "InputError",
        "ScheduleError", "BudgetError", "SignatureError", "TransferError", "OffloadError", "ConversionError",
        "UnsupportedOpError", "DataError", "BundleError", "HealthCheckError", "RolloutError", "RolloutTimeoutError",
        "NotFoundError", "ConflictError", "BrokerError", "ManagedRuntime", "OverloadedError", "OffloadPolicy",
        "StorageError", "EmulatorError", "SensorError", "InfeasibleBudgetError", "TrustError", "ReleaseCheckError",
        "BoardRuntimeError", "RolloutInconclusiveError", "DeadlineExceededError",
    }
    for name in edgesdk.__all__:
        assert getattr(edgesdk, name) is not None


def test_unknown_attribute_raises_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        edgesdk.Nope  # noqa: B018


def test_every_error_class_is_exported_from_the_package():
    import edgesdk
    from edgesdk import errors

    assert set(errors.__all__) <= set(edgesdk.__all__)
    assert all(getattr(edgesdk, name) is getattr(errors, name) for name in errors.__all__)
