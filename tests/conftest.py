import pathlib

import numpy as np
import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures"      # the tests' data: tests/fixtures/README.md says where each came from
GOLDEN = FIXTURES / "golden"
ZOO = FIXTURES / "zoo"


def load_npz(path):
    with np.load(path, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


@pytest.fixture
def golden():
    if not GOLDEN.is_dir():
        pytest.fail("tests/fixtures/golden is missing: the checkout is incomplete")
    return GOLDEN
