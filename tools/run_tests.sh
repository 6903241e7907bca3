#!/usr/bin/env bash
# Set up and run the test suite on a fresh machine (Python 3.10+, gcc, the package registries).
# The README's test command, and what .ci/run calls. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ ! -d ../shared/golden ]; then
    echo "run_tests: ../shared (golden outputs, zoo, references) must sit beside this checkout" >&2
    exit 2
fi
# Build the package and its Cython kernels in place (editable), with the test requirements.
python3 -m pip install --quiet --disable-pip-version-check -e ".[test]"
python3 -m pytest -q -p no:cacheprovider "$@"
