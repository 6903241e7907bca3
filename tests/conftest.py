import pathlib

import numpy as np
import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"
GOLDEN = SHARED / "golden"
ZOO = SHARED / "zoo"


def load_npz(path):
    with np.load(path, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


@pytest.fixture
def golden():
    if not GOLDEN.is_dir():
        pytest.fail("../shared/golden is missing: tests need the shared fixtures beside the checkout")
    return GOLDEN
