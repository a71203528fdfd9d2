import os

import pytest
import torch
from hypothesis import HealthCheck, settings

# "ci" keeps the CPU run short; "device" is the >= 1,000-example sweep run on the H200.
settings.register_profile(
    "ci", max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "device", max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("VGA_LINEAR_HYPOTHESIS_PROFILE", "ci"))


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


DEVICES = [
    "cpu",
    pytest.param("cuda", marks=pytest.mark.cuda),
]
